"""The worker as a library: options, shares, and a burst run in this process."""

from __future__ import annotations

import threading

import pytest

from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from django_pgqueue.worker import Worker, WorkerOptions

pytestmark = pytest.mark.timeout(60)


def test_options_come_from_settings_and_validate():
    options = WorkerOptions.from_settings()
    assert options.queues == ("default", "emails", "high", "low", "reports")
    assert (options.concurrency, options.lease_seconds, options.poll_interval) == (10, 30.0, 1.0)
    shorter = WorkerOptions.from_settings(lease_seconds=3)
    assert shorter.heartbeat_seconds == 1.0  # a third of the lease
    with pytest.raises(ConfigurationError, match="--queue 'x'"):
        WorkerOptions.from_settings(queues=("x",))
    with pytest.raises(ConfigurationError, match="heartbeat"):
        options.with_changes(heartbeat_seconds=20.0)


def test_capacity_is_shared_between_hungry_queues():
    worker = Worker(WorkerOptions.from_settings(queues=("default", "emails", "low")))

    def shares(limit: int) -> dict[str, int]:
        queues, _, limits = worker._shares(limit)
        return dict(zip(queues, limits, strict=True))

    assert shares(9) == {"default": 3, "emails": 3, "low": 3}  # nothing known: equal shares
    worker._hungry = {"default": True, "emails": False, "low": False}
    # Idle queues keep one slot to notice work.
    assert shares(12) == {"default": 10, "emails": 1, "low": 1}
    worker._hungry = {"default": True, "emails": True, "low": False}
    assert sorted(shares(12).values()) == [1, 5, 6]
    assert shares(12)["low"] == 1
    # Fewer slots than queues: every queue is still looked at (the claim's total caps
    # the batch), and the order that breaks ties rotates.
    first, _, limits = worker._shares(2)
    assert sorted(first) == ["default", "emails", "low"]
    assert limits == [1, 1, 1]
    assert worker._shares(2)[0] != first


def test_a_worker_runs_in_process_without_the_command(db_url):
    Job.objects.enqueue_many([JobSpec("tests.tasks.add", args=[index, 1]) for index in range(20)])
    options = WorkerOptions.from_settings(burst=True, handle_signals=False, concurrency=3)
    worker = Worker(options)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert worker.processed == 20
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 20
