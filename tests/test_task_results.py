"""Return values: stored as Django's backends store them, and never a reason to fail a job.

Real ``runqueueworker`` subprocesses run the tasks; results are read back through
``get_result()`` the way an application would.
"""

from __future__ import annotations

import pytest

from django_pgqueue.compat import TaskResultStatus, task_backends
from django_pgqueue.models import Job, LiveJob
from django_pgqueue.states import JobStatus
from tests import ledger, tasks
from tests.models import Order

pytestmark = pytest.mark.timeout(120)


def _result(result):
    return task_backends["default"].get_result(result.id)


def test_mappings_enums_tuples_and_bytes_are_stored_as_django_stores_them(workers):
    enqueued = {
        kind: tasks.returns_mapping.enqueue(kind)
        for kind in ("ordered", "default", "choice", "nested", "bytes", "wide_float")
    }
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    results = {kind: _result(result) for kind, result in enqueued.items()}
    assert {kind: r.status for kind, r in results.items()} == dict.fromkeys(
        enqueued, TaskResultStatus.SUCCESSFUL
    )
    assert results["ordered"].return_value == {"b": 1, "a": [2]}
    assert results["default"].return_value == {"x": [1]}
    assert results["choice"].return_value == "red"
    assert results["nested"].return_value == {"colour": "red", "size": 3, "pair": [1, 2]}
    assert results["bytes"].return_value == "café"
    wide = results["wide_float"].return_value
    assert wide == [1e20, 1.5e300, 0.1]
    assert [type(value) for value in wide] == [float, float, float]


def test_a_task_receives_plain_values_of_what_was_enqueued(workers):
    import collections

    from django.db import models

    class Colour(models.TextChoices):
        RED = "red", "Red"

    result = tasks.echo.enqueue(
        1e20, Colour.RED, collections.OrderedDict(a=1), negative=-2.5e300, pair=(1, 2)
    )
    assert workers("--burst").wait() == 0
    assert _result(result).return_value == {
        "args": [["float", 1e20], ["str", "red"], ["dict", {"a": 1}]],
        "kwargs": {"negative": ["float", -2.5e300], "pair": ["list", [1, 2]]},
    }


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("set", "return value: set is not JSON-serializable"),
        ("nan", "return value['ratio']: nan is not valid JSON"),
        ("nul", "return value: strings may not contain NUL characters"),
        ("surrogate", "return value[0]: strings contains a lone surrogate"),
        ("object", "return value: object is not JSON-serializable"),
        ("huge_int", "return value: integer has more digits than Python converts to text"),
    ],
)
def test_a_return_value_that_cannot_be_stored_succeeds_with_a_note_and_a_warning(
    workers, observer, kind, reason
):
    marker = tasks.noop.enqueue()  # a job id for the ledger entry only
    LiveJob.objects.filter(pk=int(marker.id)).update(status=JobStatus.CANCELLED)
    result = tasks.returns_unstorable.enqueue(kind, marker_job=int(marker.id))
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempts, job.errors) == (JobStatus.SUCCEEDED, 1, [])
    note = job.result["unstorable_result"]
    assert note["reason"].startswith(reason), note
    assert _result(result).return_value == job.result
    # The work was done exactly once: no retry repeats it.
    assert [e["event"] for e in ledger.entries(observer, int(marker.id))] == ["side-effect"]
    output = worker.output()
    warnings = [line for line in output.splitlines() if " WARNING " in line]
    assert any(f"job {result.id}: the return value of" in line for line in warnings), output
    # The summary line (the default verbosity) counts it a success.
    assert ": 1 succeeded" in output


def test_an_atomic_task_with_an_unstorable_return_value_commits_its_work(workers):
    result = tasks.atomic_returns_unstorable.enqueue()
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.attempts) == (JobStatus.SUCCEEDED, 1)
    assert job.result["unstorable_result"]["type"] == "builtins.set"
    assert Order.objects.filter(job_id=job.pk).count() == 1
