"""Features acting together, run by real ``runqueueworker`` processes.

A cancel while a limit or a partition is full, a coalesced job handed back or released
at shutdown beside its newer twin, and a signal backlog of a busy key beside an idle
one. The tasks write an execution ledger; overlaps are read from its database clock.
"""

from __future__ import annotations

import signal

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)


def _entry(observer, job_id, event):
    found = [e for e in ledger.entries(observer, job_id) if e["event"] == event]
    return found[-1] if found else None


def _wait_entry(observer, job_id, event, timeout=30.0):
    return wait_for(
        lambda: _entry(observer, job_id, event),
        timeout=timeout,
        interval=0.01,
        message=f"job {job_id} to write {event!r} in the ledger",
    )


def _wait_status(job_id: int, status: JobStatus, timeout: float = 30.0) -> Job:
    return wait_for(
        lambda: (job := Job.objects.get(pk=job_id)).status == status and job,
        timeout=timeout,
        message=f"job {job_id} to be {status}",
    )


@pytest.mark.parametrize(
    "flow",
    [
        {"concurrency_key": "tenant-1", "concurrency_limit": 1},
        {"partition_key": "order-1"},
    ],
    ids=["concurrency_limit", "partition"],
)
def test_a_cancelled_handler_keeps_its_slot_until_it_returns(workers, observer, store, flow):
    worker = workers("--concurrency", "4", "--poll-interval", "0.2")
    worker.wait_registered(observer)
    running = store.enqueue(
        JobSpec("tests.tasks.ledger_cancel_linger", kwargs={"linger": 2.0}, **flow)
    ).id
    waiting = store.enqueue(JobSpec("tests.tasks.ledger_sleep", **flow)).id
    _wait_entry(observer, running, "start")
    result = Job.objects.cancel([running])
    assert result.running == (running,)
    # "Retry now" right after the cancel: the handler still runs, so nothing starts.
    assert Job.objects.retry([running]).done == ()
    stopped = _wait_entry(observer, running, "return")
    started = _wait_entry(observer, waiting, "start")
    # The next job of the key or partition started only once the cancelled handler had
    # returned (it lingered two seconds after it was told).
    assert started["at"] >= stopped["at"], (started, stopped)
    job = _wait_status(running, JobStatus.CANCELLED)
    assert job.result is None
    assert len([e for e in ledger.entries(observer, running) if e["event"] == "start"]) == 1
    _wait_status(waiting, JobStatus.SUCCEEDED)


def test_sigterm_beside_a_coalesced_twin_exits_cleanly_with_grace(workers, observer, store):
    worker = workers(
        "--concurrency", "1", "--prefetch", "1", "--poll-interval", "0.2", "--grace-seconds", "20"
    )
    worker.wait_registered(observer)
    slow = store.enqueue(JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 3})).id
    held = store.enqueue(JobSpec("tests.tasks.noop", coalesce_key="reindex:7")).id
    _wait_entry(observer, slow, "start")
    # The coalesced job is held by the worker (prefetched, not started): its key is free.
    _wait_status(held, JobStatus.PROCESSING)
    twin = store.enqueue(JobSpec("tests.tasks.noop", coalesce_key="reindex:7")).id
    assert twin != held
    worker.send(signal.SIGTERM)
    # The held job goes back beside its twin; the running one gets its grace.
    assert worker.wait(30) == 0, worker.output()
    assert Job.objects.get(pk=slow).status == JobStatus.SUCCEEDED
    assert {Job.objects.get(pk=held).status, Job.objects.get(pk=twin).status} == {JobStatus.PENDING}
    assert "could not be recorded" not in worker.output()
    assert "Traceback" not in worker.output()


def test_the_prefetch_hand_back_of_coalesced_jobs_beside_their_twins(workers, observer, store):
    worker = workers("--concurrency", "1", "--poll-interval", "0.2")
    worker.wait_registered(observer)
    # A burst of quick jobs: the measured rate lets the worker hold many beyond its
    # thread. Then, in the same claim, a slow job and coalesced ones held behind it.
    store.enqueue_many(JobSpec("tests.tasks.noop", priority=10) for _ in range(600))
    specs = [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 4})]
    specs += [JobSpec("tests.tasks.noop", coalesce_key=f"doc:{n}") for n in range(5)]
    outcomes = store.enqueue_many(specs)
    slow, held = outcomes[0].id, [outcome.id for outcome in outcomes[1:]]
    _wait_entry(observer, slow, "start")
    wait_for(
        lambda: Job.objects.filter(pk__in=held, status=JobStatus.PROCESSING).count() == 5,
        timeout=10,
        message="the coalesced jobs to be held behind the slow one",
    )
    twins = [
        store.enqueue(JobSpec("tests.tasks.noop", coalesce_key=f"doc:{n}")).id for n in range(5)
    ]
    wait_for(lambda: "handed back for another worker" in worker.output(), timeout=15)
    # Handed back beside their twins: the worker goes on and runs them all.
    for job_id in [slow, *held, *twins]:
        _wait_status(job_id, JobStatus.SUCCEEDED)
    assert worker.process.poll() is None, worker.output()
    assert "Traceback" not in worker.output()


def test_an_idle_keys_job_starts_beside_a_backlog_of_another_keys_signals(workers, observer, store):
    # A busy key at its limit with a flood of jobs, each of which left a signal.
    busy = JobSpec("tests.tasks.noop", concurrency_key="busy", concurrency_limit=1)
    (first,) = [store.enqueue(busy).id]
    store.fold_signals()
    store.claim("elsewhere", ["default"], per_queue=1, lease_seconds=600)  # holds the slot
    store.enqueue_many([busy] * 200)
    observer.execute(
        "INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent) "
        "SELECT 'busy', false FROM generate_series(1, 16000)"
    )
    # No housekeeping: the backlog is never folded while the test runs.
    worker = workers("--no-housekeeping", "--poll-interval", "0.2")
    worker.wait_registered(observer)
    idle = store.enqueue(
        JobSpec("tests.tasks.ledger_sleep", concurrency_key="idle", concurrency_limit=1)
    ).id
    _wait_status(idle, JobStatus.SUCCEEDED)
    (left,) = observer.execute(
        "SELECT count(*) FROM django_pgqueue_concurrency_signal WHERE concurrency_key = 'busy'"
    ).fetchone()
    assert left >= 16_000, "the idle key's job waited for the busy key's signals"
    assert Job.objects.get(pk=first).status == JobStatus.PROCESSING
