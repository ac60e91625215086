"""Concurrency limits (per key, per task, per queue), enforced by the claim across workers.

Real worker processes; the execution ledger written by the tasks is the witness of what
ran at the same time. A ledger interval (start..end) lies inside its lease, so the
overlap it shows can only understate what the database allowed, never overstate it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from django.test import override_settings

from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.models import ConcurrencyKey, Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(240)

FAST = ("--poll-interval", "0.05")
RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.2, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}


def max_overlap(entries: list[dict[str, Any]]) -> dict[str, int]:
    """Return, per ledger label, the most executions that were between start and end.

    Only executions that ended count: one killed mid-run (no end) lost its slot with its
    lease, which the reaper gave back.
    """
    opened: dict[tuple[int, int], dict[str, Any]] = {}
    events: dict[str, list[tuple[Any, int]]] = defaultdict(list)
    for entry in entries:
        execution = (entry["job_id"], entry["lease_generation"])
        if entry["event"] == "start":
            opened[execution] = entry
        elif entry["event"] == "end" and execution in opened:
            events[entry["label"]].append((opened[execution]["at"], 1))
            events[entry["label"]].append((entry["at"], -1))
    peaks = {}
    for label, changes in events.items():
        level = peak = 0
        # At equal times an end sorts first: touching intervals do not overlap.
        for _, change in sorted(changes):
            level += change
            peak = max(peak, level)
        peaks[label] = peak
    return peaks


def _done(count: int) -> bool:
    return Job.objects.filter(status=JobStatus.SUCCEEDED).count() == count


def test_a_key_limit_of_3_holds_across_4_workers_of_8_slots(workers, observer):
    keys = ["tenant:1", "tenant:2", "tenant:3"]
    for key in keys:
        tasks.ledger_limited.using(concurrency_key=key).enqueue_many(
            [((), {"seconds": 0.15, "label": key})] * 24
        )
    tasks.ledger_sleep.enqueue_many([((), {"seconds": 0.02, "label": "plain"})] * 200)
    for _ in range(4):
        workers("--concurrency", "8", *FAST)
    wait_for(lambda: _done(3 * 24 + 200), timeout=180, interval=0.25)
    peaks = max_overlap(ledger.entries(observer))
    print("max overlap per key:", {key: peaks[key] for key in keys})
    # Reached, never exceeded: 32 slots were free for 3 keys' 72 jobs.
    assert [peaks[key] for key in keys] == [3, 3, 3]
    # The unlimited task drained beside them (its jobs overlapped far more than 3).
    assert peaks["plain"] > 3
    assert not ConcurrencyKey.objects.exists()  # every key's row is gone with its work


def test_jobs_waiting_on_a_limit_hold_no_lease_and_no_other_key_waits(workers, observer):
    tasks.ledger_limited.using(concurrency_key="busy").enqueue_many(
        [((), {"seconds": 2.0, "label": "busy"})] * 9
    )
    other = tasks.ledger_limited.using(concurrency_key="other").enqueue(label="other")
    workers("--concurrency", "8", *FAST)
    wait_for(lambda: Job.objects.get(pk=int(other.id)).status == JobStatus.SUCCEEDED, timeout=30)
    busy = Job.objects.filter(concurrency_key="busy")
    # Three run; the other six wait pending, unleased, while "other" already ran.
    assert busy.filter(status=JobStatus.PROCESSING).count() == 3
    assert busy.filter(status=JobStatus.PENDING, claimed_by__isnull=True).count() == 6
    row = ConcurrencyKey.objects.get(pk="busy")
    assert (row.in_flight, row.max_in_flight) == (3, 3)


def test_kill_9_gives_the_slots_back_after_the_reap(workers, observer):
    tasks.ledger_limited.using(concurrency_key="k").enqueue_many(
        [((), {"seconds": 60.0, "label": "k"})] * 3
    )
    tasks.ledger_limited.using(concurrency_key="k").enqueue_many(
        [((), {"seconds": 0.05, "label": "k"})] * 3
    )
    first = workers("--concurrency", "8", "--lease-seconds", "1", *FAST, settings=RECOVERY)
    wait_for(
        lambda: Job.objects.filter(concurrency_key="k", status=JobStatus.PROCESSING).count() == 3,
        timeout=30,
    )
    assert ConcurrencyKey.objects.get(pk="k").in_flight == 3
    first.kill()
    # A second worker takes over: the dead worker's three slots come back once its
    # leases are reaped, and all six jobs finish (the long ones ran again, shortened).
    LiveJob.objects.filter(concurrency_key="k").update(kwargs={"seconds": 0.05, "label": "k"})
    workers("--concurrency", "8", "--lease-seconds", "1", *FAST, settings=RECOVERY)
    wait_for(lambda: _done(6), timeout=60, interval=0.25)
    assert not ConcurrencyKey.objects.filter(pk="k").exists()
    assert max_overlap(ledger.entries(observer))["k"] <= 3


def test_a_task_limit_without_a_key_limits_the_task(workers, observer):
    tasks.ledger_task_limited.enqueue_many([((), {"seconds": 0.1})] * 20)
    assert set(Job.objects.values_list("concurrency_key", "concurrency_limit")) == {
        ("task:tests.tasks.ledger_task_limited", 2)
    }
    for _ in range(2):
        workers("--concurrency", "8", *FAST)
    wait_for(lambda: _done(20), timeout=60, interval=0.25)
    assert max_overlap(ledger.entries(observer))["task"] == 2


def test_a_queue_limit_from_settings(workers, observer):
    with override_settings(PGQUEUE_CONCURRENCY_LIMITS={"queue:reports": 2}):
        tasks.ledger_sleep.using(queue_name="reports").enqueue_many(
            [((), {"seconds": 0.1, "label": "reports"})] * 12
        )
        # A task's own limit is more specific than its queue's.
        tasks.ledger_task_limited.using(queue_name="reports").enqueue(seconds=0.0)
    keys = set(Job.objects.values_list("concurrency_key", "concurrency_limit"))
    assert keys == {("queue:reports", 2), ("task:tests.tasks.ledger_task_limited", 2)}
    workers("--concurrency", "8", "--queue", "reports", *FAST)
    wait_for(lambda: _done(13), timeout=60, interval=0.25)
    assert max_overlap(ledger.entries(observer))["reports"] == 2


def test_bad_options_are_refused_at_the_boundary(store):
    with pytest.raises(InvalidOption, match="no limit"):
        store.enqueue(JobSpec("tests.tasks.noop", concurrency_key="k"))
    with pytest.raises(InvalidOption, match="not both"):
        store.enqueue(
            JobSpec("tests.tasks.noop", concurrency_key="k", concurrency_limit=2, partition_key="p")
        )
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidOption, match="concurrency_limit"):
            store.enqueue(JobSpec("tests.tasks.noop", concurrency_key="k", concurrency_limit=bad))
    with pytest.raises(InvalidOption, match="concurrency_limit"):
        tasks.noop.using(concurrency_key="k").enqueue()
