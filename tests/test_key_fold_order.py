"""A key job whose producer committed late competes at its own priority (0025).

A claim reads the keys of a queue in the order of the next job their rows name, at most
its per-queue limit of them. A producer that saw the key's row name a ready job of its
priority or higher left a lazy signal; if its transaction committed after that job
started, the refresh that followed named a lower-priority job, and the lazy fold, which
skipped every row naming a ready job, left it so: the new job waited behind other keys'
lower-priority jobs. Found by the state model's late-producer rule for keys.
"""

from __future__ import annotations

import pytest

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


def test_a_key_job_committed_after_its_row_moved_on_competes_at_its_priority(
    store, open_connection
):
    other = store.enqueue(_spec("other")).job
    first = store.enqueue(_spec("k", priority=5)).job
    store.fold_signals()
    conn = open_connection()
    producer = QueueStore(PsycopgRunner(conn, "default"))
    conn.execute("BEGIN")
    # The row names first (priority 5, ready): the producer's signal is lazy.
    late = producer.enqueue(_spec("k", priority=5)).job
    low = store.enqueue(_spec("k", priority=-5)).job
    (job,) = _claim_one(store)
    assert job.id == first.pk
    _complete(store, job)
    assert _head("k") == low.pk  # the refresh could not see the late job
    conn.execute("COMMIT")
    assert store.fold_lazy_signals() == (2, 1)
    assert _head("k") == late.pk
    # Priority 5 before the other key's 0 (before 0025: the other key's job, k ranked
    # at -5 until something refreshed it).
    (job,) = _claim_one(store)
    assert job.id == late.pk
    _complete(store, job)
    assert [job.id for job in _claim_one(store)] == [other.pk]


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
