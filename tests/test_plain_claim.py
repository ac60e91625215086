"""The plain claim: plain jobs do not pay for partitions or concurrency keys, others do not wait.

While nothing says a partition or key of its queues can start a job, a worker sends
``claim_batch_plain`` (the claim without the partition and key branches). It must never
start a partitioned or limited job (those are not in ``pgq_job_claim``); one that
becomes startable through a producer's signal or a wake-up starts in that very round (the
full claim is sent at once); one a completion opens is announced on the flow channel.
"""

from __future__ import annotations

import pytest

from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(60)


def _round(store, *, plain: bool, limit: int = 50):
    return store.claim_round("w", ["default"], per_queue=limit, lease_seconds=30, plain=plain)


def _limited(key: str = "api", limit: int = 1) -> JobSpec:
    return JobSpec("tests.tasks.noop", concurrency_key=key, concurrency_limit=limit)


def test_without_flow_state_the_round_says_so_and_claims_plain_jobs(store):
    plain_ids = [store.enqueue(JobSpec("tests.tasks.noop")).id for _ in range(3)]
    first = _round(store, plain=False)
    assert sorted(job.id for job in first.jobs) == sorted(plain_ids)
    assert first.flow_open is False
    more = [store.enqueue(JobSpec("tests.tasks.noop")).id for _ in range(2)]
    second = _round(store, plain=True)
    assert sorted(job.id for job in second.jobs) == sorted(more)
    assert second.flow_open is False


@pytest.mark.parametrize("spec", [_limited(), JobSpec("tests.tasks.noop", partition_key="p")])
def test_a_flow_job_enqueued_meanwhile_is_announced_and_taken_by_the_full_round(
    store, open_connection, spec
):
    listen = open_connection(prepare=False)
    listen.execute(f"LISTEN {flow_channel()}")
    assert _round(store, plain=False).flow_open is False
    plain_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    flow_id = store.enqueue(spec).id
    # Its urgent signal is announced on the flow channel ...
    (notify,) = list(listen.notifies(timeout=2, stop_after=1))
    assert (notify.channel, notify.payload) == (flow_channel(), "default")
    # ... which the plain round does not read, and the full round folds and claims.
    assert [job.id for job in _round(store, plain=True).jobs] == [plain_id]
    assert [job.id for job in _round(store, plain=False).jobs] == [flow_id]


def test_a_flow_job_behind_an_older_next_job_is_not_announced(store, open_connection):
    listen = open_connection(prepare=False)
    listen.execute(f"LISTEN {flow_channel()}")
    first, second = (store.enqueue(_limited()).id for _ in range(2))
    # Both urgent: the key had no row yet when either was enqueued.
    assert [n.payload for n in listen.notifies(timeout=0.5)] == ["default", "default"]
    # Folds the signal and starts the first job: the key's row names the second next.
    assert [job.id for job in _round(store, plain=False).jobs] == [first]
    store.enqueue(_limited())
    # The key's row already names a ready job at least as urgent: a lazy signal, no news.
    assert list(listen.notifies(timeout=0.5)) == []
    (signal,) = store.runner.connection.execute(
        "SELECT urgent FROM django_pgqueue_concurrency_signal"
    ).fetchall()
    assert signal == (False,)
    assert second


def test_a_key_opened_by_a_completion_is_announced_and_taken_by_the_full_claim(
    store, open_connection
):
    listen = open_connection(prepare=False)
    listen.execute(f"LISTEN {flow_channel()}")
    first, second = (store.enqueue(_limited()).id for _ in range(2))
    running = _round(store, plain=False)
    assert [job.id for job in running.jobs] == [first]
    # At its limit, the key cannot start anything: plain rounds are enough, and they
    # read nothing of the key.
    at_limit = _round(store, plain=True)
    assert (at_limit.jobs, at_limit.flow_open) == ([], False)
    list(listen.notifies(timeout=0.2))  # the enqueues' own announcements
    store.complete_if_leased(running.jobs[0].lease, "null")
    (notify,) = list(listen.notifies(timeout=2, stop_after=1))
    assert (notify.channel, notify.payload) == (flow_channel(), "default")
    assert _round(store, plain=True).jobs == []
    reopened = _round(store, plain=False)
    assert [job.id for job in reopened.jobs] == [second]


def test_the_plain_round_is_one_statement_that_reads_no_flow_state(store, monkeypatch):
    store.enqueue(_limited())  # an urgent signal waits
    store.enqueue(JobSpec("tests.tasks.noop"))
    sent: list[str] = []
    run, run_many = store.runner.run, store.runner.run_many
    monkeypatch.setattr(store.runner, "run", lambda q, p: sent.append(q.name) or run(q, p))
    monkeypatch.setattr(
        store.runner, "run_many", lambda s: sent.extend(q.name for q, _ in s) or run_many(s)
    )
    assert len(_round(store, plain=True).jobs) == 1
    assert sent == ["claim_batch_plain"]


def test_the_plain_statement_alone_never_starts_a_partitioned_or_limited_job(store):
    limited = [store.enqueue(_limited(limit=5)).id for _ in range(3)]
    partitioned = [
        store.enqueue(JobSpec("tests.tasks.noop", partition_key=f"p{n}")).id for n in range(3)
    ]
    store.fold_signals()
    jobs, _signalled, _folded, flow_open = store._claim_batch(
        "w",
        ["default"],
        [50],
        masks=[None],
        floors=[None],
        flow_floors=([None], [None]),
        total=50,
        lease_seconds=30,
        plain=True,
    )
    assert jobs == []
    assert flow_open is False  # the plain statement knows nothing of them
    full = _round(store, plain=False, limit=4)
    assert len(full.jobs) == 4
    assert {job.id for job in full.jobs} <= set(limited) | set(partitioned)
    assert full.flow_open is True  # it took as many as it could: more may wait
