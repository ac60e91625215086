"""A key job whose producer committed late competes at its own priority (0025).

A claim reads the keys of a queue in the order of the next job their rows name, at most
its per-queue limit of them. A producer that saw the key's row name a ready job of its
priority or higher left a lazy signal; if its transaction committed after that job
started, the refresh that followed named a lower-priority job, and the lazy fold, which
skipped every row naming a ready job, left it so: the new job waited behind other keys'
lower-priority jobs. Found by the state model's late-producer rule for keys.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from django.utils import timezone

from django_pgqueue.models import ConcurrencyKey
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import ClaimedJob, JobSpec

pytestmark = pytest.mark.timeout(120)

NOOP = "tests.tasks.noop"


def _spec(key: str, priority: int = 0) -> JobSpec:
    return JobSpec(NOOP, concurrency_key=key, concurrency_limit=1, priority=priority)


def _claim_one(store: QueueStore) -> list[ClaimedJob]:
    """One job of the queue: the claim reads one key, the first its rows rank."""
    return store.claim("w", ["default"], per_queue=1, lease_seconds=30)


def _complete(store: QueueStore, job: ClaimedJob) -> None:
    assert store.complete_many_if_leased("w", [(job.lease, "null")]) == {job.id}


def _head(key: str) -> int | None:
    return ConcurrencyKey.objects.get(pk=key).head_id


def _late_job_behind_a_moved_row(
    store: QueueStore, open_connection: Any, *, name_no_job: bool = False
) -> tuple[int, int, psycopg.Connection[Any]]:
    """Key k's row names first (priority 5, ready), so a producer's priority-5 job is
    signalled lazily; first starts and finishes before the producer commits, and the
    refresh names the priority -5 job behind it. Another key has a priority-0 job.
    ``name_no_job``: the producer's signals name no job, as the previous release's.
    Return the other key's job, the late job and the producer's connection."""
    other = store.enqueue(_spec("other")).job
    first = store.enqueue(_spec("k", priority=5)).job
    store.fold_signals()
    conn = open_connection()
    producer = QueueStore(PsycopgRunner(conn, "default"))
    conn.execute("BEGIN")
    late = producer.enqueue(_spec("k", priority=5)).job
    if name_no_job:
        conn.execute("UPDATE django_pgqueue_concurrency_signal SET job_id = NULL")
    low = store.enqueue(_spec("k", priority=-5)).job
    (job,) = _claim_one(store)
    assert job.id == first.pk
    _complete(store, job)
    assert _head("k") == low.pk  # the refresh could not see the late job
    conn.execute("COMMIT")
    return other.pk, late.pk, conn


def test_a_key_job_committed_after_its_row_moved_on_competes_at_its_priority(
    store, open_connection
):
    other, late, _ = _late_job_behind_a_moved_row(store, open_connection)
    assert store.fold_lazy_signals() == (2, 1)
    assert _head("k") == late
    # Priority 5 before the other key's 0 (before 0025: the other key's job, k ranked
    # at -5 until something refreshed it).
    (job,) = _claim_one(store)
    assert job.id == late
    _complete(store, job)
    assert [job.id for job in _claim_one(store)] == [other]


def test_a_lazy_signal_behind_the_rows_ready_job_refreshes_nothing(store):
    first = store.enqueue(_spec("k")).job
    store.fold_signals()
    assert _head("k") == first.pk
    store.enqueue(_spec("k"))
    store.enqueue(_spec("k", priority=-1))
    assert store.fold_lazy_signals() == (2, 0)
    assert _head("k") == first.pk


def test_a_key_at_its_limit_is_left_to_the_completion(store, open_connection):
    spec = lambda priority: JobSpec(  # noqa: E731
        NOOP, concurrency_key="k", concurrency_limit=2, priority=priority
    )
    store.enqueue(spec(5))
    store.fold_signals()
    (first,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    nxt = store.enqueue(spec(5)).job
    store.fold_signals()
    store.fold_lazy_signals()
    assert _head("k") == nxt.pk
    conn = open_connection()
    producer = QueueStore(PsycopgRunner(conn, "default"))
    conn.execute("BEGIN")
    late = producer.enqueue(spec(5)).job  # behind nxt: lazy
    low = store.enqueue(spec(-5)).job
    (second,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    assert second.id == nxt.pk  # the key is at its limit now, its row names low
    assert _head("k") == low.pk
    conn.execute("COMMIT")
    # Nothing can start until a slot frees: the fold leaves the row to the completion.
    assert store.fold_lazy_signals() == (2, 0)
    _complete(store, first)
    assert _head("k") == late.pk
    assert [job.id for job in _claim_one(store)] == [late.pk]


def test_a_signal_of_an_older_release_is_compared_through_the_job_table(store, open_connection):
    """A signal naming no job (written by the previous release's producers): the fold
    looks the key's best ready job up and refreshes the row that does not name it."""
    other, late, _ = _late_job_behind_a_moved_row(store, open_connection, name_no_job=True)
    assert store.fold_lazy_signals() == (2, 1)
    assert _head("k") == late
    (job,) = _claim_one(store)
    assert job.id == late
    _complete(store, job)
    assert [job.id for job in _claim_one(store)] == [other]


def _signalled(store: QueueStore) -> list[tuple[str, int | None]]:
    rows = store.runner.connection.execute(  # type: ignore[attr-defined]
        "SELECT concurrency_key, job_id FROM django_pgqueue_concurrency_signal ORDER BY id"
    ).fetchall()
    return [(key, job_id) for key, job_id in rows]


def test_a_bulk_enqueue_names_each_keys_best_ready_job(store):
    later = timezone.now() + dt.timedelta(hours=1)
    jobs = store.enqueue_many(
        [
            JobSpec(NOOP, concurrency_key="k", concurrency_limit=1, priority=9, available_at=later),
            JobSpec(NOOP, concurrency_key="k", concurrency_limit=1, priority=0),
            JobSpec(NOOP, concurrency_key="k", concurrency_limit=1, priority=3),
            JobSpec(NOOP, concurrency_key="s", concurrency_limit=1, available_at=later),
        ]
    )
    # k's best ready job is the priority-3 one (the priority-9 one is scheduled); none
    # of s's is ready: its signal names none, and a fold would ask the job table.
    assert sorted(_signalled(store)) == [("k", jobs[2].job.pk), ("s", None)]


#: Jobs of the key run under the held snapshot before the fold is measured.
EARLIER_JOBS = 100


def test_under_a_held_snapshot_the_lazy_fold_reads_the_signalled_job_not_the_keys_entries(
    store, open_connection
):
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    for _ in range(EARLIER_JOBS):
        store.enqueue(_spec("k"))
        (job,) = _claim_one(store)
        _complete(store, job)
    # Each left a dead entry in pgq_job_conc_pending that the snapshot keeps.
    head = store.enqueue(_spec("k")).job
    store.fold_signals()
    assert _head("k") == head.pk
    store.enqueue(_spec("k"))  # behind the row's ready job: a lazy signal naming it
    conn = open_connection()
    folder = QueueStore(PsycopgRunner(conn, "default"))
    count = "SELECT pg_stat_get_xact_tuples_returned('pgq_job_conc_pending'::regclass)"

    def entries_read() -> int:
        with conn.transaction(force_rollback=True):
            (before,) = conn.execute(count).fetchone()
            assert folder.fold_lazy_signals() == (1, 0)
            (after,) = conn.execute(count).fetchone()
        return int(after - before)

    # Seven times: PL/pgSQL plans a statement for good (generic) after five runs.
    named = max(entries_read() for _ in range(7))
    conn.execute("UPDATE django_pgqueue_concurrency_signal SET job_id = NULL")
    unnamed = entries_read()
    print(f"lazy fold under a held snapshot: {named} entries (job named), {unnamed} (none)")
    assert named <= 2
    assert unnamed >= EARLIER_JOBS  # the fallback walks them: the count can tell
    holder.execute("ROLLBACK")


def test_the_previous_releases_fold_refreshes_the_key_too(store, open_connection):
    """Workers of the previous release fold with the two-argument function, which reads
    the signals as naming no job."""
    _, late, conn = _late_job_behind_a_moved_row(store, open_connection)
    (refreshed,) = conn.execute(
        "SELECT django_pgqueue_fold_concurrency(ARRAY['k'], NULL::text)"
    ).fetchone()
    assert refreshed == 1
    assert _head("k") == late
