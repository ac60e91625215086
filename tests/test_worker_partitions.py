"""Per-partition order across several worker processes, and no deadlock among them."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger
from tests.lockwatch import deadlocks_after_workers_left
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(300)


def test_ten_keys_of_a_hundred_jobs_keep_order_across_four_workers(workers, observer):
    keys = [f"customer:{index}" for index in range(10)]
    specs = [
        JobSpec(
            "tests.tasks.ledger_sequence",
            kwargs={"key": key, "sequence": sequence},
            partition_key=key,
        )
        for sequence in range(100)
        for key in keys
    ]
    started = [
        workers(
            "--concurrency", "4", "--poll-interval", "0.05", settings={"HEARTBEAT_SECONDS": 0.5}
        )
        for _ in range(4)
    ]
    # Enqueue once all four are registered, so the first to boot cannot drain it alone.
    for worker in started:
        worker.wait_registered(observer)
    Job.objects.enqueue_many(specs)
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 1000,
        timeout=240,
        interval=0.5,
    )
    runs: dict[str, list[tuple[int, object, object]]] = defaultdict(list)
    starts = {}
    pids = set()
    for entry in ledger.entries(observer):
        key, sequence = entry["label"].rsplit(":", 1)
        if entry["event"] == "start":
            starts[entry["job_id"]] = entry["at"]
            pids.add(entry["worker_pid"])
        else:
            runs[key].append((int(sequence), starts[entry["job_id"]], entry["at"]))
    assert len(pids) > 1, "the work should be spread over several workers"
    for key in keys:
        ordered = sorted(runs[key], key=lambda run: run[1])
        assert [sequence for sequence, _, _ in ordered] == list(range(100)), key
        for (_, _, previous_end), (sequence, start, _) in itertools.pairwise(ordered):
            assert start >= previous_end, f"{key}: job {sequence} overlapped its predecessor"


FLOW_KEYS = {
    "partitions": lambda key: {"partition_key": key},
    "concurrency-keys": lambda key: {"concurrency_key": key, "concurrency_limit": 2},
}


@pytest.mark.parametrize("flow", list(FLOW_KEYS))
def test_keys_fed_while_workers_drain_them_never_deadlock(workers, observer, flow):
    # Every statement that locks several partition (or key) rows takes them in key order.
    # A deadlock is retried, so the outcome hides it: the server's count is checked.
    # Fed in rounds, so that jobs enqueued behind a partition's known next job leave lazy
    # signals, which housekeeping folds beside completion batches of many partitions (the
    # lazy fold of migration 0015 deadlocked with partitions in three runs out of three,
    # not with keys).
    deadlocks = deadlocks_after_workers_left(observer)
    started = [
        workers(
            "--concurrency", "4", "--poll-interval", "0.05", settings={"HEARTBEAT_SECONDS": 0.5}
        )
        for _ in range(4)
    ]
    for worker in started:
        worker.wait_registered(observer)
    specs = [
        JobSpec("tests.tasks.noop", **FLOW_KEYS[flow](f"customer:{index}"))
        for _ in range(20)
        for index in range(200)
    ]
    for start in range(0, len(specs), 400):
        Job.objects.enqueue_many(specs[start : start + 400])
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == len(specs),
        timeout=240,
        interval=0.5,
    )
    for worker in started:
        worker.stop()
    assert deadlocks_after_workers_left(observer) == deadlocks, "the workers deadlocked"
