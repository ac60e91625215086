"""Batched handlers: one call of a task's handler for many of its jobs, one outcome each.

The boundary (the option, the handler's answer), the mates' claim on a real PostgreSQL
(what it may take, under a race), the start protocol that decides who runs a prefetched
job, and real ``runqueueworker`` subprocesses for the rest: per-job results, failures
retried alone, snoozes, timeouts, cancels, leases kept through a long batch, and
partitions and concurrency limits acting on batched jobs.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path

import pytest

from django_pgqueue import InvalidBatchResult, JobTimeout
from django_pgqueue.compat import task_backends
from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tasks.batches import BatchJob, batch_outcomes
from django_pgqueue.worker.flight import InFlight, Start
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

BATCH = "tests.tasks.ledger_batch"


def _job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def _batches(observer, ids) -> dict[str, list[int]]:
    """Return the ledger's batches (leader id -> job ids) of the jobs ``ids``."""
    found: dict[str, list[int]] = {}
    for entry in ledger.entries(observer):
        if entry["job_id"] in ids and entry["event"] == "batch":
            found.setdefault(f"{entry['label']}/{entry['attempt']}", []).append(entry["job_id"])
    return found


def _settled(worker, ids, timeout: float = 60) -> None:
    """Wait until none of ``ids`` can run again (retries are due within a second)."""
    wait_for(
        lambda: (
            not Job.objects.filter(
                pk__in=ids, status__in=["pending", "processing", "blocked"]
            ).exists()
        ),
        timeout=timeout,
        message=f"jobs {sorted(ids)} to finish",
    )
    worker.stop()


def _batch_job(job_id: int) -> BatchJob:
    return BatchJob(job_id, [], {}, 1, 3, "default", 0, dt.datetime.now(dt.UTC))


# ---------------------------------------------------------------- the boundary
def test_batch_size_is_validated_where_the_task_is_declared():
    assert tasks.ledger_batch.batch_size == 5
    assert tasks.noop.batch_size is None
    from django_pgqueue import task

    for bad in (0, -1, 1.5, True, 1001, "10"):
        with pytest.raises(InvalidOption, match="batch_size"):
            task(batch_size=bad)(tasks.add.func)
    with pytest.raises(InvalidOption, match="cannot take a context"):
        task(batch_size=10, takes_context=True)(tasks.add.func)
    with pytest.raises(InvalidOption, match="cannot be atomic"):
        task(batch_size=10, atomic=True)(tasks.add.func)


def test_a_handlers_answer_is_read_per_job_and_a_stranger_is_refused():
    jobs = [_batch_job(1), _batch_job(2)]
    assert batch_outcomes(None, jobs) == {}
    error = RuntimeError("x")
    assert batch_outcomes({1: "a", jobs[1]: error}, jobs) == {1: "a", 2: error}
    with pytest.raises(InvalidBatchResult, match="not in the batch"):
        batch_outcomes({3: "c"}, jobs)
    with pytest.raises(InvalidBatchResult, match="not in the batch"):
        batch_outcomes({True: "c"}, jobs)
    with pytest.raises(InvalidBatchResult, match="not list"):
        batch_outcomes(["a", "b"], jobs)


# ---------------------------------------------------------------- the mates' claim
def test_the_mates_claim_takes_only_ready_plain_jobs_of_the_task_in_claim_order(store):
    def spec(task=BATCH, **options):
        return JobSpec(task, **options)

    low = store.enqueue(spec(priority=0)).id
    high = store.enqueue(spec(priority=5)).id
    store.enqueue(spec(task="tests.tasks.noop"))
    store.enqueue(spec(partition_key="p"))
    store.enqueue(spec(concurrency_key="k", concurrency_limit=3))
    store.enqueue(spec(queue="emails"))
    store.enqueue(spec(available_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)))
    later = store.enqueue(spec(priority=0)).id
    taken = store.claim_batch_mates(
        "w", queue="default", task_path=BATCH, limit=2, lease_seconds=30
    )
    assert {job.id for job in taken} == {high, low}  # the best two in claim order
    assert all(job.worker_id == "w" and job.attempts == 1 for job in taken)
    (rest,) = store.claim_batch_mates(
        "w", queue="default", task_path=BATCH, limit=10, lease_seconds=30
    )
    assert rest.id == later
    assert (
        store.claim_batch_mates("w", queue="default", task_path=BATCH, limit=10, lease_seconds=30)
        == []
    )


def test_the_mates_claim_takes_nothing_from_a_paused_queue(store):
    store.enqueue(JobSpec(BATCH))
    store.pause_queue("default", paused_by="test", reason="batches")
    assert (
        store.claim_batch_mates("w", queue="default", task_path=BATCH, limit=5, lease_seconds=30)
        == []
    )


def test_the_mates_claim_reads_a_bounded_stretch_of_the_queue(store):
    # 150 jobs of another task ahead: a claim of 5 reads 100 rows and finds none; the
    # queue's next jobs are claimed by the full claim anyway.
    store.enqueue_many([JobSpec("tests.tasks.noop", priority=1) for _ in range(150)])
    mine = store.enqueue(JobSpec(BATCH)).id
    assert (
        store.claim_batch_mates("w", queue="default", task_path=BATCH, limit=5, lease_seconds=30)
        == []
    )
    (taken,) = store.claim_batch_mates(
        "w", queue="default", task_path=BATCH, limit=20, lease_seconds=30
    )
    assert taken.id == mine  # 20 jobs read 200 rows


def test_two_mates_claims_at_once_never_take_the_same_job(store, open_connection):
    from django_pgqueue.store.queue import QueueStore
    from django_pgqueue.store.runners import PsycopgRunner

    ids = {o.id for o in store.enqueue_many([JobSpec(BATCH) for _ in range(60)])}
    other = QueueStore(PsycopgRunner(open_connection(), "default"))
    barrier = threading.Barrier(2)
    taken: dict[str, list[int]] = {}

    def claim(name: str, each) -> None:
        barrier.wait(10)
        got: list[int] = []
        while batch := each.claim_batch_mates(
            name, queue="default", task_path=BATCH, limit=7, lease_seconds=30
        ):
            got.extend(job.id for job in batch)
        taken[name] = got

    threads = [
        threading.Thread(target=claim, args=("a", store)),
        threading.Thread(target=claim, args=("b", other)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not set(taken["a"]) & set(taken["b"])
    assert set(taken["a"]) | set(taken["b"]) == ids


# ---------------------------------------------------------------- who runs a waiting job
def _flight(store) -> InFlight:
    (job,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    return InFlight(job, None, lease_valid_until=time.monotonic() + 30)


def test_a_waiting_job_runs_alone_or_in_one_batch_never_both(store):
    for _ in range(200):
        store.enqueue(JobSpec(BATCH))
        flight = _flight(store)
        results: dict[str, object] = {}
        barrier = threading.Barrier(2)

        def thread_start(flight=flight, results=results, barrier=barrier) -> None:
            barrier.wait(5)
            results["thread"] = flight.start()

        def batch_join(flight=flight, results=results, barrier=barrier) -> None:
            barrier.wait(5)
            results["batch"] = flight.join_batch(time.monotonic())

        threads = [threading.Thread(target=thread_start), threading.Thread(target=batch_join)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert (results["thread"] is Start.RUN) != bool(results["batch"])
        if results["batch"]:
            assert results["thread"] is Start.BATCHED
        store.complete_many_if_leased("w", [(flight.job.lease, "null")])


def test_a_batch_never_takes_a_job_handed_back_or_whose_lease_may_have_run_out(store):
    store.enqueue(JobSpec(BATCH))
    handed_back = _flight(store)
    assert handed_back.withdraw()
    assert not handed_back.join_batch(time.monotonic())
    store.enqueue(JobSpec(BATCH))
    expired = _flight(store)
    expired.lease_valid_until = time.monotonic() - 1
    assert not expired.join_batch(time.monotonic())
    assert expired.start() is Start.EXPIRED
    expired.lease_valid_until = time.monotonic() + 30  # extended meanwhile: still given back
    assert not expired.join_batch(time.monotonic())


# ---------------------------------------------------------------- the worker
def test_one_handler_call_runs_many_jobs_each_with_its_own_result(workers, observer):
    results = [tasks.ledger_batch.enqueue(value=n) for n in range(12)]
    ids = {int(r.id) for r in results}
    worker = workers("--burst", "--concurrency", "1")
    assert worker.wait() == 0, worker.output()
    for n, result in enumerate(results):
        job = _job(int(result.id))
        assert (job.status, job.attempts) == ("succeeded", 1)
        assert job.result == {"job": job.pk, "value": n, "attempt": 1}
        final = task_backends["default"].get_result(result.id)
        assert final.return_value == job.result
    batches = _batches(observer, ids)
    assert sorted(j for js in batches.values() for j in js) == sorted(ids)
    assert max(len(js) for js in batches.values()) == 5
    assert len(batches) <= 4  # 12 jobs in batches of up to 5 (the first may be short)


def test_a_job_that_fails_in_its_batch_is_retried_alone(workers, observer):
    plan = ["ok", "fail_once", "fail", "permanent", "snooze_once", "ok"]
    results = [tasks.ledger_batch.enqueue(do=do) for do in plan]
    _settled(workers("--concurrency", "1"), [int(r.id) for r in results])
    rows = {do: _job(int(r.id)) for do, r in zip(plan, results, strict=True)}
    assert (rows["fail_once"].status, rows["fail_once"].attempts) == ("succeeded", 2)
    assert rows["fail_once"].errors[0]["exception_class"] == "builtins.RuntimeError"
    assert (rows["fail"].status, rows["fail"].attempts) == ("dead_letter", 3)
    assert (rows["permanent"].status, rows["permanent"].attempts) == ("dead_letter", 1)
    snoozed = rows["snooze_once"]
    assert (snoozed.status, snoozed.attempts, snoozed.snoozes) == ("succeeded", 1, 1)
    for job in (r for do, r in rows.items() if do == "ok"):
        assert (job.status, job.attempts, job.errors) == ("succeeded", 1, [])
    # Each retry ran with its own attempt number, not its first batch's.
    events = ledger.entries(observer, rows["fail"].pk)
    assert [e["attempt"] for e in events] == [1, 2, 3]


def test_a_batch_that_raises_fails_each_of_its_jobs(workers):
    results = [tasks.ledger_batch.enqueue(do="raise") for _ in range(3)]
    _settled(workers("--concurrency", "1"), [int(r.id) for r in results])
    for result in results:
        job = _job(int(result.id))
        assert (job.status, job.attempts) == ("dead_letter", 3)
        assert job.last_error_class == "builtins.ValueError"


def test_a_batch_returning_nothing_succeeds_every_job(workers):
    results = [tasks.batch_returns_nothing.enqueue() for _ in range(4)]
    assert workers("--burst").wait() == 0
    assert {(j.status, j.result) for j in Job.objects.filter(pk__in=[r.id for r in results])} == {
        ("succeeded", None)
    }


def test_an_answer_for_a_job_not_in_the_batch_fails_the_batch(workers):
    results = [tasks.batch_answers_for_strangers.enqueue() for _ in range(2)]
    assert workers("--burst").wait() == 0
    for result in results:
        job = _job(int(result.id))
        assert job.status == "dead_letter"
        assert job.last_error_class == (
            f"{InvalidBatchResult.__module__}.{InvalidBatchResult.__qualname__}"
        )


def test_an_async_batched_task_runs_its_jobs_in_one_call(workers, observer):
    results = [
        tasks.async_ledger_batch.enqueue(do=do, value=n)
        for n, do in enumerate(["ok", "fail_once", "ok"])
    ]
    _settled(workers("--concurrency", "1"), [int(r.id) for r in results])
    jobs = [_job(int(r.id)) for r in results]
    assert [(j.status, j.attempts) for j in jobs] == [
        ("succeeded", 1),
        ("succeeded", 2),
        ("succeeded", 1),
    ]
    assert jobs[0].result == {"job": jobs[0].pk, "value": 0, "attempt": 1}
    first_round = [
        b for key, b in _batches(observer, {j.pk for j in jobs}).items() if key.endswith("/1")
    ]
    assert sorted(j for b in first_round for j in b) == sorted(j.pk for j in jobs)


def test_a_batch_past_its_timeout_fails_each_job_with_job_timeout(workers):
    results = [tasks.slow_batch.enqueue() for _ in range(3)]
    _settled(workers("--concurrency", "1"), [int(r.id) for r in results])
    timeout = f"{JobTimeout.__module__}.{JobTimeout.__qualname__}"
    for result in results:
        job = _job(int(result.id))
        assert (job.status, job.attempts) == ("succeeded", 2), job.errors
        assert job.errors[0]["exception_class"] == timeout


#: A short lease, heartbeat and reaper: a lease not extended would be lost in seconds.
FAST = {
    "HEARTBEAT_SECONDS": 0.5,
    "LEASE_SECONDS": 2,
    "HOUSEKEEPING_INTERVAL_SECONDS": 0.5,
    "WORKER_TIMEOUT_SECONDS": 3,
}


def test_leases_of_a_long_batch_are_kept_and_a_cancelled_job_ends_cancelled(
    workers, observer, tmp_path: Path
):
    release = str(tmp_path / "release")
    results = [tasks.held_batch.enqueue(release=release, n=n) for n in range(6)]
    ids = [int(r.id) for r in results]
    worker = workers("--concurrency", "1", settings=FAST)

    def started():
        return len([e for e in ledger.entries(observer) if e["job_id"] in ids]) == 6

    wait_for(started, timeout=60, message="the batch to start")
    first = dict(Job.objects.filter(pk__in=ids).values_list("id", "lease_expires_at"))
    victim = ids[3]
    Job.objects.cancel([victim], reason="not this one")

    def extended_past_a_lease():
        rows = Job.objects.filter(pk__in=ids)
        return all(
            r.status == "processing"
            and r.attempts == 1
            and r.lease_expires_at > first[r.pk] + dt.timedelta(seconds=4)
            for r in rows
        )

    # Two lease lengths later every job is still held by its first attempt.
    wait_for(extended_past_a_lease, timeout=30, message="every lease to be extended")
    Path(release).touch()
    wait_for(
        lambda: not Job.objects.filter(pk__in=ids, status="processing").exists(),
        timeout=30,
        message="the batch to finish",
    )
    statuses = dict(Job.objects.filter(pk__in=ids).values_list("id", "status"))
    assert statuses.pop(victim) == "cancelled"
    assert set(statuses.values()) == {"succeeded"}
    assert len([e for e in ledger.entries(observer) if e["job_id"] in ids]) == 6  # once each
    worker.stop()


def test_partitions_and_limits_hold_inside_batches(workers, observer):
    partitioned = [tasks.ledger_batch.using(partition_key="p").enqueue(n=n) for n in range(4)]
    limited = [tasks.limited_batch.enqueue(n=n) for n in range(4)]
    plain = [tasks.ledger_batch.enqueue(n=n) for n in range(4)]
    ids = {int(r.id) for r in partitioned + limited + plain}
    worker = workers("--burst", "--concurrency", "2")
    assert worker.wait() == 0, worker.output()
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"succeeded"}
    p_ids = {int(r.id) for r in partitioned}
    k_ids = {int(r.id) for r in limited}
    for batch in _batches(observer, ids).values():
        assert len(set(batch) & p_ids) <= 1, batch
        assert len(set(batch) & k_ids) <= 1, batch
    # The partition's jobs ran in order.
    order = [e["job_id"] for e in ledger.entries(observer) if e["job_id"] in p_ids]
    assert order == sorted(p_ids)


def test_a_job_whose_lease_is_lost_mid_batch_keeps_what_its_new_holder_does(
    workers, observer, tmp_path: Path
):
    release = str(tmp_path / "release")
    results = [tasks.held_batch.enqueue(release=release, n=n) for n in range(4)]
    ids = [int(r.id) for r in results]
    worker = workers("--concurrency", "1", settings=FAST)
    wait_for(
        lambda: len([e for e in ledger.entries(observer) if e["job_id"] in ids]) == 4,
        timeout=60,
        message="the batch to start",
    )
    victim = ids[2]
    # Another holder takes the job over (as after an expiry and a reap, then a claim by
    # another worker): a new lease generation the batch's worker does not hold.
    observer.execute(
        "UPDATE django_pgqueue_job SET lease_generation = lease_generation + 1, "
        "claimed_by = 'someone-else' WHERE id = %s",
        [victim],
    )
    taken_over = Job.objects.get(pk=victim)
    Path(release).touch()
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status="succeeded").count() == 3,
        timeout=30,
        message=f"the batch's other jobs to finish\n{worker.output()}",
    )
    # The batch's outcome for the victim was refused: the row is as its new holder has it.
    row = Job.objects.get(pk=victim)
    assert (row.status, row.claimed_by, row.lease_generation) == (
        "processing",
        "someone-else",
        taken_over.lease_generation,
    )
    assert row.result is None
    worker.stop()


def test_a_graceful_stop_waits_for_the_whole_batch_and_records_every_job(
    workers, observer, tmp_path: Path
):
    import signal

    release = str(tmp_path / "release")
    results = [tasks.held_batch.enqueue(release=release, n=n) for n in range(5)]
    ids = [int(r.id) for r in results]
    worker = workers("--concurrency", "1", "--grace-seconds", "30")
    wait_for(
        lambda: len([e for e in ledger.entries(observer) if e["job_id"] in ids]) == 5,
        timeout=60,
        message="the batch to start",
    )
    worker.process.send_signal(signal.SIGTERM)
    from django_pgqueue.models import Worker

    wait_for(
        lambda: Worker.objects.filter(pid=worker.pid, status="draining").exists(),
        timeout=10,
        message=f"the worker to begin its shutdown\n{worker.output()}",
    )
    Path(release).touch()
    assert worker.wait(40) == 0, worker.output()
    rows = Job.objects.filter(pk__in=ids)
    assert {(r.status, r.attempts) for r in rows} == {("succeeded", 1)}
