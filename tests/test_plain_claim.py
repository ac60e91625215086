"""The plain claim: plain jobs do not pay for concurrency keys, limited jobs do not wait.

A worker whose last claim saw no key of its queues with a job that could start sends
``claim_batch_plain`` (the claim without the key branches). It must never start a
limited job (those are not in ``pgq_job_claim``), and a limited job that becomes
startable meanwhile must start in that very round, by the full claim sent at once.
"""

from __future__ import annotations

import pytest

from django_pgqueue.values import JobSpec

pytestmark = pytest.mark.timeout(60)


def _round(store, *, plain: bool, limit: int = 50):
    return store.claim_round("w", ["default"], per_queue=limit, lease_seconds=30, plain=plain)


def _limited(key: str = "api", limit: int = 1) -> JobSpec:
    return JobSpec("tests.tasks.noop", concurrency_key=key, concurrency_limit=limit)


def test_without_keys_the_round_says_so_and_claims_plain_jobs(store):
    plain_ids = [store.enqueue(JobSpec("tests.tasks.noop")).id for _ in range(3)]
    first = _round(store, plain=False)
    assert sorted(job.id for job in first.jobs) == sorted(plain_ids)
    assert first.keys_open is False
    more = [store.enqueue(JobSpec("tests.tasks.noop")).id for _ in range(2)]
    second = _round(store, plain=True)
    assert sorted(job.id for job in second.jobs) == sorted(more)
    assert second.keys_open is False


def test_a_limited_job_enqueued_meanwhile_starts_in_the_plain_round(store):
    assert _round(store, plain=False).keys_open is False
    plain_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    limited_id = store.enqueue(_limited()).id
    claimed = _round(store, plain=True)
    assert sorted(job.id for job in claimed.jobs) == sorted([plain_id, limited_id])


def test_a_key_opened_by_a_completion_is_seen_by_the_plain_round(store):
    first, second = (store.enqueue(_limited()).id for _ in range(2))
    running = _round(store, plain=False)
    assert [job.id for job in running.jobs] == [first]
    # At its limit, the key cannot start anything: plain rounds are enough.
    at_limit = _round(store, plain=True)
    assert (at_limit.jobs, at_limit.keys_open) == ([], False)
    store.complete_if_leased(running.jobs[0].lease, "null")
    # The completion recounted the key (no signal): only the probe can tell the worker.
    reopened = _round(store, plain=True)
    assert [job.id for job in reopened.jobs] == [second]


def test_the_plain_statement_alone_never_starts_a_limited_job(store):
    limited = [store.enqueue(_limited(limit=5)).id for _ in range(3)]
    _round(store, plain=False, limit=1)  # folds the key's signal; takes one
    jobs, _signalled, _folded, keys_open = store._claim_batch(
        "w", ["default"], [50], masks=[None], total=50, lease_seconds=30, plain=True
    )
    assert jobs == []
    assert keys_open is True
    assert len(limited) == 3
