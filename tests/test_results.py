"""``TaskResult`` values built without the dataclass constructor (django_pgqueue.tasks.results).

The shortcut must give exactly what Django's constructor gives, on every Django series
we support, and never hand a result a list or dict the task itself holds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_pgqueue.compat import TaskResult, TaskResultStatus, normalize_json, task_backends
from django_pgqueue.models import Job
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tasks import results
from django_pgqueue.worker.execution import JobRunner
from django_pgqueue.worker.flight import InFlight
from django_pgqueue.worker.resolver import TaskResolver
from tests import tasks

pytestmark = pytest.mark.timeout(120)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
moments = st.none() | st.datetimes(timezones=st.just(dt.UTC))
statuses = st.sampled_from(list(TaskResultStatus))


def _containers(value: Any) -> list[int]:
    """Return the ids of every list and dict inside ``value`` (itself included)."""
    if isinstance(value, list):
        return [id(value), *(i for item in value for i in _containers(item))]
    if isinstance(value, dict):
        return [id(value), *(i for item in value.values() for i in _containers(item))]
    return []


def _fields(result: TaskResult) -> dict[str, Any]:  # type: ignore[type-arg]
    # Every field, the ones the constructor does not take (_return_value) included.
    return {field.name: getattr(result, field.name) for field in dataclasses.fields(result)}


def test_the_shortcut_is_taken_on_this_django_series():
    # A release that changed TaskResult's fields would silently send every result
    # through the constructor again: slower, still correct. Say so here instead.
    assert results.SHORTCUT, "TaskResult's fields changed: review django_pgqueue.tasks.results"


@hypothesis_settings(max_examples=200, deadline=None)
@given(
    args=st.lists(json_values, max_size=4),
    kwargs=st.dictionaries(st.text(), json_values, max_size=4),
    status=statuses,
    enqueued_at=moments,
    started_at=moments,
    worker_ids=st.lists(st.text(), max_size=3),
)
def test_a_built_result_is_the_one_the_constructor_builds(
    *, args, kwargs, status, enqueued_at, started_at, worker_ids
):
    common = {
        "task": tasks.add,
        "status": status,
        "enqueued_at": enqueued_at,
        "started_at": started_at,
        "finished_at": None,
        "last_attempted_at": started_at,
        "backend": "default",
        "errors": [],
        "worker_ids": worker_ids,
    }
    expected = TaskResult(id="7", args=args, kwargs=kwargs, **common)
    # What build_result is given: arguments decoded from stored JSON.
    decoded = json.loads(json.dumps([args, kwargs]))
    built = results.build_result(job_id="7", args=decoded[0], kwargs=decoded[1], **common)
    assert type(built) is TaskResult
    assert built == expected
    assert _fields(built) == _fields(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.id = "8"  # type: ignore[misc]
    if status is TaskResultStatus.SUCCESSFUL:
        assert built.return_value is None  # _return_value has the constructor's default
    else:
        with pytest.raises(ValueError, match="Task"):
            _ = built.return_value


@hypothesis_settings(max_examples=300, deadline=None)
@given(json_values)
def test_unshared_copies_what_normalize_json_would_and_shares_no_container(value: Any):
    copied = results.unshared(value)
    assert copied == normalize_json(value)
    assert type(copied) is type(normalize_json(value))
    assert not set(_containers(copied)) & set(_containers(value))


def test_without_the_shortcut_the_constructor_builds_every_result(monkeypatch):
    monkeypatch.setattr(results, "SHORTCUT", False)
    built = results.build_result(
        task=tasks.add,
        job_id="1",
        status=TaskResultStatus.READY,
        enqueued_at=None,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=[(1, 2)],  # only the constructor's normalize_json turns the tuple into a list
        kwargs={},
        backend="default",
        errors=[],
        worker_ids=[],
    )
    assert built.args == [[1, 2]]


def _task_result_like(name: str, *, slots: bool = True, extra=(), fields=None) -> type:
    """A frozen dataclass with TaskResult's constructor fields (or ``fields``), plus ``extra``."""
    names = results._CONSTRUCTOR_FIELDS if fields is None else fields
    return dataclasses.make_dataclass(
        name,
        [(field, Any) for field in names] + list(extra),
        frozen=True,
        slots=slots,
        kw_only=True,
    )


_Unslotted = _task_result_like("_Unslotted", slots=False)
_OtherFields = _task_result_like("_OtherFields", fields=("task", "id", "status", "args"))
_FactoryDefault = _task_result_like(
    "_FactoryDefault",
    extra=[("notes", list, dataclasses.field(init=False, default_factory=list))],
)


@pytest.mark.parametrize(
    "changed", [_Unslotted, _OtherFields, _FactoryDefault, dict], ids=lambda c: c.__name__
)
def test_a_changed_task_result_class_turns_the_shortcut_off(monkeypatch, changed):
    # A release whose TaskResult is not slotted, has other fields, gives a field a
    # default only its constructor knows, or is no dataclass: no setters, constructor.
    monkeypatch.setattr(results, "TaskResult", changed)
    assert results._setters() is None


@pytest.mark.django_db
def test_the_results_of_a_bulk_enqueue_equal_the_stored_jobs_results():
    calls = [((index, {"n": [index, None]}), {"label": f"x{index}"}) for index in range(40)]
    calls.append(((), {}))
    task = tasks.add.using(priority=3, queue_name="emails")
    returned = task.enqueue_many(calls)
    backend = task_backends["default"]
    # get_result builds each through the constructor, from the stored row.
    assert returned == [backend.get_result(result.id) for result in returned]
    assert [_fields(r) for r in returned] == [_fields(backend.get_result(r.id)) for r in returned]
    # No two results share an argument list (each was decoded on its own).
    assert len({id(result.args) for result in returned}) == len(returned)


def test_a_running_jobs_result_shares_no_argument_with_the_task(store: QueueStore):
    Job.objects.enqueue_many(
        [
            JobSpec("tests.tasks.noop", args=[[1, {"a": []}]], kwargs={"k": {"v": [2]}}),
            JobSpec("tests.tasks.noop"),
        ]
    )
    claimed = store.claim("w", ["default"], per_queue=10, lease_seconds=60)
    runner = JobRunner(
        backend_alias="default", database="default", worker_id="w", record_step=lambda *_: None
    )
    resolver = TaskResolver()
    for job in claimed:
        flight = InFlight(job, resolver.resolve(job.task_path))
        result = runner._task_result(flight)
        assert (result.args, result.kwargs) == (job.args, job.kwargs)
        assert result.status == TaskResultStatus.RUNNING
        assert result.worker_ids == ["w"]
        # The task is called with job.args and job.kwargs: changing them in the task
        # must not change the result its signals carry.
        assert not set(_containers(result.args)) & set(_containers(job.args))
        assert not set(_containers(result.kwargs)) & set(_containers(job.kwargs))
