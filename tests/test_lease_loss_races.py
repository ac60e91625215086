"""A lease the worker itself just finished with is never reported lost.

The heartbeat reads the job rows on its own connection. Between the moment a completion
commits and the moment the worker's in-memory attempt says so, the row already reads
finished: the extension does not find the lease, and used to report it lost. The job
had succeeded, but the worker logged "lease lost", counted a lost lease and abandoned
the attempt. Both windows are held open here and the heartbeat's part is run inside
them, against the real rows.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from django_pgqueue.models import Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec, Lease
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker.flight import InFlight
from tests import tasks

pytestmark = pytest.mark.timeout(60)


def _heartbeat_finds_lost(store, worker: Worker, leases: list[Lease]) -> list[Lease]:
    """Run the heartbeat's extension of ``leases``; hand what it misses to the worker."""
    lost = store.extend_leases_if_leased(worker.id, leases, 30).lost(leases)
    if lost:
        worker._leases_lost(lost)
    return lost


def _claimed_flight(store, worker: Worker) -> InFlight:
    Job.objects.enqueue_many([JobSpec("tests.tasks.noop")])
    (job,) = store.claim_round(
        worker.id, ["default"], per_queue=1, lease_seconds=30, total_limit=1
    ).jobs
    flight = InFlight(job, worker._resolver.resolve(job.task_path))
    worker._flights[flight.key] = flight
    return flight


def test_a_completion_committed_before_the_worker_forgot_the_attempt_is_not_a_lost_lease(
    db_url, store, caplog
):
    worker = Worker(WorkerOptions.from_settings(queues=("default",)))
    flight = _claimed_flight(store, worker)
    flight.started_at = 0.0
    flight.busy = False  # its handler returned; the outcome waits for the recorder
    # The recorder's batched completion commits; the worker has not yet dropped the
    # attempt from its flights (_finish runs after the statement returns).
    assert store.complete_many_if_leased(worker.id, [(flight.job.lease, "null")]) == {flight.job.id}
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        lost = _heartbeat_finds_lost(store, worker, [flight.job.lease])
    assert lost == [flight.job.lease]  # the row no longer carries the lease...
    assert not flight.abandoned  # ...but the worker did not lose it: it finished it
    assert "lease lost" not in caplog.text
    assert Job.objects.get(pk=flight.job.id).status == JobStatus.SUCCEEDED


def test_a_running_attempt_whose_lease_moved_on_is_still_abandoned(db_url, store, caplog):
    # The other side of the same check: a handler still running loses its lease.
    worker = Worker(WorkerOptions.from_settings(queues=("default",)))
    flight = _claimed_flight(store, worker)
    flight.started_at = 0.0
    LiveJob.objects.filter(pk=flight.job.id).update(
        lease_generation=flight.job.lease_generation + 1
    )
    with caplog.at_level(logging.WARNING, logger="django_pgqueue.worker"):
        assert _heartbeat_finds_lost(store, worker, [flight.job.lease]) == [flight.job.lease]
    assert flight.abandoned
    assert flight.cancel.is_set()
    assert "lease lost" in caplog.text


def test_an_atomic_task_committing_is_not_reported_lost_by_a_heartbeat_in_between(
    db_url, make_store, caplog
):
    worker = Worker(
        WorkerOptions.from_settings(
            queues=("default",), burst=True, handle_signals=False, concurrency=1
        )
    )
    store = make_store()
    seen: dict[str, Any] = {}

    def heartbeat_in_the_window(job_id: int) -> None:
        # Runs in the handler's thread right after COMMIT, before the runner returns.
        (flight,) = [f for f in worker._flights.values() if f.job.id == job_id]
        seen["committed"] = flight.committed
        seen["lost"] = _heartbeat_finds_lost(store, worker, [flight.job.lease])
        seen["abandoned"] = flight.abandoned

    tasks.COMMIT_PROBES.append(heartbeat_in_the_window)
    try:
        job = Job.objects.enqueue_many([JobSpec("tests.tasks.atomic_commit_window")])[0]
        # DEBUG: the per-job lines (-v 2) say how the attempt ended.
        with caplog.at_level(logging.DEBUG, logger="django_pgqueue"):
            thread = threading.Thread(target=worker.run)
            thread.start()
            thread.join(30)
    finally:
        tasks.COMMIT_PROBES.remove(heartbeat_in_the_window)
    assert not thread.is_alive()
    assert seen["committed"] is False  # the window was really open
    assert [lease.job_id for lease in seen["lost"]] == [job.pk]  # and the row read finished
    assert seen["abandoned"] is False
    assert "lease lost" not in caplog.text
    assert f"job {job.pk} succeeded" in caplog.text
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == (JobStatus.SUCCEEDED, 1)
    assert worker.processed == 1
