"""The worker registry, heartbeats, silent workers, and the partition-bucket ring."""

from __future__ import annotations

import signal
import time

import pytest

from django_pgqueue.models import Worker
from django_pgqueue.states import WorkerStatus
from django_pgqueue.store.partition import BUCKET_COUNT
from django_pgqueue.worker.heartbeat import bucket_masks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(180)

FAST_REGISTRY = {
    "HEARTBEAT_SECONDS": 0.2,
    "WORKER_TIMEOUT_SECONDS": 1.5,
    "HOUSEKEEPING_INTERVAL_SECONDS": 0.2,
}


def test_each_start_registers_a_fresh_id_and_heartbeats(workers, observer):
    first = workers(settings=FAST_REGISTRY)
    first_id = first.wait_registered(observer)
    seen = Worker.objects.get(pk=first_id).last_seen_at
    wait_for(lambda: Worker.objects.get(pk=first_id).last_seen_at > seen, timeout=10)
    row = Worker.objects.get(pk=first_id)
    assert (row.pid, row.status, row.concurrency) == (first.pid, WorkerStatus.ALIVE, 10)
    assert set(row.queues) == {"default", "emails", "reports", "high", "low"}
    assert row.metadata["version"]
    second = workers(settings=FAST_REGISTRY)
    second_id = second.wait_registered(observer)
    assert second_id != first_id
    assert second_id.split(":")[:2] == [first_id.split(":")[0], str(second.pid)]


def test_a_worker_id_held_by_a_live_worker_is_refused(workers, observer):
    first = workers("--worker-id", "fixed-id", settings=FAST_REGISTRY)
    first.wait_registered(observer)
    second = workers("--worker-id", "fixed-id", settings=FAST_REGISTRY)
    assert second.wait() == 2
    assert "belongs to a live worker" in second.output()
    first.send(signal.SIGTERM)
    assert first.wait() == 0
    # Once the first is gone, the id can be used again.
    third = workers("--worker-id", "fixed-id", "--burst", settings=FAST_REGISTRY)
    assert third.wait() == 0, third.output()


def test_a_silent_worker_is_marked_dead_and_comes_back_when_it_resumes(workers, observer):
    silent = workers(settings=FAST_REGISTRY)
    silent_id = silent.wait_registered(observer)
    watcher = workers(settings=FAST_REGISTRY)
    watcher.wait_registered(observer)
    silent.send(signal.SIGSTOP)
    try:
        wait_for(
            lambda: Worker.objects.get(pk=silent_id).status == WorkerStatus.DEAD,
            timeout=30,
            message="housekeeping to mark the silent worker dead",
        )
    finally:
        silent.send(signal.SIGCONT)
    wait_for(lambda: Worker.objects.get(pk=silent_id).status == WorkerStatus.ALIVE, timeout=15)


HOLDS_HOUSEKEEPING = """
SELECT EXISTS (
    SELECT 1
    FROM pg_locks AS lock
    JOIN pg_stat_activity AS session ON session.pid = lock.pid
    WHERE lock.locktype = 'advisory' AND lock.granted
      AND session.application_name = %s
)
"""


def test_a_worker_paused_inside_a_housekeeping_step_does_not_stop_housekeeping(workers, observer):
    # A process paused (SIGSTOP, a frozen VM) while its housekeeping step holds the lock
    # keeps its connection open: the server still ends that session once it has sat
    # idle in its transaction long enough, and the other workers' housekeeping (here:
    # marking the paused one dead) goes on.
    paused = workers(settings=FAST_REGISTRY)
    paused_id = paused.wait_registered(observer)
    watcher = workers(settings=FAST_REGISTRY)
    watcher.wait_registered(observer)
    housekeeping = f"pgqueue housekeeping {paused_id}"[:63]
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "never caught the worker inside a step"
        paused.send(signal.SIGSTOP)
        # Stopped: its housekeeping backend now holds the lock or not, for good.
        if observer.execute(HOLDS_HOUSEKEEPING, (housekeeping,)).fetchone()[0]:
            break
        paused.send(signal.SIGCONT)
        time.sleep(0.005)  # let it run a moment: the next try lands elsewhere
    try:
        wait_for(
            lambda: Worker.objects.get(pk=paused_id).status == WorkerStatus.DEAD,
            timeout=30,
            message="the others' housekeeping to mark the paused lock holder dead",
        )
        assert not observer.execute(HOLDS_HOUSEKEEPING, (housekeeping,)).fetchone()[0]
    finally:
        paused.send(signal.SIGCONT)
    # Resumed, it finds its housekeeping connection ended, opens another, and is back.
    wait_for(lambda: Worker.objects.get(pk=paused_id).status == WorkerStatus.ALIVE, timeout=15)
    watcher.stop()
    paused.stop()
    assert "Traceback" not in paused.output(), paused.output()


def _owned(worker_id: str, queue: str = "default") -> int:
    return Worker.objects.get(pk=worker_id).metadata.get("owned_buckets", {}).get(queue, -1)


def test_buckets_are_spread_over_live_workers_and_rebalance(workers, observer):
    first = workers("--queue", "default", settings=FAST_REGISTRY)
    first_id = first.wait_registered(observer)
    wait_for(lambda: _owned(first_id) == BUCKET_COUNT, timeout=15)
    second = workers("--queue", "default", settings=FAST_REGISTRY)
    second_id = second.wait_registered(observer)
    wait_for(
        lambda: (
            0 < _owned(first_id) < BUCKET_COUNT
            and _owned(first_id) + _owned(second_id) == BUCKET_COUNT
        ),
        timeout=15,
        message="the two workers to split the buckets",
    )
    second.kill()  # no goodbye: the others notice through the worker timeout
    wait_for(lambda: _owned(first_id) == BUCKET_COUNT, timeout=30)


def test_masks_only_split_among_workers_serving_the_queue():
    live = [("a", ["default"]), ("b", ["default", "emails"]), ("c", ["emails"])]
    default_a, emails_a = bucket_masks("a", ["default", "emails"], live, vnodes=32)
    assert emails_a is not None  # a joins the emails ring as itself
    assert "1" in emails_a
    (default_b,) = bucket_masks("b", ["default"], live, vnodes=32)
    assert default_a is not None
    assert default_b is not None
    assert all(x != y for x, y in zip(default_a, default_b, strict=True))  # a partition of buckets
    assert bucket_masks("z", ["low"], live, vnodes=32) == (None,)  # alone: all buckets
