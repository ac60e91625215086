"""Snooze: a handler asks to run again later without using up an attempt.

The store's statement on a real PostgreSQL (fencing, the cap, a cancel, partitions and
concurrency keys acting on the same job), real ``runqueueworker`` subprocesses for the
handler's side (raised, returned, async, atomic), and the job page.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue import Snooze, SnoozeLimitReached
from django_pgqueue.compat import task_backends
from django_pgqueue.exceptions import InvalidOption, LeaseLost
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.admin_fixtures import login, url
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

LIMIT = f"{SnoozeLimitReached.__module__}.{SnoozeLimitReached.__qualname__}"


def _claim(store, worker="w", queue="default"):
    return store.claim(worker, [queue], per_queue=10, lease_seconds=30)


def _row(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


# ---------------------------------------------------------------- the boundary
def test_snooze_takes_seconds_or_a_timedelta_and_refuses_anything_else():
    assert Snooze(30).seconds == 30.0
    assert Snooze(dt.timedelta(minutes=2)).seconds == 120.0
    assert Snooze(0).seconds == 0.0
    for bad in (-1, float("nan"), float("inf"), 400 * 86400, "30", None, True):
        with pytest.raises(InvalidOption, match=r"Snooze\(seconds\)"):
            Snooze(bad)  # type: ignore[arg-type]


def test_max_snoozes_is_validated_where_the_task_is_declared():
    assert tasks.ledger_snooze.max_snoozes == 3
    assert tasks.noop.using(max_snoozes=0).max_snoozes == 0
    for bad in (-1, 1.5, True, 10**7):
        with pytest.raises(InvalidOption, match="max_snoozes"):
            tasks.noop.using(max_snoozes=bad)


# ---------------------------------------------------------------- the statement
def test_a_snooze_gives_the_attempt_back_and_waits_on_the_database_clock(store, observer):
    job_id = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=1)).id
    (claimed,) = _claim(store)
    before = observer.execute("SELECT clock_timestamp()").fetchone()[0]
    snoozed = store.snooze_if_leased(claimed.lease, delay_seconds=100, max_snoozes=5)
    after = observer.execute("SELECT clock_timestamp()").fetchone()[0]
    assert (snoozed.status, snoozed.snoozes) == (JobStatus.PENDING, 1)
    assert before + dt.timedelta(seconds=100) <= snoozed.available_at
    assert snoozed.available_at <= after + dt.timedelta(seconds=100)
    job = _row(job_id)
    assert (job.status, job.attempts, job.snoozes, job.claimed_by) == ("pending", 0, 1, None)
    assert job.lease_generation == claimed.lease_generation + 1
    (entry,) = job.errors
    assert entry["snoozed"] == 100
    assert entry["attempt"] == 1
    assert entry["worker"] == "w"
    assert _claim(store) == []  # not before its time
    # A stale lease (the one just given back) changes nothing.
    with pytest.raises(LeaseLost):
        store.snooze_if_leased(claimed.lease, delay_seconds=0, max_snoozes=5)
    assert _row(job_id).snoozes == 1


def test_past_max_snoozes_the_job_is_dead_lettered_and_a_retry_starts_over(store):
    job_id = store.enqueue(JobSpec("tests.tasks.noop", max_attempts=5)).id
    for expected in (1, 2):
        (claimed,) = _claim(store)
        snoozed = store.snooze_if_leased(claimed.lease, delay_seconds=0, max_snoozes=2)
        assert (snoozed.status, snoozed.snoozes) == (JobStatus.PENDING, expected)
    (claimed,) = _claim(store)
    snoozed = store.snooze_if_leased(claimed.lease, delay_seconds=0, max_snoozes=2)
    assert (snoozed.status, snoozed.snoozes) == (JobStatus.DEAD_LETTER, 2)
    job = _row(job_id)
    assert (job.attempts, job.last_error_class) == (1, LIMIT)
    assert job.last_error == "asked to snooze again after 2 snoozes (max_snoozes=2)"
    assert job.finished_at is not None
    assert [("snoozed" in entry) for entry in job.errors] == [True, True, False]
    assert job.errors[-1]["exception_class"] == LIMIT
    # The failed entry is a TaskResult error; the snoozes are not, but name their workers.
    result = task_backends["default"].get_result(str(job_id))
    assert [error.exception_class_path for error in result.errors] == [LIMIT]
    assert result.worker_ids == ["w", "w", "w"]
    store.retry([job_id])
    job = _row(job_id)
    assert (job.status, job.attempts, job.snoozes) == ("pending", 0, 0)


def test_max_snoozes_zero_dead_letters_the_first_snooze(store):
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    (claimed,) = _claim(store)
    snoozed = store.snooze_if_leased(claimed.lease, delay_seconds=10, max_snoozes=0)
    assert snoozed.status is JobStatus.DEAD_LETTER
    assert _row(job_id).last_error_class == LIMIT


def test_a_snooze_of_a_job_whose_cancel_was_requested_ends_it_cancelled(store):
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    (claimed,) = _claim(store)
    store.cancel([job_id])
    snoozed = store.snooze_if_leased(claimed.lease, delay_seconds=0, max_snoozes=5)
    assert snoozed.status is JobStatus.CANCELLED
    job = _row(job_id)
    assert (job.status, job.snoozes) == ("cancelled", 0)
    assert _claim(store) == []


def test_a_snoozed_head_keeps_its_partitions_turn(store):
    head = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).id
    younger = store.enqueue(JobSpec("tests.tasks.noop", partition_key="p")).id
    (claimed,) = _claim(store)
    assert claimed.id == head
    store.snooze_if_leased(claimed.lease, delay_seconds=1, max_snoozes=5)
    # The younger job waits for the snoozed one: per-key order holds across a snooze.
    assert _claim(store) == []
    (again,) = wait_for(lambda: _claim(store), timeout=30, message="the snoozed head again")
    assert again.id == head
    store.complete_many_if_leased("w", [(again.lease, "null")])
    assert [job.id for job in _claim(store)] == [younger]


def test_a_snoozed_job_frees_its_concurrency_slot_while_it_waits(store):
    spec = {"concurrency_key": "api", "concurrency_limit": 1}
    first = store.enqueue(JobSpec("tests.tasks.noop", **spec)).id
    second = store.enqueue(JobSpec("tests.tasks.noop", **spec)).id
    (claimed,) = _claim(store)
    assert claimed.id == first
    assert _claim(store) == []  # the limit is taken
    store.snooze_if_leased(claimed.lease, delay_seconds=100, max_snoozes=5)
    assert [job.id for job in _claim(store)] == [second]


# ---------------------------------------------------------------- the worker
@pytest.mark.parametrize("how", ["raise", "return"])
def test_a_snoozing_handler_runs_again_without_using_an_attempt(workers, observer, how):
    result = tasks.ledger_snooze.enqueue(times=2, how=how)
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    job = _row(int(result.id))
    assert (job.status, job.attempts, job.max_attempts, job.snoozes) == ("succeeded", 1, 1, 2)
    assert job.result == {"attempt": 1, "snoozes": 2}
    events = [(e["event"], e["attempt"]) for e in ledger.entries(observer, job.pk)]
    assert events == [("snooze", 1), ("snooze", 1), ("done", 1)]
    assert [entry["snoozed"] for entry in job.errors] == [0, 0]
    final = task_backends["default"].get_result(result.id)
    assert final.errors == []
    assert len(final.worker_ids) == 3
    assert f"job {job.pk} snoozed" in worker.output()


def test_an_async_handler_snoozes_too(workers, observer):
    result = tasks.ledger_async_snooze.enqueue(times=1)
    assert workers("--burst").wait() == 0
    job = _row(int(result.id))
    assert (job.status, job.attempts, job.snoozes) == ("succeeded", 1, 1)
    assert job.result == {"attempt": 1, "snoozes": 1}


def test_a_handler_that_snoozes_forever_is_dead_lettered_at_its_cap(workers, observer):
    result = tasks.ledger_snooze_forever.enqueue()
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    job = _row(int(result.id))
    assert (job.status, job.snoozes, job.attempts) == ("dead_letter", 2, 1)
    assert job.last_error_class == LIMIT
    assert len(ledger.entries(observer, job.pk)) == 3
    assert f"job {job.pk} dead-lettered" in worker.output()


def test_an_atomic_handlers_snooze_rolls_its_writes_back(workers):
    from tests.models import Order

    result = tasks.ledger_atomic_snooze.enqueue(times=2)
    assert workers("--burst").wait() == 0
    job = _row(int(result.id))
    assert (job.status, job.snoozes, job.result) == ("succeeded", 2, 2)
    # Two snoozes rolled back their rows: only the last attempt's row is there.
    assert list(Order.objects.filter(job_id=job.pk).values_list("note", flat=True)) == [
        "after 2 snoozes"
    ]


def test_a_bad_snooze_fails_the_attempt_with_a_clear_error(workers):
    result = tasks.ledger_bad_snooze.enqueue()
    assert workers("--burst").wait() == 0
    job = _row(int(result.id))
    assert job.status == "dead_letter"
    assert job.last_error_class == "django_pgqueue.exceptions.InvalidOption"
    assert "Snooze(seconds): -5 is not between 0 and" in job.last_error
    assert job.snoozes == 0


def test_a_snooze_past_the_handlers_timeout_is_a_timeout(store, db_url):
    # Unit of the recorder's rule: an overdue handler's late outcome is JobTimeout.
    from django_pgqueue.worker.execution import Outcome, OutcomeKind
    from django_pgqueue.worker.flight import InFlight
    from django_pgqueue.worker.recording import OutcomeRecorder

    store.enqueue(JobSpec("tests.tasks.ledger_snooze"))
    (claimed,) = _claim(store)
    entry = type("Entry", (), {"timeout": 1.0, "max_snoozes": 3})()
    flight = InFlight(claimed, entry)  # type: ignore[arg-type]
    flight.overdue = True
    outcome = Outcome(flight, OutcomeKind.SNOOZED, delay=5)
    OutcomeRecorder._settle_timeout(None, outcome)  # type: ignore[arg-type]
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.failure is not None
    assert outcome.failure.exception_class.endswith("JobTimeout")


# ---------------------------------------------------------------- the job page
@pytest.mark.django_db(transaction=True)
def test_the_job_page_shows_snoozes_apart_from_failures(client, store):
    login(client, superuser=True)
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    (claimed,) = _claim(store, worker="web-1:1")
    store.snooze_if_leased(claimed.lease, delay_seconds=90, max_snoozes=5)
    text = client.get(url("django_pgqueue_job_change", job_id)).text
    assert "snoozed 1 time, using no attempt" in text
    assert "attempt 1 snoozed" in text
    assert "asked to run again in" in text
    assert "web-1:1" in text
