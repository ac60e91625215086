"""Partition and key floors: under a long-held snapshot, a claim of partitioned or
key-limited jobs does not walk the entries every earlier claim left in
``pgq_partition_claim`` and ``pgq_concurrency_claim`` (claim_batch's floor branches,
worker/cursor.py).

The cost is counted in index entries, never in seconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.statements.lease import floor_params
from django_pgqueue.store.values import ClaimedJob, ClaimFloor, JobSpec
from tests.claim_params import claim_params
from tests.plans import walk
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(300)

PARTITION = "partition"
KEY = "key"
INDEX = {PARTITION: "pgq_partition_claim", KEY: "pgq_concurrency_claim"}


def _spec(kind: str, name: str, *, at: dt.datetime, priority: int = 0, queue: str = "default"):
    """A job of its own partition, or of its own key (limit 2)."""
    if kind == PARTITION:
        return JobSpec(
            "tests.tasks.noop", queue=queue, partition_key=name, available_at=at, priority=priority
        )
    return JobSpec(
        "tests.tasks.noop",
        queue=queue,
        concurrency_key=name,
        concurrency_limit=2,
        available_at=at,
        priority=priority,
    )


def _fold(store: QueueStore) -> None:
    """Bring every partition and key row up to date (producers' signals folded)."""
    store.fold_signals()
    while store.fold_lazy_signals()[0]:
        pass


def _flow_floors(kind: str, floor: ClaimFloor | None) -> dict[str, Any]:
    if kind == PARTITION:
        return {"partition_floors": [floor]}
    return {"key_floors": [floor]}


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_a_floor_claim_takes_the_partitions_or_keys_after_its_floor_and_none_before(store, kind):
    now = timezone.now()
    minutes = {"old": 9, "floor": 8, "newer": 7, "newest": 6}
    jobs = {
        name: store.enqueue(_spec(kind, name, at=now - dt.timedelta(minutes=m))).job
        for name, m in minutes.items()
    }
    jobs["low"] = store.enqueue(
        _spec(kind, "low", at=now - dt.timedelta(minutes=10), priority=-5)
    ).job
    jobs["high"] = store.enqueue(
        _spec(kind, "high", at=now - dt.timedelta(minutes=1), priority=5)
    ).job
    # A second job of each key: a key takes as many as its free slots.
    if kind == KEY:
        for name in ("newer", "old"):
            store.enqueue(_spec(kind, name, at=now - dt.timedelta(minutes=minutes[name] - 0.5)))
    _fold(store)
    floor_job = jobs["floor"]
    floor = ClaimFloor(floor_job.priority, floor_job.available_at, floor_job.pk)
    taken = store.claim_round(
        "w", ["default"], per_queue=10, lease_seconds=30, **_flow_floors(kind, floor)
    ).jobs
    names = {_name(job, kind) for job in taken}
    # After the floor in claim order: the rest of its priority, then the lower ones.
    assert names == {"newer", "newest", "low"}
    if kind == KEY:
        assert len([job for job in taken if job.concurrency_key == "newer"]) == 2
    # Those before it (and the higher priority) wait for a claim from the head.
    again = store.claim_round("w", ["default"], per_queue=10, lease_seconds=30).jobs
    assert {_name(job, kind) for job in again} == {"old", "floor", "high"}


def _name(job: ClaimedJob, kind: str) -> str | None:
    return job.partition_key if kind == PARTITION else job.concurrency_key


def _entries_read(conn, kind: str, floor: ClaimFloor | None) -> int:
    """Entries of the kind's claim index one claim reads, dead ones included; rolled back."""
    count = f"SELECT pg_stat_get_xact_tuples_returned('{INDEX[kind]}'::regclass)"
    params = claim_params(
        20,
        **floor_params("part_", [floor if kind == PARTITION else None]),
        **floor_params("key_", [floor if kind == KEY else None]),
    )
    with conn.transaction(force_rollback=True):
        (before,) = conn.execute(count).fetchone()
        taken = conn.execute(QUERIES["claim_batch"].text, params).fetchall()
        (after,) = conn.execute(count).fetchone()
    assert len([row for row in taken if row[0] is not None]) == 20  # the 20 new ones
    return int(after - before)


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_under_a_held_snapshot_a_floor_claim_does_not_walk_the_partitions_or_keys_claimed_before(
    store, open_connection, kind
):
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    now = timezone.now()
    store.enqueue_many(
        [_spec(kind, f"old-{n}", at=now - dt.timedelta(seconds=3000 - n)) for n in range(1500)]
    )
    _fold(store)
    last = None
    claimed = 0
    # Each claim takes a partition (running) or fills a key (two jobs, limit 2): its row
    # leaves the claim index, and the snapshot keeps the entry it leaves behind.
    while jobs := store.claim("w", ["default"], per_queue=200, lease_seconds=300):
        claimed += len(jobs)
        last = max(jobs, key=lambda job: ClaimFloor.after(job).sort_key())
    assert claimed == 1500
    assert last is not None
    store.enqueue_many([_spec(kind, f"new-{n}", at=timezone.now()) for n in range(20)])
    _fold(store)
    conn = open_connection(prepare=False)
    from_head = _entries_read(conn, kind, None)
    from_floor = _entries_read(conn, kind, ClaimFloor.after(last))
    print(f"held snapshot, {kind}s: from the head {from_head} entries, from the floor {from_floor}")
    assert from_head >= 1500
    assert from_floor <= 60
    holder.execute("ROLLBACK")


def test_floor_branches_read_the_claim_indexes_by_range(open_connection):
    """Each floor branch is an index range scan of its claim index: the priority and the
    (available_at, id) bound as index conditions, not filters over the whole queue."""
    conn = open_connection(prepare=False)
    floor = ClaimFloor(0, timezone.now(), 1)
    params = claim_params(20, **floor_params("part_", [floor]), **floor_params("key_", [floor]))
    plan = conn.execute("EXPLAIN (FORMAT JSON) " + QUERIES["claim_batch"].text, params).fetchone()[
        0
    ][0]["Plan"]
    conditions: dict[str, list[str]] = {}
    for node in walk(plan):
        if node.get("Index Name") in INDEX.values():
            conditions.setdefault(node["Index Name"], []).append(node.get("Index Cond", ""))
    for index in INDEX.values():
        found = conditions.get(index, [])
        assert any("head_priority =" in c and "head_available_at" in c for c in found), found
        assert any("head_priority <" in c for c in found), found


def _claim_index_reads(observer, kind: str) -> int:
    observer.execute("SELECT pg_stat_clear_snapshot()")
    (read,) = observer.execute(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = %s", [INDEX[kind]]
    ).fetchone()
    return int(read)


def _drain_under_a_held_snapshot(
    workers: Callable[..., Any], observer, open_connection, queue: str, *, kind: str, floor_after
) -> int:
    """Run 1,500 jobs of as many partitions (or keys) through one worker, one claim at a
    time, while a REPEATABLE READ snapshot is held; return the claim index entries read."""
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    # Ready a second apart (in the past): a floor's look back (100 ms) covers none.
    now = timezone.now()
    specs = [
        _spec(kind, f"{queue}-{n}", at=now - dt.timedelta(seconds=1500 - n), queue=queue)
        for n in range(1500)
    ]
    ids = [job.pk for job in Job.objects.enqueue_many(specs)]
    before = _claim_index_reads(observer, kind)
    worker = workers(
        "--queue",
        queue,
        "--concurrency",
        "1",
        "--prefetch",
        "0",
        "--batch-size",
        "1",
        "--burst",
        settings={"CLAIM_FLOOR_AFTER_SECONDS": floor_after},
    )
    assert worker.wait(240) == 0, worker.output()
    wait_for(lambda: _claim_index_reads(observer, kind) > before, timeout=30)
    read = _claim_index_reads(observer, kind) - before
    assert Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids)
    holder.execute("ROLLBACK")
    return read


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_a_worker_under_a_held_snapshot_claims_partitions_and_keys_from_floors(
    workers, observer, open_connection, kind
):
    with_floors = _drain_under_a_held_snapshot(
        workers, observer, open_connection, "low", kind=kind, floor_after=0
    )
    from_head = _drain_under_a_held_snapshot(
        workers, observer, open_connection, "reports", kind=kind, floor_after=None
    )
    print(f"1,500 {kind}s one at a time: floors read {with_floors} entries, the head {from_head}")
    # From the head, each claim walks every entry claimed since the snapshot: about
    # 1,500 * 1,500 / 2 (each partition leaves two: one claimed, one emptied). With
    # floors, only the claims from the head between spans.
    assert from_head >= 1_000_000
    assert with_floors * 5 < from_head
