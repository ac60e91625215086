"""Partitions are refreshed from the jobs that moved, not from their first job (0024).

A held snapshot keeps every index entry a partition's earlier jobs left in
``pgq_job_part_pending`` and ``pgq_job_part_processing``. The statements that move a
job (completions, failures, releases, snoozes, the reaper, the folds of producers' and
operators' signals) read the partition's next job from ``least(head_id, running_id, the
jobs that moved)`` on, and its running job by the row's ``running_id``, so they walk
none of those entries. Counted in index entries returned, never in seconds.

The bound is only as good as the rule behind it: a job that becomes pending below it
comes with a signal naming it. The order tests attack that rule where it is thinnest: a
producer's transaction that commits after a newer job of its partition started (its
signal lazy, then urgent), an operator's retry of an older dead letter, and a signal of
an older release that names no job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from django_pgqueue.models import Partition
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import ClaimedJob, Failure, JobSpec

pytestmark = pytest.mark.timeout(300)

#: Jobs run through the partition under the held snapshot before each measure.
EARLIER_JOBS = 120
#: Entries a refresh from the bound may read in the two indexes: the next job's, the
#: running probe's (primary key: not counted), and a few not committed yet.
FROM_THE_BOUND = 10
PARTITION_INDEXES = ("pgq_job_part_pending", "pgq_job_part_processing")
NOOP = "tests.tasks.noop"


def _spec(partition: str = "p") -> JobSpec:
    return JobSpec(NOOP, partition_key=partition)


def _claim(store: QueueStore) -> list[ClaimedJob]:
    return store.claim("w", ["default"], per_queue=10, lease_seconds=30)


def _claim_ids(store: QueueStore) -> list[int]:
    return [job.id for job in _claim(store)]


def _complete(store: QueueStore, job: ClaimedJob) -> None:
    assert store.complete_many_if_leased("w", [(job.lease, "null")]) == {job.id}


def _entries(conn: psycopg.Connection[Any]) -> int:
    """Entries this transaction has read from the partition indexes of the job table."""
    (count,) = conn.execute(
        "SELECT sum(pg_stat_get_xact_tuples_returned(to_regclass(name)::oid))::bigint "
        "FROM unnest(%s::text[]) AS name",
        [list(PARTITION_INDEXES)],
    ).fetchone()
    return int(count)


@pytest.fixture
def held(open_connection) -> Iterator[None]:
    """A REPEATABLE READ snapshot held open: VACUUM removes nothing written meanwhile."""
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    yield
    holder.execute("ROLLBACK")


def _run_earlier_jobs(store: QueueStore) -> None:
    """EARLIER_JOBS jobs of partition "p", each enqueued, claimed and completed."""
    for _ in range(EARLIER_JOBS):
        store.enqueue(_spec())
        (job,) = _claim(store)
        _complete(store, job)


@pytest.fixture
def measured(store, open_connection, held) -> Callable[[Callable[[QueueStore], object]], int]:
    """Entries an action reads on a connection of its own, in a transaction rolled back."""
    _run_earlier_jobs(store)
    conn = open_connection()
    mover = QueueStore(PsycopgRunner(conn, "default"))

    def measure(action: Callable[[QueueStore], object]) -> int:
        with conn.transaction(force_rollback=True):
            before = _entries(conn)
            action(mover)
            return _entries(conn) - before

    return measure


def test_the_full_refresh_walks_every_earlier_job(store, measured):
    """The control: the one-argument refresh (workers of the previous release, the repair
    sweep) reads the entries the earlier jobs left."""
    store.enqueue(_spec())
    store.fold_signals()
    entries = measured(
        lambda mover: mover.runner.connection.execute(
            "SELECT django_pgqueue_refresh_partitions(ARRAY['p'])"
        ).fetchone()
    )
    assert entries >= EARLIER_JOBS


def _running(store: QueueStore) -> ClaimedJob:
    """A running job of "p" with one more job behind it."""
    store.enqueue(_spec())
    store.enqueue(_spec())
    (job,) = _claim(store)
    return job


MOVES: dict[str, Callable[[QueueStore, ClaimedJob], object]] = {
    "complete": lambda mover, job: mover.complete_if_leased(job.lease, "null"),
    "complete_many": lambda mover, job: mover.complete_many_if_leased("w", [(job.lease, "null")]),
    "fail": lambda mover, job: mover.fail_if_leased(job.lease, Failure("E", "boom")),
    "fail_for_good": lambda mover, job: mover.fail_if_leased(
        job.lease, Failure("E", "boom", permanent=True)
    ),
    "release": lambda mover, job: mover.release_if_leased(job.lease),
    "release_many": lambda mover, job: mover.release_many_if_leased("w", [job.lease]),
    "snooze": lambda mover, job: mover.snooze_if_leased(
        job.lease, delay_seconds=60, max_snoozes=10
    ),
}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_job_leaving_processing_refreshes_its_partition_from_the_row_on(store, measured, move):
    job = _running(store)
    assert measured(lambda mover: MOVES[move](mover, job)) <= FROM_THE_BOUND


def test_the_reaper_refreshes_a_partition_from_the_row_on(store, measured):
    job = _running(store)
    store.runner.connection.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second' "
        "WHERE id = %s",
        [job.id],
    )

    def reap(mover: QueueStore) -> None:
        assert [reaped.job_id for reaped in mover.reap_expired(job_ids=[job.id])] == [job.id]

    assert measured(reap) <= FROM_THE_BOUND


@pytest.mark.parametrize("urgent", [True, False])
def test_a_fold_refreshes_a_partition_from_the_job_signalled_on(store, measured, urgent):
    """A new job behind an idle next job leaves a lazy signal, one of an empty partition
    an urgent one; either fold reads from the job the signal names."""
    if not urgent:
        store.enqueue(_spec())
        store.fold_signals()
    store.enqueue(_spec())
    (signal_urgent,) = store.runner.connection.execute(
        "SELECT urgent FROM django_pgqueue_partition_signal"
    ).fetchone()
    assert signal_urgent is urgent

    def fold(mover: QueueStore) -> None:
        if urgent:
            assert mover.fold_signals() == 1
        else:
            # Skipped: the job signalled is behind the row's next job.
            assert mover.fold_lazy_signals() == (1, 0)

    assert measured(fold) <= FROM_THE_BOUND


def test_a_completion_leaves_the_row_as_the_full_refresh_would(store):
    """Same row as the one-argument function's, after each kind of move."""
    conn = store.runner.connection

    def row() -> tuple[Any, ...]:
        return conn.execute(
            "SELECT head_id, head_priority, head_available_at, head_blocked, wake_at, "
            "running_id, queue, partition_bucket FROM django_pgqueue_partition "
            "WHERE partition_key = 'p'"
        ).fetchone()

    for move in sorted(MOVES):
        job = _running(store)
        MOVES[move](store, job)
        bounded = row()
        conn.execute("SELECT django_pgqueue_refresh_partitions(ARRAY['p'])")
        assert row() == bounded, move
        conn.execute("DELETE FROM django_pgqueue_job WHERE partition_key = 'p'")
        conn.execute("DELETE FROM django_pgqueue_partition")


def _producer(open_connection) -> tuple[psycopg.Connection[Any], QueueStore]:
    conn = open_connection()
    return conn, QueueStore(PsycopgRunner(conn, "default"))


def test_a_job_committed_after_a_newer_one_started_is_not_overtaken_lazy(store, open_connection):
    """The producer's transaction takes id O, and commits only once a newer job R of the
    partition has started. R's completion reads from R on and names N, a job after O, as
    next: O's lazy signal names O, so the fold refreshes the row although it names a next
    job (the rule before 0024 skipped it, and O waited for the repair sweep)."""
    first = store.enqueue(_spec()).job
    store.fold_signals()
    conn, producer = _producer(open_connection)
    conn.execute("BEGIN")
    older = producer.enqueue(_spec()).job  # behind an idle next job: a lazy signal
    newer = store.enqueue(_spec()).job
    after = store.enqueue(_spec()).job
    assert older.pk < newer.pk < after.pk
    started: list[int] = []
    (job,) = _claim(store)
    started.append(job.id)
    _complete(store, job)
    (job,) = _claim(store)  # the older job is not committed yet: the newer one starts
    started.append(job.id)
    conn.execute("COMMIT")
    _complete(store, job)
    assert Partition.objects.get(pk="p").head_id == after.pk  # the bound left O behind
    assert _claim_ids(store) == []  # the claim finds O older than the row's next job
    assert store.fold_lazy_signals()[1] == 1
    assert Partition.objects.get(pk="p").head_id == older.pk
    while claimed := _claim(store):
        (job,) = claimed
        started.append(job.id)
        _complete(store, job)
    assert started == [first.pk, newer.pk, older.pk, after.pk]


def test_a_job_committed_after_the_row_moved_past_it_is_folded_in(store, open_connection):
    """Fixed with 0024: O's producer looked while an older job was next (a lazy signal),
    and committed once the row named R, a newer job, as next, with nothing running. The
    fold skipped rows naming a next job, the claim refused R (O is older), and the
    partition waited for the repair sweep. O's signal now names O."""
    first = store.enqueue(_spec()).job
    store.fold_signals()
    conn, producer = _producer(open_connection)
    conn.execute("BEGIN")
    older = producer.enqueue(_spec()).job
    newer = store.enqueue(_spec()).job
    (job,) = _claim(store)
    assert job.id == first.pk
    _complete(store, job)
    assert Partition.objects.get(pk="p").head_id == newer.pk
    conn.execute("COMMIT")
    assert _claim_ids(store) == []
    assert store.fold_lazy_signals()[1] == 1
    assert _claim_ids(store) == [older.pk]


def test_a_job_committed_after_a_newer_one_started_is_not_overtaken_urgent(store, open_connection):
    """As above with an urgent signal (the partition had no row when O was enqueued): the
    claim folds it, from O on."""
    conn, producer = _producer(open_connection)
    conn.execute("BEGIN")
    older = producer.enqueue(_spec()).job
    newer = store.enqueue(_spec()).job
    after = store.enqueue(_spec()).job
    started: list[int] = []
    (job,) = _claim(store)
    started.append(job.id)
    conn.execute("COMMIT")
    _complete(store, job)
    while claimed := _claim(store):
        (job,) = claimed
        started.append(job.id)
        _complete(store, job)
    assert started == [newer.pk, older.pk, after.pk]


def test_a_dead_letter_retried_while_a_newer_job_runs_runs_next(store):
    """The retried job keeps its id, below the running one: its signal names it."""
    store.enqueue(_spec())
    (dead,) = _claim(store)
    store.fail_if_leased(dead.lease, Failure("E", "boom", permanent=True))
    newer = store.enqueue(_spec()).job
    after = store.enqueue(_spec()).job
    (running,) = _claim(store)
    assert running.id == newer.pk
    assert store.retry([dead.id]).done == (dead.id,)
    _complete(store, running)
    started = []
    while claimed := _claim(store):
        (job,) = claimed
        started.append(job.id)
        _complete(store, job)
    assert started == [dead.id, after.pk]


def test_a_signal_naming_no_job_refreshes_the_partition_in_full(store):
    """A producer or operator of the previous release (or a trigger of an earlier
    migration) signals without a job: the fold reads the partition from its first job."""
    conn = store.runner.connection
    older = store.enqueue(_spec()).job
    newer = store.enqueue(_spec()).job
    store.fold_signals()
    # The row as a bound would leave it, then an old-style signal: only a full read
    # finds the older job.
    conn.execute("UPDATE django_pgqueue_partition SET head_id = %s", [newer.pk])
    conn.execute("INSERT INTO django_pgqueue_partition_signal (partition_key) VALUES ('p')")
    assert store.fold_signals() == 1
    assert Partition.objects.get(pk="p").head_id == older.pk


def test_a_row_naming_a_job_that_stopped_elsewhere_is_read_in_full(store):
    """A running mark the moving statement did not make (a worker of the previous release
    finished the job by hand) is not trusted: the running job is looked up."""
    conn = store.runner.connection
    store.enqueue(_spec())
    store.enqueue(_spec())
    (job,) = _claim(store)
    conn.execute("UPDATE django_pgqueue_job SET status = 'succeeded' WHERE id = %s", [job.id])
    # Another job of the partition is running, unknown to the row.
    other = conn.execute(
        "UPDATE django_pgqueue_job SET status = 'processing', claimed_by = 'x', "
        "lease_expires_at = now() + interval '1 minute' WHERE partition_key = 'p' "
        "AND status = 'pending' RETURNING id"
    ).fetchone()[0]
    conn.execute(
        "SELECT django_pgqueue_refresh_partitions(ARRAY['p'], ARRAY[%s::bigint])", [job.id + 1000]
    )
    assert Partition.objects.get(pk="p").running_id == other
