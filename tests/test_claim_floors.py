"""Claim floors: a long-held snapshot does not make every claim walk the jobs claimed
since it was taken (worker/cursor.py, claim_batch's floor branches, reap_expired's
expired_since).

The cost is counted in buffers and index entries, never in seconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import ClaimedJob, ClaimFloor, JobSpec
from django_pgqueue.worker.cursor import (
    FLOOR_LOOKBACK,
    FLOOR_SPAN,
    SHORT_SPAN,
    ClaimCursor,
    ClaimFloors,
    HeadPacing,
    ReapFloor,
)
from tests.claim_params import claim_params
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(300)

T0 = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _job(job_id: int, *, queue: str = "default", priority: int = 0, at: int = 0, **more: Any):
    return ClaimedJob(
        id=job_id,
        queue=queue,
        task_path="tests.tasks.noop",
        args=[],
        kwargs={},
        priority=priority,
        attempts=1,
        max_attempts=5,
        lease_generation=1,
        step=None,
        partition_key=more.get("partition_key"),
        idempotency_key=None,
        created_at=T0,
        available_at=T0 + dt.timedelta(seconds=at),
        claimed_at=T0,
        lease_expires_at=T0,
        prior_workers=[],
        worker_id="w",
        concurrency_key=more.get("concurrency_key"),
    )


# ---------------------------------------------------------------- the worker's cursor
def _plain(floors: ClaimFloors | None) -> list[ClaimFloor | None] | None:
    """The plain floors of a claim (None: the head)."""
    return None if floors is None else floors.plain


def _sent(job: ClaimedJob) -> ClaimFloor:
    """The floor a claim sends after ``job``: FLOOR_LOOKBACK before it."""
    return ClaimFloor(job.priority, job.available_at - FLOOR_LOOKBACK, 0)


def test_fast_claims_from_the_head_never_use_floors():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    for n in range(5):
        assert cursor.floors(["default"]) is None
        cursor.claimed([_job(n)], seconds=0.004)
        clock.now += 0.001
    assert not cursor.active


def test_a_slow_claim_from_the_head_starts_floors_for_a_span_then_the_head_again():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    assert cursor.floors(["default"]) is None
    cursor.claimed([_job(7, at=3), _job(5, at=2)], seconds=0.5)
    # The floor is the last job in claim order (not the last row returned), sent
    # FLOOR_LOOKBACK early so that a producer transaction that committed late is seen.
    assert _plain(cursor.floors(["default"])) == [_sent(_job(7, at=3))]
    clock.now += FLOOR_SPAN * 0.5 - 0.01
    assert cursor.floors(["default"]) is not None
    clock.now += 0.02
    assert cursor.floors(["default"]) is None


def test_a_batch_scans_from_the_queue_floor_only_while_claims_use_floors():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.claimed([_job(3, at=1)], seconds=0.004)
    assert cursor.mates_floor("default") is None  # fast claims: from the head
    cursor.claimed([_job(7, at=3)], seconds=0.5)
    assert cursor.mates_floor("default") == _sent(_job(7, at=3))
    assert cursor.mates_floor("emails") is None  # no floor in that queue
    clock.now += FLOOR_SPAN * 0.5 + 0.01
    assert cursor.mates_floor("default") is None  # the head's turn again


def test_a_short_claim_from_floors_brings_the_head_back_sooner():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    cursor.claimed([_job(7, at=7)], seconds=0.5)
    # A full claim from floors keeps them for the whole span.
    cursor.floors(["default"])
    cursor.claimed([_job(8, at=8)], seconds=0.001, short=False)
    clock.now += SHORT_SPAN * 0.5 + 0.01
    assert cursor.floors(["default"]) is not None
    # One that found less than it looked for: jobs may wait behind the floor, and the
    # worker has room, so the head is due after SHORT_SPAN times the head's last scan.
    cursor.claimed([], seconds=0.001, short=True)
    assert cursor.floors(["default"]) is None
    cursor.claimed([_job(3, at=3)], seconds=0.5)
    assert _plain(cursor.floors(["default"])) == [_sent(_job(3, at=3))]
    # The claim from the head started a new span: a full one again.
    clock.now += SHORT_SPAN * 0.5 + 0.01
    assert cursor.floors(["default"]) is not None
    clock.now += (FLOOR_SPAN - SHORT_SPAN) * 0.5
    assert cursor.floors(["default"]) is None


def test_a_short_claim_from_the_head_starts_a_full_span():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    cursor.claimed([_job(7, at=7)], seconds=0.5, short=True)
    clock.now += SHORT_SPAN * 0.5 + 0.01
    assert cursor.floors(["default"]) is not None


def test_floors_only_move_on_and_a_claim_from_the_head_sets_them_again():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    cursor.claimed([_job(9, at=9)], seconds=1.0)
    cursor.floors(["default"])
    # A job before the floor (from the lookback) does not move it back.
    cursor.claimed([_job(3, at=1)], seconds=0.001)
    assert _plain(cursor.floors(["default"])) == [_sent(_job(9, at=9))]
    cursor.claimed([_job(12, at=12)], seconds=0.001)
    assert _plain(cursor.floors(["default"])) == [_sent(_job(12, at=12))]
    clock.now += 100
    assert cursor.floors(["default"]) is None  # the span is over: from the head
    cursor.claimed([_job(3, at=1)], seconds=1.0)
    assert _plain(cursor.floors(["default"])) == [_sent(_job(3, at=1))]


def test_a_queue_with_no_floor_is_claimed_from_its_head():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default", "emails"])
    cursor.claimed([_job(1, priority=3)], seconds=1.0)
    assert _plain(cursor.floors(["default", "emails"])) == [_sent(_job(1, priority=3)), None]
    assert cursor.floors(["emails"]) is None  # no floor at all: a claim from the head


def test_partitions_and_keys_have_floors_of_their_own():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    jobs = [
        _job(4, at=4, partition_key="p"),
        _job(6, at=6, partition_key="q"),
        # Key k's row sorted where its first job taken did (5); key m's at 3.
        _job(5, at=5, concurrency_key="k"),
        _job(8, at=8, concurrency_key="k"),
        _job(3, at=3, concurrency_key="m"),
        _job(2, at=2),
    ]
    cursor.claimed(jobs, seconds=1.0)
    floors = cursor.floors(["default"])
    assert floors is not None
    assert floors.plain == [_sent(_job(2, at=2))]
    assert floors.partitions == [_sent(_job(6, at=6))]
    # Not past job 8: key k's next job sorts after it, but another key's may sort
    # between 5 and 8, and was in this claim's reach only if it was taken.
    assert floors.keys == [_sent(_job(5, at=5))]


def test_a_short_claim_drops_the_partition_and_key_floors_and_keeps_the_plain_one():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    cursor.claimed(
        [_job(4, at=4, partition_key="p"), _job(5, at=5, concurrency_key="k"), _job(2, at=2)],
        seconds=1.0,
    )
    floors = cursor.floors(["default"])
    assert floors is not None
    # From floors, short: a partition whose backlog is older than its floor (its last
    # job ran long) was not in reach, so partitions and keys are read from the head.
    cursor.claimed([_job(7, at=7, partition_key="p"), _job(9, at=9)], seconds=0.001, short=True)
    floors = cursor.floors(["default"])
    assert floors is not None
    assert floors.plain == [_sent(_job(9, at=9))]
    assert floors.partitions == [None]
    assert floors.keys == [None]
    # A full claim sets them again.
    cursor.claimed([_job(12, at=12, partition_key="p")], seconds=0.001)
    floors = cursor.floors(["default"])
    assert floors is not None
    assert floors.partitions == [_sent(_job(12, at=12))]


def test_a_queue_with_only_a_partition_floor_is_claimed_from_floors():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    cursor.claimed([_job(4, at=4, partition_key="p")], seconds=1.0)
    floors = cursor.floors(["default"])
    assert floors == ClaimFloors(plain=[None], partitions=[_sent(_job(4, at=4))], keys=[None])
    cursor.forget()
    assert cursor.floors(["default"]) is None


def test_a_lost_connection_forgets_the_floors():
    clock = Clock()
    cursor = ClaimCursor(HeadPacing(0.05, clock))
    cursor.floors(["default"])
    cursor.claimed([_job(9, at=9)], seconds=1.0)
    assert cursor.floors(["default"]) is not None
    # A claim under way may have been rolled back, its jobs left before the floor.
    cursor.forget()
    assert cursor.floors(["default"]) is None
    cursor.claimed([_job(3, at=3)], seconds=1.0)
    assert _plain(cursor.floors(["default"])) == [_sent(_job(3, at=3))]


def test_floors_can_be_turned_off():
    with override_settings(PGQUEUE_CLAIM_FLOOR_AFTER_SECONDS=None):
        cursor = ClaimCursor(HeadPacing(clock=Clock()))
    cursor.claimed([_job(1)], seconds=30.0)
    assert cursor.floors(["default"]) is None


def test_the_reaper_floor_starts_after_a_pass_that_reaped_everything_it_could():
    clock = Clock()
    floor = ReapFloor(HeadPacing(0.05, clock))
    assert floor.since() is None
    floor.reaped(3, 100, seconds=2.0, database_now=T0)
    assert floor.since() == T0
    floor.reaped(0, 100, seconds=0.001, database_now=T0 + dt.timedelta(seconds=10))
    assert floor.since() == T0 + dt.timedelta(seconds=10)
    floor.reaped(100, 100, seconds=0.001, database_now=T0 + dt.timedelta(seconds=20))
    assert floor.since() is None  # a full batch: more may wait before the clock
    floor.reaped(0, 100, seconds=2.0, database_now=T0 + dt.timedelta(seconds=30))
    clock.now += FLOOR_SPAN * 2.0
    assert floor.since() is None  # the span is over: a pass from the head


# ---------------------------------------------------------------- the statements
def _enqueue(store, count, **options):
    return [
        outcome.job
        for outcome in store.enqueue_many(
            [JobSpec("tests.tasks.noop", **options) for _ in range(count)]
        )
    ]


def _ready_since(store, now: dt.datetime, minutes: int, priority: int = 0) -> Job:
    """A job ready since ``minutes`` before ``now``."""
    spec = JobSpec(
        "tests.tasks.noop", priority=priority, available_at=now - dt.timedelta(minutes=minutes)
    )
    return store.enqueue(spec).job


def _around_a_floor(store, now: dt.datetime) -> tuple[Job, ...]:
    """Jobs before and after a floor in claim order: old, the floor's, newer, newest (all
    priority 0), then a lower and a higher priority."""
    return (
        *(_ready_since(store, now, minutes) for minutes in (9, 8, 7, 6)),
        _ready_since(store, now, 10, priority=-5),
        _ready_since(store, now, 1, priority=5),
    )


def test_a_floor_claim_takes_the_best_jobs_after_its_floor_and_none_before(store):
    now = timezone.now()
    old, floor_job, newer, newest, low, high = _around_a_floor(store, now)
    future = store.enqueue(
        JobSpec("tests.tasks.noop", available_at=now + dt.timedelta(hours=1))
    ).job
    floor = ClaimFloor(0, floor_job.available_at, floor_job.pk)
    taken = []
    while jobs := store.claim_round(
        "w", ["default"], per_queue=1, lease_seconds=30, floors=[floor]
    ).jobs:
        taken.extend(job.id for job in jobs)
    # After the floor in claim order: the rest of priority 0, then the lower priorities.
    assert taken == [newer.pk, newest.pk, low.pk]
    rest = store.claim_round("w", ["default"], per_queue=10, lease_seconds=30).jobs
    assert sorted(job.id for job in rest) == sorted([high.pk, old.pk, floor_job.pk])
    assert Job.objects.get(pk=future.pk).status == JobStatus.PENDING


def test_a_floor_per_queue_and_none_for_the_head(store):
    first = _enqueue(store, 3)
    emails = _enqueue(store, 2, queue="emails")
    floor = ClaimFloor(0, first[0].available_at, first[0].pk)
    jobs = store.claim_round(
        "w", ["default", "emails"], per_queue=10, lease_seconds=30, floors=[floor, None]
    ).jobs
    assert sorted(job.id for job in jobs) == sorted(
        [first[1].pk, first[2].pk, emails[0].pk, emails[1].pk]
    )
    with pytest.raises(ValueError, match="one floor"):
        store.claim_round("w", ["default"], per_queue=1, lease_seconds=30, floors=[None, None])


def test_batch_mates_from_a_floor_take_the_jobs_after_it_and_none_before(store):
    now = timezone.now()
    old, floor_job, newer, newest, low, high = _around_a_floor(store, now)
    floor = ClaimFloor(0, floor_job.available_at, floor_job.pk)
    taken = store.claim_batch_mates(
        "w",
        queue="default",
        task_path="tests.tasks.noop",
        limit=10,
        lease_seconds=30,
        floor=floor,
    )
    # After the floor in claim order: the rest of priority 0, then the lower priorities.
    assert {job.id for job in taken} == {newer.pk, newest.pk, low.pk}
    rest = store.claim_batch_mates(
        "w", queue="default", task_path="tests.tasks.noop", limit=10, lease_seconds=30
    )
    assert {job.id for job in rest} == {high.pk, old.pk, floor_job.pk}
    # With room for fewer, the first after the floor in claim order.
    more = [_ready_since(store, now, 5), _ready_since(store, now, 4, priority=-9)]
    (first,) = store.claim_batch_mates(
        "w",
        queue="default",
        task_path="tests.tasks.noop",
        limit=1,
        lease_seconds=30,
        floor=ClaimFloor(0, newest.available_at, newest.pk),
    )
    assert first.id == more[0].pk


def _entries_read(conn, params: dict[str, Any], name: str = "claim_batch_plain") -> int:
    """Entries of pgq_job_claim one claim (``name``) reads, dead ones included; rolled back."""
    # The backend's counts not yet flushed: they may hold earlier transactions' too.
    count = "SELECT pg_stat_get_xact_tuples_returned('pgq_job_claim'::regclass)"
    with conn.transaction(force_rollback=True):
        (before,) = conn.execute(count).fetchone()
        taken = conn.execute(QUERIES[name].text, params).fetchall()
        (after,) = conn.execute(count).fetchone()
    assert len(taken) >= 20  # the 20 new jobs (claim_batch_plain adds its last row)
    return int(after - before)


def test_under_a_held_snapshot_a_floor_claim_does_not_walk_the_jobs_claimed_before(
    store, open_connection
):
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    claimed_total = 0
    last = None
    _enqueue(store, 3000)
    while jobs := store.claim("w", ["default"], per_queue=200, lease_seconds=300):
        claimed_total += len(jobs)
        last = max(jobs, key=lambda job: ClaimFloor.after(job).sort_key())
    assert claimed_total == 3000
    assert last is not None
    _enqueue(store, 20)
    conn = open_connection(prepare=False)
    params = claim_params(20)
    from_head = _entries_read(conn, params)
    floor = ClaimFloor.after(last)
    from_floor = _entries_read(
        conn,
        {
            **params,
            "floor_priorities": [floor.priority],
            "floor_available_ats": [floor.available_at],
            "floor_ids": [floor.id],
        },
    )
    print(f"held snapshot, 3000 claimed: from the head {from_head} entries, floor {from_floor}")
    # From the head, the 3000 entries the snapshot keeps, each a heap visit; from the
    # floor, the 20 new jobs.
    assert from_head >= 3000
    assert from_floor <= 40
    holder.execute("ROLLBACK")


def _mates_entries_read(conn, floor: ClaimFloor | None) -> int:
    """Entries of pgq_job_claim one scan for 20 batch mates reads, rolled back."""
    params = {
        "worker_id": "probe",
        "queue": "default",
        "task_path": "tests.tasks.noop",
        "limit": 20,
        "scan_limit": 200,
        "lease_seconds": 30.0,
        "floor_priority": None if floor is None else floor.priority,
        "floor_available_at": None if floor is None else floor.available_at,
        "floor_id": None if floor is None else floor.id,
    }
    return _entries_read(conn, params, "claim_batch_mates")


def test_under_a_held_snapshot_batch_mates_from_a_floor_do_not_walk_the_jobs_claimed_before(
    store, open_connection
):
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    _enqueue(store, 3000)
    last = None
    while jobs := store.claim("w", ["default"], per_queue=200, lease_seconds=300):
        last = max(jobs, key=lambda job: ClaimFloor.after(job).sort_key())
    assert last is not None
    _enqueue(store, 20)
    conn = open_connection(prepare=False)
    # Statistics of a table in use (autovacuum's): on a never-analyzed table the planner
    # may re-check the scanned rows through pgq_job_claim rather than by primary key.
    conn.execute("ANALYZE django_pgqueue_job")
    from_head = _mates_entries_read(conn, None)
    from_floor = _mates_entries_read(conn, ClaimFloor.after(last))
    print(f"held snapshot, 3000 claimed: mates from the head {from_head}, floor {from_floor}")
    assert from_head >= 3000
    assert from_floor <= 40
    holder.execute("ROLLBACK")


def test_the_reaper_leaves_leases_expired_before_its_floor_for_a_pass_from_the_head(store):
    (older, newer) = _enqueue(store, 2)
    store.claim("w", ["default"], per_queue=2, lease_seconds=300)
    conn = store.runner.connection
    conn.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - "
        "CASE WHEN id = %s THEN interval '10 minutes' ELSE interval '1 second' END "
        "WHERE id = ANY(%s)",
        (older.pk, [older.pk, newer.pk]),
    )
    since = conn.execute("SELECT now() - interval '1 minute'").fetchone()[0]
    reaped = store.reap_expired(limit=10, expired_since=since)
    assert [job.job_id for job in reaped] == [newer.pk]
    assert [job.job_id for job in store.reap_expired(limit=10)] == [older.pk]


def _lease_entries_read(conn, work) -> int:
    """Entries of pgq_job_lease read by ``work(conn)``, in one transaction."""
    count = "SELECT pg_stat_get_xact_tuples_returned('pgq_job_lease'::regclass)"
    with conn.transaction():
        (before,) = conn.execute(count).fetchone()
        work()
        (after,) = conn.execute(count).fetchone()
    return int(after - before)


def test_under_a_held_snapshot_a_reap_from_its_floor_does_not_walk_old_leases(
    store, open_connection
):
    # 3000 jobs whose leases had expired an hour ago when they completed: their
    # processing versions stay in pgq_job_lease while the snapshot is held.
    _enqueue(store, 3000)
    claimed = store.claim("w", ["default"], per_queue=3000, lease_seconds=300)
    conn = store.runner.connection
    conn.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 hour' "
        "WHERE status = 'processing'"
    )
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    store.complete_many_if_leased("w", [(job.lease, "null") for job in claimed])
    (late,) = _enqueue(store, 1)
    store.claim("w", ["default"], per_queue=1, lease_seconds=300)
    conn.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second' "
        "WHERE id = %s",
        [late.pk],
    )
    since = conn.execute("SELECT now() - interval '1 minute'").fetchone()[0]
    reaped: list[Any] = []
    from_floor = _lease_entries_read(
        conn, lambda: reaped.extend(store.reap_expired(limit=10, expired_since=since))
    )
    assert [job.job_id for job in reaped] == [late.pk]
    # Neither the batch's scan nor its update's recheck went through the old entries.
    assert from_floor <= 20
    from_head = _lease_entries_read(conn, lambda: store.reap_expired(limit=10))
    assert from_head >= 3000
    holder.execute("ROLLBACK")


# A plain task, and one whose jobs run in batches: the batch's more jobs are claimed
# from the same floors (claim_batch_mates).
@pytest.mark.parametrize("task", ["tests.tasks.noop", "tests.tasks.batch_returns_nothing"])
def test_a_worker_claiming_from_floors_runs_every_job_once_even_those_behind_its_floor(
    workers, observer, task
):
    # A floor after every claim: each claim from the head starts a span of floors.
    worker = workers("--concurrency", "2", settings={"CLAIM_FLOOR_AFTER_SECONDS": 0})
    worker.wait_registered(observer)
    first = [job.pk for job in Job.objects.enqueue_many([JobSpec(task) for _ in range(300)])]
    wait_for(
        lambda: Job.objects.filter(pk__in=first, status=JobStatus.SUCCEEDED).exists(), timeout=60
    )
    # Behind any floor the worker holds now: a higher priority, and an old ready time.
    behind = [
        Job.objects.enqueue(task, priority=50).pk,
        Job.objects.enqueue(task, available_at=timezone.now() - dt.timedelta(hours=1)).pk,
    ]
    more = [job.pk for job in Job.objects.enqueue_many([JobSpec(task) for _ in range(300)])]
    ids = first + behind + more

    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids),
        timeout=120,
    )
    assert set(Job.objects.filter(pk__in=ids).values_list("attempts", "lease_generation")) == {
        (1, 1)
    }
    assert worker.registry_row(observer) is not None


def _claim_index_reads(observer) -> int:
    observer.execute("SELECT pg_stat_clear_snapshot()")
    (read,) = observer.execute(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'pgq_job_claim'"
    ).fetchone()
    return int(read)


def _drain_under_a_held_snapshot(workers, observer, open_connection, queue, floor_after) -> int:
    """Run 2,000 jobs through one worker, one claim at a time, while a REPEATABLE READ
    snapshot is held; return the pgq_job_claim entries its claims read."""
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    # Ready a second apart (in the past): a floor's look back (100 ms) covers one job, so
    # what is counted is the walk past the jobs claimed before.
    now = timezone.now()
    specs = [
        JobSpec("tests.tasks.noop", queue=queue, available_at=now - dt.timedelta(seconds=2000 - n))
        for n in range(2000)
    ]
    ids = [job.pk for job in Job.objects.enqueue_many(specs)]
    before = _claim_index_reads(observer)
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
    assert worker.wait(180) == 0, worker.output()
    # The worker's backends flushed their counts as they closed.
    wait_for(lambda: _claim_index_reads(observer) > before, timeout=30)
    read = _claim_index_reads(observer) - before
    assert Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids)
    holder.execute("ROLLBACK")
    return read


def test_a_worker_under_a_held_snapshot_claims_from_floors_without_walking_its_past(
    workers, observer, open_connection
):
    # The shorter hold: floors on after every claim (0) against floors off.
    with_floors = _drain_under_a_held_snapshot(workers, observer, open_connection, "low", 0)
    from_head = _drain_under_a_held_snapshot(workers, observer, open_connection, "reports", None)
    print(f"2,000 jobs one at a time: floors read {with_floors} entries, the head {from_head}")
    # From the head, each claim walks every job claimed since the snapshot: about
    # 2,000 * 2,000 / 2 entries. With floors, only the claims from the head between spans.
    assert from_head >= 1_000_000
    assert with_floors * 5 < from_head
