"""Model-based test of every feature and operator action together (Hypothesis stateful).

Random sequences of store operations run against the real store on a real PostgreSQL,
beside a plain Python model (``tests/queue_model.py``) of what each must do:

- enqueue with any mix of partition key, concurrency key and limit, rate limit, coalesce
  key and ``after=``, one at a time or in batches, or from SQL (django_pgqueue_enqueue);
  priorities and delays; a producer whose transaction stays open across other steps
  (its partitioned jobs commit behind newer ones that already ran, its key jobs while
  their key runs and its row has moved on, or it rolls back);
- claims by several workers (full rounds, plain rounds, a batched task's mates, and two
  workers at once on two connections), and what a worker does with a lease: complete
  (alone or batched), fail (permanently or not), time out (the handler keeps running
  past its deadline), extend, give back (one, or a prefetched batch handed back), snooze
  (no attempt used, dead letter past the cap), by the current lease or a stale one;
- lease expiry and the reaper; an operator's cancel (pending, blocked or running), retry
  (with or without reviving dependents), run now, pause and resume a queue; pruning
  (finished jobs, and coalesce keys whose job no longer holds them); housekeeping's fold
  of lazy signals; the clock moving on.

After every step it checks the store against the model, and these invariants:

- no attempt of a job runs while another attempt of it runs (one lease at a time, and a
  cancelled running job keeps its lease until its handler's outcome is recorded);
- no concurrency limit is exceeded at any instant, and a partition runs one job at a time;
- one pending holder per coalesce key, the one its row in django_pgqueue_coalesce_key
  names (the test runs without the job table's unique key indexes, as a segmented job
  table will: the key tables alone must keep one job per key);
- per-key order: a partitioned job starts only when it is the oldest job of its partition
  not started yet (a blocked one keeps its turn);
- a claim leaves no claimable job behind when it has free capacity, and takes the best
  jobs in claim order (every non-terminal job can still make progress; at the end the
  test drains the queue and every job must finish);
- no bookkeeping statement raises (a stale lease's write raises LeaseLost and changes
  nothing; anything else that raises fails the test).

A second run drives the same machine on a job table in segments (a database of its own,
``manage.py pgqueuesegments enable``), with housekeeping's rotation as one more step:
it attaches and switches segments (waiting for a producer's open transaction), moves
jobs out of old segments and empties them, among all the other steps, and the model
must still match.

The clock. The queue compares timestamps with the database clock, which a test cannot
move. "Advancing the clock by N seconds" moves every stored time (jobs' availability and
lease expiry; partitions' and keys' next-job times, token buckets and wake-ups) N seconds
into the past instead. Model delays are multiples of 100 s and lease expiries fall on 50 s
offsets, so the real time an example takes can never flip a comparison.

CI runs a fixed number of examples; ``PGQUEUE_MODEL_EXAMPLES`` (and ``PGQUEUE_MODEL_STEPS``)
run more, as before a release (docs/explanation/guarantees.md says how).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_pgqueue.exceptions import LeaseLost
from django_pgqueue.states import TRANSITIONS, JobStatus
from django_pgqueue.store import segments
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import ClaimFloor, Failure, JobSpec, Lease
from tests.queue_model import FAILED, FINISHED, KEYS, RATED, ModelJob, QueueModel, claim_order
from tests.segmented import migrated_database, worker_connection

pytestmark = pytest.mark.timeout(900)

EXAMPLES = int(os.environ.get("PGQUEUE_MODEL_EXAMPLES", "200"))
STEPS = int(os.environ.get("PGQUEUE_MODEL_STEPS", "60"))
TRACE = os.environ.get("PGQUEUE_MODEL_TRACE")
QUEUES = ("default", "emails")
WORKERS = ("w1", "w2", "w3")
LEASE_SECONDS = 150
# Every backoff is exactly BACKOFF seconds: no jitter, base == max.
BACKOFF = 100
POLICY = RetryPolicy(base_seconds=BACKOFF, max_seconds=BACKOFF, jitter=0)
ALLOWED_MOVES = {(source, target) for sources, target in TRANSITIONS.values() for source in sources}
#: What a job can carry besides its queue: nothing, a partition, a concurrency key, the
#: rate-limited key, a coalesce key (alone or in a partition).
FLOWS = (
    {},
    {},
    {"partition_key": "p1"},
    {"partition_key": "p2"},
    {"concurrency_key": "k1", "concurrency_limit": KEYS["k1"]},
    {"concurrency_key": "k2", "concurrency_limit": KEYS["k2"]},
    {"concurrency_key": RATED, "rate_limit": "1/100s"},
    {"coalesce_key": "c1"},
    {"coalesce_key": "c2", "partition_key": "p1"},
)
#: A concurrency key's jobs share a queue (a key is claimed through the queue of its next
#: job, see docs/howto/flow-control.md): the model keeps each key in one.
KEY_QUEUES = {"k1": "default", "k2": "emails", RATED: "default"}
#: Each key's flow, as FLOWS gives it (its limit, or the rated key's rate).
KEY_FLOWS = {flow["concurrency_key"]: flow for flow in FLOWS if "concurrency_key" in flow}
SHIFT = """
WITH jobs AS (
    UPDATE django_pgqueue_job SET
        available_at = available_at - make_interval(secs => %(s)s),
        lease_expires_at = lease_expires_at - make_interval(secs => %(s)s)
), partitions AS (
    UPDATE django_pgqueue_partition SET
        head_available_at = head_available_at - make_interval(secs => %(s)s),
        wake_at = wake_at - make_interval(secs => %(s)s)
)
UPDATE django_pgqueue_concurrency SET
    head_available_at = head_available_at - make_interval(secs => %(s)s),
    tokens_at = tokens_at - make_interval(secs => %(s)s),
    wake_at = wake_at - make_interval(secs => %(s)s)
"""


class QueueMachine(RuleBasedStateMachine):
    """The queue, driven through its store, beside a model of what it must do."""

    store: QueueStore  # set by the test before the machine runs
    second: QueueStore  # another connection, for claims at the same time
    producer: QueueStore  # a producer's connection, its transaction left open at will

    leases = Bundle("leases")
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        if TRACE:
            with open(TRACE, "a") as trace:
                trace.write("=== example\n")
        self.conn = self.store.runner.connection  # type: ignore[attr-defined]
        self.conn.execute(
            "TRUNCATE django_pgqueue_job, django_pgqueue_dependency, django_pgqueue_partition, "
            "django_pgqueue_partition_signal, django_pgqueue_concurrency, "
            "django_pgqueue_concurrency_signal, django_pgqueue_queue_pause, "
            "django_pgqueue_job_history, django_pgqueue_job_key, django_pgqueue_coalesce_key"
        )
        self.model = QueueModel()
        self.seen_status: dict[int, JobStatus] = {}
        self.checked: Counter[str] = Counter()
        #: Each worker's last plain job taken per queue: the floor it would claim from.
        self.floors: dict[tuple[str, str], ClaimFloor] = {}
        #: ... and its last partitioned or key-limited job: its partition and key floors.
        self.flow_floors: dict[tuple[str, str, str], ClaimFloor] = {}
        #: Jobs a producer enqueued in its transaction, still open (not yet committed),
        #: each with its flow (a partition key, or a concurrency key and its limit).
        self.uncommitted: list[tuple[int, str, int, dict[str, Any]]] = []
        #: The concurrency signals that transaction wrote (they name no job: by id).
        self.uncommitted_signals: list[int] = []
        #: Partitions a late producer's job joined with a lazy signal that no fold has
        #: read yet: their rows may still name a newer job (see check_claim).
        self.lagging: set[str] = set()
        #: Late jobs committed after a newer job of their partition had started.
        self.overtaken: set[int] = set()
        #: Keys a late producer's job joined with a lazy signal that no fold has read
        #: yet: their rows may name no next job that can start (see check_claim).
        self.lagging_keys: set[str] = set()
        #: Late key jobs committed, not started yet.
        self.late_key_jobs: set[int] = set()

    # ------------------------------------------------------------------ helpers
    @property
    def now(self) -> int:
        return self.model.now

    def db_rows(self) -> dict[int, dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, status, attempts, max_attempts, lease_generation, claimed_by, "
            "partition_key, concurrency_key, coalesce_key, available_at, "
            "available_at <= now() AS ready, lease_expires_at, "
            "cancel_requested_at IS NOT NULL AS cancel_requested, snoozes "
            "FROM django_pgqueue_job_all"
        ).fetchall()
        names = (
            "id",
            "status",
            "attempts",
            "max_attempts",
            "lease_generation",
            "claimed_by",
            "partition_key",
            "concurrency_key",
            "coalesce_key",
            "available_at",
            "ready",
            "lease_expires_at",
            "cancel_requested",
            "snoozes",
        )
        return {row[0]: dict(zip(names, row, strict=True)) for row in rows}

    def is_current(self, lease: Lease) -> bool:
        job = self.model.jobs.get(lease.job_id)
        return job is not None and job.status == JobStatus.PROCESSING and job.lease == lease

    def expect_lease_lost(self, lease: Lease, operation: Any) -> None:
        """Run a fenced write by a stale lease: it must raise LeaseLost and change nothing."""
        before = self.db_rows()
        with pytest.raises(LeaseLost):
            operation()
        after = self.db_rows()
        assert after == before, f"a stale lease {lease} changed rows"
        self.checked["stale lease changed nothing"] += 1

    def add_job(
        self, job_id: int, queue: str, priority: int, max_attempts: int, **flow: Any
    ) -> ModelJob:
        job = ModelJob(
            job_id,
            queue,
            priority,
            max_attempts,
            partition=flow.get("partition_key"),
            key=flow.get("concurrency_key"),
            coalesce=flow.get("coalesce_key"),
            ready_at=self.now,
        )
        self.model.jobs[job_id] = job
        return job

    def take(self, claimed: list[Any], worker: str) -> None:
        """Record claimed jobs in the model, checking each against it."""
        db_now = self.conn.execute("SELECT now()").fetchone()[0]
        for job in claimed:
            model = self.model.jobs[job.id]
            assert job.available_at <= job.claimed_at <= db_now
            assert job.attempts == model.attempts + 1 <= job.max_attempts
            assert all(job.lease_generation > g for g in model.generations), (
                f"job {job.id} re-leased with an old generation {job.lease_generation}"
            )
            model.status = JobStatus.PROCESSING
            model.attempts = job.attempts
            model.lease = job.lease
            model.lease_expires = self.now + LEASE_SECONDS
            model.generations.append(job.lease_generation)
            self.lagging.discard(model.partition)  # type: ignore[arg-type]
            if job.id in self.overtaken:
                self.overtaken.discard(job.id)
                self.checked["a late producer's job ran in its turn"] += 1
            # A claim that took from a key read its jobs from the job table, and left
            # its row naming the next one of them.
            self.lagging_keys.discard(model.key)
            if job.id in self.late_key_jobs:
                self.late_key_jobs.discard(job.id)
                self.checked["a late producer's key job ran"] += 1
            if model.key == RATED:
                self.model.rate_starts.append(self.now)
            floor = ClaimFloor.after(job)
            if job.partition_key is None and job.concurrency_key is None:
                known = self.floors.get((worker, job.queue))
                if known is None or floor.sort_key() > known.sort_key():
                    self.floors[(worker, job.queue)] = floor
            else:
                kind = "partition" if job.partition_key is not None else "key"
                known = self.flow_floors.get((kind, worker, job.queue))
                if known is None or floor.sort_key() > known.sort_key():
                    self.flow_floors[(kind, worker, job.queue)] = floor

    def check_claim(
        self, claimed: list[Any], queues: tuple[str, ...], per_queue: int, *, exact: bool
    ) -> None:
        """Check a claim against the model: claimable, ordered, and (``exact``) complete.

        Call before the claim is recorded in the model (:meth:`take`).
        """
        rows = self.db_rows()
        available = {job_id: row["available_at"] for job_id, row in rows.items()}
        expected = {queue: self.model.claimable(queue, available) for queue in queues}
        # A partition whose late job's lazy signal is not folded yet may be passed over
        # (its row names a newer job, which the claim refuses), never run out of turn.
        # Likewise a key (its row may name no job that can start, or one that sorts
        # after the late job: it was refreshed while the late job was not committed),
        # unless this claim took from it: a claim takes a key's jobs from the job
        # table, in claim order. Once a fold has read its signal, the key competes at
        # its best job's place again (migration 0025).
        took_keys = {job.concurrency_key for job in claimed}
        optional = {
            job.id
            for jobs in expected.values()
            for job in jobs
            if job.partition in self.lagging
            or (job.key in self.lagging_keys and job.key not in took_keys)
        }
        partitions = [job.partition_key for job in claimed if job.partition_key is not None]
        assert len(partitions) == len(set(partitions)), "two jobs of one partition at once"
        keys = Counter(job.concurrency_key for job in claimed if job.concurrency_key)
        for key, count in keys.items():
            free = self.model.limit_of(key) - self.model.in_flight(key)
            if key == RATED:
                free = min(free, self.model.tokens())
            assert count <= free, f"claimed {count} jobs of {key} with {free} free"
        by_queue: dict[str, list[int]] = {queue: [] for queue in queues}
        for job in claimed:
            assert job.queue in queues
            assert self.model.jobs[job.id] in expected[job.queue], (
                f"claimed job {job.id} was not claimable: {self.model.jobs[job.id]}, "
                f"now={self.now}; claimable: {[j.id for j in expected[job.queue]]}"
            )
            by_queue[job.queue].append(job.id)
        self.checked["claimed jobs were claimable"] += len(claimed)
        for queue in queues:
            took = by_queue[queue]
            assert len(took) <= per_queue
            if not exact:
                continue
            candidates = [
                job for job in expected[queue] if job.id not in optional or job.id in took
            ]
            # Liveness: free capacity left behind no claimable job of the queue.
            assert len(took) == min(per_queue, len(candidates)), (
                f"took {took} from {queue!r} but these were claimable: "
                f"{[(j.id, j.partition, j.key, j.priority) for j in candidates]} "
                f"(now={self.now}; jobs: {sorted(self.model.jobs.values(), key=lambda j: j.id)})"
            )
            left = [job for job in candidates if job.id not in took]
            if took and left:
                worst = max(claim_order(self.model.jobs[i], available) for i in took)
                best = min(claim_order(job, available) for job in left)
                assert worst < best, f"claim took {took} of {queue!r} but left {best[2]} first"
            self.checked["claim liveness and order"] += 1

    # ------------------------------------------------------------------ producers
    @rule(
        target=jobs,
        queue=st.sampled_from(QUEUES),
        flow=st.sampled_from(FLOWS),
        priority=st.sampled_from((-5, 0, 0, 5)),
        delay=st.sampled_from((0, 0, 0, 100, 200)),
        max_attempts=st.integers(1, 3),
    )
    def enqueue(
        self, queue: str, flow: dict[str, Any], priority: int, delay: int, max_attempts: int
    ) -> int:
        queue = KEY_QUEUES.get(flow.get("concurrency_key", ""), queue)
        available_at = None
        if delay:
            available_at = self.conn.execute("SELECT now()").fetchone()[0] + dt.timedelta(
                seconds=delay
            )
        holder = None
        if "coalesce_key" in flow:
            holder = self.model.coalescing_holder(flow["coalesce_key"])
        outcome = self.store.enqueue(
            JobSpec(
                "tests.tasks.noop",
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                available_at=available_at,
                **flow,
            )
        )
        if holder is not None:
            # Coalesced into the pending job holding the key: its place stays.
            assert outcome.id == holder.id
            assert not outcome.created
            self.checked["coalesced into the pending holder"] += 1
            return outcome.id
        assert outcome.created
        job = self.add_job(outcome.id, queue, priority, max_attempts, **flow)
        job.ready_at = self.now + delay
        return job.id

    @rule(
        target=jobs,
        queue=st.sampled_from(QUEUES),
        partition=st.sampled_from((None, None, "p1", "p2")),
        priority=st.sampled_from((-5, 0, 5)),
        delay=st.sampled_from((0, 0, 100)),
        max_attempts=st.integers(1, 3),
    )
    def enqueue_sql(
        self, queue: str, partition: str | None, priority: int, delay: int, max_attempts: int
    ) -> int:
        """A trigger or another service enqueues with django_pgqueue_enqueue()."""
        run_after = self.conn.execute("SELECT now()").fetchone()[0] + dt.timedelta(seconds=delay)
        (job_id,) = self.conn.execute(
            "SELECT django_pgqueue_enqueue('tests.tasks.noop', queue => %s, priority => %s, "
            "run_after => %s, max_attempts => %s, partition_key => %s)",
            [queue, priority, run_after, max_attempts, partition],
        ).fetchone()
        flow = {} if partition is None else {"partition_key": partition}
        job = self.add_job(job_id, queue, priority, max_attempts, **flow)
        job.ready_at = self.now + delay
        self.checked["enqueued from SQL"] += 1
        return int(job_id)

    @rule(
        target=jobs,
        queue=st.sampled_from(QUEUES),
        flow=st.sampled_from([f for f in FLOWS if "coalesce_key" not in f]),
        priorities=st.lists(st.sampled_from((-5, 0, 5)), min_size=2, max_size=5),
    )
    def enqueue_many(self, queue: str, flow: dict[str, Any], priorities: list[int]) -> Any:
        queue = KEY_QUEUES.get(flow.get("concurrency_key", ""), queue)
        outcomes = self.store.enqueue_many(
            JobSpec("tests.tasks.noop", queue=queue, priority=priority, max_attempts=2, **flow)
            for priority in priorities
        )
        for outcome, priority in zip(outcomes, priorities, strict=True):
            self.add_job(outcome.id, queue, priority, 2, **flow)
        return multiple(*(outcome.id for outcome in outcomes))

    @precondition(lambda self: len(self.uncommitted) < 3)
    @rule(
        target=leases,
        queue=st.sampled_from(QUEUES),
        # p3 is the late producers' own: its newer jobs are soon next, and run first.
        partition=st.sampled_from(("p1", "p3", "p3")),
        priority=st.sampled_from((-5, 0, 5)),
        between=st.booleans(),
    )
    def enqueue_uncommitted(self, queue: str, partition: str, priority: int, between: bool) -> Any:
        """A producer enqueues inside its own transaction and keeps it open: its job's id
        is taken now, but nothing sees the job until the commit, while every other rule
        (claims, completions, the reaper, operators, folds) goes on, so the partition's
        newer jobs can run before it and its row move past it.

        ``between``: the job is put between two of its partition's: an older one,
        already in the partition's row (so the producer's signal is lazy), and a newer
        one; then a worker claims from the queue. Once the older one finishes, the row
        names the newer one as next, and the late job commits behind it: the case a
        lazy fold must not skip (migration 0024)."""
        if between:
            older = self.store.enqueue(
                JobSpec("tests.tasks.noop", queue=queue, max_attempts=2, partition_key=partition)
            )
            self.add_job(older.id, queue, 0, 2, partition_key=partition)
            self.store.fold_signals()  # as a claim would: the row names its next job
        conn = self.producer.runner.connection  # type: ignore[attr-defined]
        if not self.uncommitted:
            conn.execute("BEGIN")
        outcome = self.producer.enqueue(
            JobSpec(
                "tests.tasks.noop",
                queue=queue,
                priority=priority,
                max_attempts=2,
                partition_key=partition,
            )
        )
        self.uncommitted.append((outcome.id, queue, priority, {"partition_key": partition}))
        self.checked["enqueued in an open transaction"] += 1
        if not between:
            return multiple()
        newer = self.store.enqueue(
            JobSpec("tests.tasks.noop", queue=queue, max_attempts=2, partition_key=partition)
        )
        self.add_job(newer.id, queue, 0, 2, partition_key=partition)
        claimed = self.store.claim("w1", [queue], per_queue=3, lease_seconds=LEASE_SECONDS)
        self.check_claim(claimed, (queue,), 3, exact=True)
        self.take(claimed, "w1")
        return multiple(*(job.lease for job in claimed))

    @precondition(lambda self: len(self.uncommitted) < 3)
    @rule(
        target=leases,
        key=st.sampled_from(("k1", "k2", "k2", RATED)),
        priority=st.sampled_from((-5, 0, 5)),
        around=st.booleans(),
        finish=st.booleans(),
    )
    def uncommitted_key_job(self, key: str, priority: int, around: bool, finish: bool) -> Any:
        """The producer's open transaction enqueues a job under a concurrency key: the
        key's other jobs start and finish meanwhile, and the late one commits while
        they run (the limit holds all along) or rolls back (no job, no signal).

        ``around``: the job is put between two of its key's, one ahead at the highest
        priority, already its row's next job (so the producer's signal is lazy), and
        one behind at the lowest; then a worker claims from the key's queue. The job
        ahead runs (k1 is then at its limit; k2 may take the one behind too), and the
        row moves on to the job behind, or to none, without the late job: what it says
        when the late job commits is what a lazy fold has to read again. ``finish``:
        what the worker took finishes at once, so the key may have nothing running and
        no row when the late job commits: then nothing but the fold refreshes it."""
        queue = KEY_QUEUES[key]
        flow = KEY_FLOWS[key]
        if around:
            ahead = self.store.enqueue(
                JobSpec("tests.tasks.noop", queue=queue, priority=5, max_attempts=2, **flow)
            )
            self.add_job(ahead.id, queue, 5, 2, **flow)
            self.store.fold_signals()  # as a claim would: the row names its next job
        conn = self.producer.runner.connection  # type: ignore[attr-defined]
        if not self.uncommitted:
            conn.execute("BEGIN")
        outcome = self.producer.enqueue(
            JobSpec("tests.tasks.noop", queue=queue, priority=priority, max_attempts=2, **flow)
        )
        # Its own signal, seen only from inside the transaction.
        signals = conn.execute(
            "SELECT id FROM django_pgqueue_concurrency_signal "
            "WHERE xmin = pg_current_xact_id()::xid AND concurrency_key = %s "
            "AND id <> ALL(%s)",
            [key, self.uncommitted_signals],
        ).fetchall()
        assert signals, f"no signal for the late job {outcome.id} of {key}"
        self.uncommitted_signals.extend(signal_id for (signal_id,) in signals)
        self.uncommitted.append((outcome.id, queue, priority, flow))
        self.checked["enqueued a key job in an open transaction"] += 1
        if not around:
            return multiple()
        behind = self.store.enqueue(
            JobSpec("tests.tasks.noop", queue=queue, priority=-5, max_attempts=2, **flow)
        )
        self.add_job(behind.id, queue, -5, 2, **flow)
        claimed = self.store.claim("w1", [queue], per_queue=3, lease_seconds=LEASE_SECONDS)
        self.check_claim(claimed, (queue,), 3, exact=True)
        self.take(claimed, "w1")
        if finish:
            self.store.complete_many_outcomes("w1", [(job.lease, "null") for job in claimed])
            for job in claimed:
                self.seen_status[job.id] = JobStatus.PROCESSING  # both moves in one step
                self.model.end_attempt(self.model.jobs[job.id], JobStatus.SUCCEEDED)
            return multiple()
        return multiple(*(job.lease for job in claimed))

    @precondition(lambda self: self.uncommitted)
    @rule(target=jobs, commit=st.booleans())
    def end_producer_transaction(self, commit: bool) -> Any:
        """The producer commits (its jobs join their partitions, possibly behind jobs
        that already ran, and their keys, possibly while the keys' other jobs run) or
        rolls back (no job, and no signal, is left)."""
        return multiple(*self._end_producer_transaction(commit))

    def _end_producer_transaction(self, commit: bool) -> list[int]:
        conn = self.producer.runner.connection  # type: ignore[attr-defined]
        ids = [job_id for job_id, *_ in self.uncommitted]
        signal_ids = list(self.uncommitted_signals)
        self.uncommitted_signals.clear()
        if not commit:
            conn.execute("ROLLBACK")
            self.uncommitted.clear()
            assert not self.conn.execute(
                "SELECT count(*) FROM django_pgqueue_partition_signal WHERE job_id = ANY(%s)",
                [ids],
            ).fetchone()[0]
            assert not self.conn.execute(
                "SELECT count(*) FROM django_pgqueue_concurrency_signal WHERE id = ANY(%s)",
                [signal_ids],
            ).fetchone()[0]
            assert not self.conn.execute(
                "SELECT count(*) FROM django_pgqueue_job_all WHERE id = ANY(%s)", [ids]
            ).fetchone()[0]
            return []
        conn.execute("COMMIT")
        self.checked["open transactions committed"] += 1
        keys: set[str] = set()
        for job_id, queue, priority, flow in self.uncommitted:
            self.add_job(job_id, queue, priority, 2, **flow)
            partition = flow.get("partition_key")
            key = flow.get("concurrency_key")
            if key is not None:
                keys.add(key)
                self.late_key_jobs.add(job_id)
                if self.model.in_flight(key):
                    self.checked["a late producer's key job committed while its key ran"] += 1
                continue
            overtaken = any(
                job.partition == partition and job.id > job_id and job.attempts
                for job in self.model.jobs.values()
            )
            if overtaken:
                self.checked["a late producer's job committed behind newer ones"] += 1
                self.overtaken.add(job_id)
        self.uncommitted.clear()
        lazy = self.conn.execute(
            "SELECT DISTINCT partition_key FROM django_pgqueue_partition_signal "
            "WHERE job_id = ANY(%s) AND NOT urgent",
            [ids],
        ).fetchall()
        self.lagging.update(partition for (partition,) in lazy)
        if lazy:
            self.checked["a late producer's lazy signal waited for a fold"] += 1
        lazy_keys = self.conn.execute(
            "SELECT DISTINCT concurrency_key FROM django_pgqueue_concurrency_signal "
            "WHERE id = ANY(%s) AND NOT urgent",
            [signal_ids],
        ).fetchall()
        self.lagging_keys.update(key for (key,) in lazy_keys)
        if lazy_keys:
            self.checked["a late producer's lazy key signal waited for a fold"] += 1
        # The commit started nothing: each key's row still counts exactly its running
        # jobs, which a claim adds to against its limit.
        for key in sorted(keys):
            running = self.conn.execute(
                "SELECT count(*) FROM django_pgqueue_job "
                "WHERE concurrency_key = %s AND status = 'processing'",
                [key],
            ).fetchone()[0]
            assert running == self.model.in_flight(key) <= self.model.limit_of(key)
            row = self.conn.execute(
                "SELECT in_flight FROM django_pgqueue_concurrency WHERE concurrency_key = %s",
                [key],
            ).fetchone()
            assert (0 if row is None else row[0]) == running, f"key {key}: {row}, {running} run"
        return ids

    @precondition(lambda self: self.model.jobs)
    @rule(
        target=jobs,
        blockers=st.lists(jobs, min_size=1, max_size=3),
        queue=st.sampled_from(QUEUES),
        flow=st.sampled_from(
            [
                {},
                {"partition_key": "p1"},
                {"partition_key": "p2"},
                {"concurrency_key": "k1", "concurrency_limit": 1},
            ]
        ),
        on_failure=st.sampled_from(("cancel", "cancel", "run")),
    )
    def enqueue_after(
        self, blockers: list[int], queue: str, flow: dict[str, Any], on_failure: str
    ) -> Any:
        queue = KEY_QUEUES.get(flow.get("concurrency_key", ""), queue)
        blockers = [b for b in dict.fromkeys(blockers) if b in self.model.jobs]
        if not blockers:
            return multiple()
        outcome = self.store.enqueue(
            JobSpec(
                "tests.tasks.noop",
                queue=queue,
                max_attempts=2,
                after=blockers,
                on_blocker_failure=on_failure,
                **flow,
            )
        )
        job = self.add_job(outcome.id, queue, 0, 2, **flow)
        job.after = blockers
        job.on_failure = on_failure
        job.status = JobStatus.BLOCKED
        failed = [b for b in blockers if self.model.jobs[b].status in FAILED]
        if on_failure == "cancel" and failed:
            # Cancelled at once, by (the edge to) the first failed blocker it names.
            job.status = JobStatus.CANCELLED
            job.cancelled_via = {failed[0]}
        elif all(self.model.settled_for(self.model.jobs[b], job) for b in blockers):
            job.status = JobStatus.PENDING
        assert outcome.snapshot.status == job.status
        return job.id

    # ------------------------------------------------------------------ workers
    @precondition(lambda self: any(j.status == JobStatus.PENDING for j in self.model.jobs.values()))
    @rule(
        target=leases,
        worker=st.sampled_from(WORKERS),
        queues=st.sampled_from((("default",), ("emails",), QUEUES)),
        per_queue=st.integers(1, 3),
    )
    def claim(self, worker: str, queues: tuple[str, ...], per_queue: int) -> Any:
        claimed = self.store.claim(
            worker, list(queues), per_queue=per_queue, lease_seconds=LEASE_SECONDS
        )
        self.check_claim(claimed, queues, per_queue, exact=True)
        self.take(claimed, worker)
        return multiple(*(job.lease for job in claimed))

    @precondition(lambda self: any(j.status == JobStatus.PENDING for j in self.model.jobs.values()))
    @rule(target=leases, worker=st.sampled_from(WORKERS), per_queue=st.integers(1, 3))
    def plain_round(self, worker: str, per_queue: int) -> Any:
        """A worker's round with the plain claim: only ever claimable jobs."""
        claimed = self.store.claim_round(
            worker, list(QUEUES), per_queue=per_queue, lease_seconds=LEASE_SECONDS, plain=True
        ).jobs
        self.check_claim(claimed, QUEUES, per_queue, exact=False)
        self.take(claimed, worker)
        return multiple(*(job.lease for job in claimed))

    @precondition(lambda self: any(j.status == JobStatus.PENDING for j in self.model.jobs.values()))
    @rule(
        target=leases,
        worker=st.sampled_from(WORKERS),
        per_queue=st.integers(1, 3),
        plain=st.booleans(),
    )
    def floor_round(self, worker: str, per_queue: int, plain: bool) -> Any:
        """A worker's round from its claim floors (worker/cursor.py): its plain jobs are
        the best claimable ones after the floor, and never one before it; jobs before it
        stay for a claim from the head (every other rule, and the drain, claim so).
        Partitions and keys are claimed from floors of their own, at the same time: what
        they take sorts after them, and keeps every turn and limit."""
        rows = self.db_rows()
        available = {job_id: row["available_at"] for job_id, row in rows.items()}
        floors = [self.floors.get((worker, queue)) for queue in QUEUES]
        flow_floors = {
            kind: [self.flow_floors.get((kind, worker, queue)) for queue in QUEUES]
            for kind in ("partition", "key")
        }
        claimed = self.store.claim_round(
            worker,
            list(QUEUES),
            per_queue=per_queue,
            lease_seconds=LEASE_SECONDS,
            plain=plain,
            floors=floors,
            partition_floors=flow_floors["partition"],
            key_floors=flow_floors["key"],
        ).jobs
        self.check_claim(claimed, QUEUES, per_queue, exact=False)
        for job in claimed:
            if job.partition_key is None and job.concurrency_key is None:
                continue
            kind = "partition" if job.partition_key is not None else "key"
            floor = flow_floors[kind][QUEUES.index(job.queue)]
            assert floor is None or ClaimFloor.after(job).sort_key() > floor.sort_key(), (
                f"{kind} job {job.id} claimed before its floor {floor}"
            )
            if floor is not None:
                self.checked["partitions and keys from floors sorted after them"] += 1
        for queue, floor in zip(QUEUES, floors, strict=True):
            after = [
                job
                for job in self.model.claimable(queue, available)
                if job.partition is None
                and job.key is None
                and (floor is None or claim_order(job, available) > floor.sort_key())
            ]
            took = [
                job.id
                for job in sorted(
                    claimed, key=lambda job: claim_order(self.model.jobs[job.id], available)
                )
                if job.queue == queue and job.partition_key is None and job.concurrency_key is None
            ]
            assert took == [job.id for job in after[: len(took)]], (
                f"floor {floor} of {queue!r}: took {took}, the best after it were "
                f"{[job.id for job in after]}"
            )
            assert len([job for job in claimed if job.queue == queue]) >= min(
                per_queue, len(after)
            ), f"floor {floor} of {queue!r}: took {took} with {[j.id for j in after]} ready"
        self.take(claimed, worker)
        self.checked["floor rounds took the best jobs after their floors"] += 1
        return multiple(*(job.lease for job in claimed))

    @precondition(lambda self: any(j.status == JobStatus.PENDING for j in self.model.jobs.values()))
    @rule(
        target=leases,
        worker=st.sampled_from(WORKERS),
        queue=st.sampled_from(QUEUES),
        limit=st.integers(1, 4),
        from_floor=st.booleans(),
    )
    def batch_mates(self, worker: str, queue: str, limit: int, from_floor: bool) -> Any:
        """A worker gathering a batch claims more jobs of the task: plain ready jobs
        only, never from a paused queue, the best ones in claim order (after the
        worker's floor of the queue, while it claims from floors; never one before it),
        as many as asked if there are that many. Each is then completed, failed,
        snoozed, given back or lost by the lease rules like any other (a job of a batch
        is retried alone)."""
        rows = self.db_rows()
        available = {job_id: row["available_at"] for job_id, row in rows.items()}
        floor = self.floors.get((worker, queue)) if from_floor else None
        plain = [
            job
            for job in self.model.claimable(queue, available)
            if job.partition is None
            and job.key is None
            and (floor is None or claim_order(job, available) > floor.sort_key())
        ]
        claimed = self.store.claim_batch_mates(
            worker,
            queue=queue,
            task_path="tests.tasks.noop",
            limit=limit,
            lease_seconds=LEASE_SECONDS,
            floor=floor,
        )
        expected = {job.id for job in plain[:limit]}
        assert {job.id for job in claimed} == expected, (
            f"mates {[job.id for job in claimed]} of {queue!r} from floor {floor}, "
            f"expected {sorted(expected)}"
        )
        self.take(claimed, worker)
        if floor is None:
            self.checked["batch mates were the best plain jobs"] += 1
        else:
            self.checked["batch mates from a floor were the best after it"] += 1
        return multiple(*(job.lease for job in claimed))

    @rule(per_queue=st.integers(1, 3))
    def claims_at_once(self, per_queue: int) -> None:
        """Two workers claim at the same instant on two connections: never the same job.

        Which worker gets which job (and, with SKIP LOCKED, which jobs at all) is up to
        the race, so the race runs on jobs of its own (queue "race": plain ones, a
        partition, a key with a limit of 2), which are finished and discarded after:
        the model, and what later rules draw, stay the same whoever won.
        """
        specs = [JobSpec("tests.tasks.noop", queue="race") for _ in range(3)]
        specs += [JobSpec("tests.tasks.noop", queue="race", partition_key="rp") for _ in range(3)]
        specs += [
            JobSpec("tests.tasks.noop", queue="race", concurrency_key="rk", concurrency_limit=2)
            for _ in range(3)
        ]
        ids = [outcome.id for outcome in self.store.enqueue_many(specs)]
        barrier = threading.Barrier(2)
        found: dict[str, list[Any]] = {}
        errors: list[BaseException] = []
        threads = [
            threading.Thread(
                target=_claim_at_once,
                args=(store, worker, per_queue, barrier),
                kwargs={"found": found, "errors": errors},
            )
            for store, worker in ((self.store, "w1"), (self.second, "w2"))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        first, second = found["w1"], found["w2"]
        assert not {job.id for job in first} & {job.id for job in second}
        both = first + second
        assert {job.id for job in both} <= set(ids)
        assert sum(1 for job in both if job.partition_key == "rp") <= 1
        assert sum(1 for job in both if job.concurrency_key == "rk") <= 2
        assert len(first) <= per_queue
        assert len(second) <= per_queue
        for worker, claimed in (("w1", first), ("w2", second)):
            self.store.complete_many_if_leased(worker, [(job.lease, "null") for job in claimed])
        self.store.cancel(ids)
        assert set(self.store.discard(ids).done) == set(ids)
        self.checked["claims at once never overlapped"] += 1

    @rule(lease=leases, batched=st.booleans())
    def complete(self, lease: Lease, batched: bool) -> None:
        # A lease that ran out but was not reaped yet is still held: writes are fenced by
        # lease generation and worker, not by the clock.
        if not self.is_current(lease):
            job = self.model.jobs.get(lease.job_id)
            if job is None:
                return
            if batched:
                before = self.db_rows()
                done = self.store.complete_many_outcomes(lease.worker_id, [(lease, '"stale"')])
                # Sent again after its answer was lost: done, as that first write left it.
                resent = job.finished_under == lease and job.status in (
                    JobStatus.SUCCEEDED,
                    JobStatus.CANCELLED,
                )
                assert set(done) == ({lease.job_id} if resent else set())
                assert self.db_rows() == before
            else:
                self.expect_lease_lost(
                    lease, lambda: self.store.complete_if_leased(lease, '"stale"')
                )
            return
        job = self.model.jobs[lease.job_id]
        if batched:
            done = self.store.complete_many_outcomes(lease.worker_id, [(lease, "1")])
            expected = JobStatus.CANCELLED if job.cancel_requested else JobStatus.SUCCEEDED
            assert done == {lease.job_id: expected}
        elif job.cancel_requested:
            # An atomic task's completion is refused (its writes roll back); the worker
            # then records the cancel as a failure of the attempt.
            with pytest.raises(LeaseLost):
                self.store.complete_if_leased(lease, "1")
            self.store.fail_if_leased(
                lease, Failure("JobCancelled", "stopped", permanent=True), POLICY
            )
        else:
            self.store.complete_if_leased(lease, "1")
        job.finished_under = lease
        self.model.end_attempt(job, JobStatus.SUCCEEDED)

    @rule(lease=leases, permanent=st.booleans())
    def fail(self, lease: Lease, permanent: bool) -> None:
        failure = Failure("ValueError", "boom", permanent=permanent)
        if not self.is_current(lease):
            if lease.job_id in self.model.jobs:
                self.expect_lease_lost(
                    lease, lambda: self.store.fail_if_leased(lease, failure, POLICY)
                )
            return
        outcome = self.store.fail_if_leased(lease, failure, POLICY)
        job = self.model.jobs[lease.job_id]
        if job.cancel_requested:
            job.finished_under = lease  # ended cancelled under it, like a completion
        if permanent or job.attempts >= job.max_attempts:
            self.model.end_attempt(job, JobStatus.DEAD_LETTER)
        else:
            self.model.end_attempt(job, JobStatus.PENDING, ready_at=self.now + BACKOFF)
        assert outcome.status == job.status, f"job {job.id}: fail gave {outcome}, model {job}"

    @rule(lease=leases)
    def time_out(self, lease: Lease) -> None:
        """The handler runs past its timeout: it keeps its lease until it returns."""
        if self.is_current(lease):
            self.model.jobs[lease.job_id].overdue = True
            self.checked["overdue handler kept its lease"] += 1

    @rule(lease=leases, batched=st.booleans())
    def extend(self, lease: Lease, batched: bool) -> None:
        if not self.is_current(lease):
            if batched and lease.job_id in self.model.jobs:
                before = self.db_rows()
                extension = self.store.extend_leases_if_leased(lease.worker_id, [lease], 300)
                assert extension.held == set()
                assert extension.busy == set()
                assert self.db_rows() == before
            elif lease.job_id in self.model.jobs:
                self.expect_lease_lost(
                    lease, lambda: self.store.extend_lease_if_leased(lease, LEASE_SECONDS)
                )
            return
        mine = [
            job.lease
            for job in self.model.running()
            if job.lease is not None and job.lease.worker_id == lease.worker_id
        ]
        extension = self.store.extend_leases_if_leased(lease.worker_id, mine, LEASE_SECONDS)
        assert extension.held_ids == {other.job_id for other in mine}
        # A cancel whose notice the worker missed is read here.
        assert {job_id for job_id, _ in extension.cancelling} == {
            other.job_id for other in mine if self.model.jobs[other.job_id].cancel_requested
        }
        for other in mine:
            self.model.jobs[other.job_id].lease_expires = self.now + LEASE_SECONDS

    @rule(lease=leases, delay=st.sampled_from((0, 100)))
    def release(self, lease: Lease, delay: int) -> None:
        if not self.is_current(lease):
            if lease.job_id in self.model.jobs:
                self.expect_lease_lost(
                    lease, lambda: self.store.release_if_leased(lease, delay_seconds=delay)
                )
            return
        self.store.release_if_leased(lease, delay_seconds=delay)
        job = self.model.jobs[lease.job_id]
        job.attempts -= 1
        self.model.end_attempt(job, JobStatus.PENDING, ready_at=self.now + delay)

    @rule(lease=leases, delay=st.sampled_from((0, 100)), cap=st.sampled_from((0, 1, 3)))
    def snooze(self, lease: Lease, delay: int, cap: int) -> None:
        """The handler raised Snooze: back without using an attempt, up to its task's cap.

        The cap is drawn per snooze (a deploy may change a task's ``max_snoozes``).
        """
        if not self.is_current(lease):
            if lease.job_id in self.model.jobs:
                self.expect_lease_lost(
                    lease,
                    lambda: self.store.snooze_if_leased(
                        lease, delay_seconds=delay, max_snoozes=cap
                    ),
                )
            return
        snoozed = self.store.snooze_if_leased(lease, delay_seconds=delay, max_snoozes=cap)
        job = self.model.jobs[lease.job_id]
        if job.cancel_requested:
            job.finished_under = lease
            self.model.end_attempt(job, JobStatus.CANCELLED)
        elif job.snoozes >= cap:
            self.checked["snooze over its cap dead-lettered"] += 1
            self.model.end_attempt(job, JobStatus.DEAD_LETTER)
        else:
            job.attempts -= 1
            job.snoozes += 1
            self.checked["snoozed"] += 1
            self.model.end_attempt(job, JobStatus.PENDING, ready_at=self.now + delay)
        assert snoozed.status == job.status, f"job {job.id}: snooze gave {snoozed}, model {job}"

    @precondition(lambda self: self.model.running())
    @rule(worker=st.sampled_from(WORKERS))
    def hand_back(self, worker: str) -> None:
        """Adaptive prefetch hands back the jobs a worker held but did not start."""
        mine = [job for job in self.model.running() if job.lease and job.lease.worker_id == worker]
        released = self.store.release_many_if_leased(
            worker, [job.lease for job in mine if job.lease]
        )
        assert released == {job.id for job in mine}
        for job in mine:
            job.attempts -= 1
            self.model.end_attempt(job, JobStatus.PENDING)

    @precondition(lambda self: self.model.running())
    @rule()
    def reap(self) -> None:
        expired = {
            job.id
            for job in self.model.running()
            if job.lease_expires is not None and job.lease_expires < self.now
        }
        reaped = self.store.reap_expired(policy=POLICY)
        assert {r.job_id for r in reaped} == expired
        for job_id in sorted(expired):
            job = self.model.jobs[job_id]
            if job.cancel_requested:
                job.finished_under = job.lease
            if job.attempts >= job.max_attempts:
                self.model.end_attempt(job, JobStatus.DEAD_LETTER)
            else:
                self.model.end_attempt(job, JobStatus.PENDING, ready_at=self.now + BACKOFF)

    # ------------------------------------------------------------------ operators
    @rule(job_ids=st.lists(jobs, min_size=1, max_size=2), revive=st.booleans())
    def retry(self, job_ids: list[int], revive: bool) -> None:
        ids = sorted({i for i in job_ids if i in self.model.jobs})
        if not ids:
            return
        eligible = [i for i in ids if self.model.jobs[i].status in FAILED]
        outcomes = self.model.retry_outcomes(set(eligible))
        result = self.store.retry(ids, revive_dependents=revive)
        done = [i for i in eligible if outcomes[i] is not None]
        assert result.done == tuple(done), (result, outcomes)
        for job_id in done:
            job = self.model.jobs[job_id]
            job.status = outcomes[job_id]
            job.attempts = 0
            job.snoozes = 0
            job.ready_at = self.now
            job.coalesce = None
            job.cancel_requested = False
            job.finished_under = None  # the retry let go of the worker that ran it
        if revive and done:
            revived = self.model.revive(done)
            self.checked["revived dependents"] += len(revived)

    def failed_blockers(self) -> list[int]:
        return sorted(
            b
            for job in self.model.jobs.values()
            for b in job.cancelled_via
            if job.status == JobStatus.CANCELLED
            and b in self.model.jobs
            and self.model.jobs[b].status in FAILED
        )

    @precondition(lambda self: self.failed_blockers())
    @rule(pick=st.integers(0, 1000))
    def retry_failed_blocker(self, pick: int) -> None:
        """An operator retries a job whose failure cancelled others, reviving them."""
        blockers = self.failed_blockers()
        self.retry([blockers[pick % len(blockers)]], revive=True)

    @rule(job_id=jobs)
    def cancel(self, job_id: int) -> None:
        job = self.model.jobs.get(job_id)
        if job is None:
            return
        result = self.store.cancel([job_id])
        if job.status in (JobStatus.PENDING, JobStatus.BLOCKED):
            assert (result.done, result.running) == ((job_id,), ())
            job.status = JobStatus.CANCELLED
            self.model.settle(job)
        elif job.status == JobStatus.PROCESSING:
            # Asked to stop: it keeps its lease, slot and turn until its attempt ends.
            assert (result.done, result.running) == ((job_id,), (job_id,))
            job.cancel_requested = True
            self.checked["cancelled a running job"] += 1
        else:
            assert result.done == ()

    @precondition(lambda self: self.model.running())
    @rule(pick=st.integers(0, 1000))
    def cancel_running(self, pick: int) -> None:
        """An operator cancels a running job (the bundle rarely hands one to cancel)."""
        running = sorted(self.model.running(), key=lambda job: job.id)
        self.cancel(running[pick % len(running)].id)

    @rule(job_id=jobs)
    def run_now(self, job_id: int) -> None:
        job = self.model.jobs.get(job_id)
        if job is None:
            return
        result = self.store.run_now([job_id])
        if job.status == JobStatus.PENDING and job.ready_at > self.now:
            assert result.done == (job_id,)
            job.ready_at = self.now
        else:
            assert result.done == ()

    @rule(queue=st.sampled_from(QUEUES), pause=st.booleans())
    def pause_or_resume(self, queue: str, pause: bool) -> None:
        if pause:
            self.store.pause_queue(queue, paused_by="model", reason="")
            self.model.paused.add(queue)
        else:
            self.store.resume_queue(queue)
            self.model.paused.discard(queue)

    @rule()
    def move_finished(self) -> None:
        """Housekeeping moves finished jobs left in the job table (a retry brought them
        back and did not retry them) to the history."""
        self.store.move_finished(limit=1000)

    @rule()
    def prune(self) -> None:
        """Housekeeping prunes every finished job: a retention of nothing, and their
        finish times two days back (no partition left for them: the DEFAULT partitions'
        expired rows go)."""
        self.store.move_finished(limit=1000)
        self.conn.execute(
            "UPDATE django_pgqueue_job_history SET finished_at = finished_at - interval '2 days'"
        )
        self.conn.execute("UPDATE django_pgqueue_history_class SET keep_seconds = 0")
        try:
            self.store.prune_history(max_drops=100, default_limit=10_000)
        finally:
            self.conn.execute("UPDATE django_pgqueue_history_class SET keep_seconds = NULL")
        gone = [job.id for job in self.model.jobs.values() if job.status in FINISHED]
        for job_id in gone:
            del self.model.jobs[job_id]
        self.checked["pruned finished jobs"] += len(gone)
        # And forgets every coalesce key whose job no longer holds it (no recheck
        # interval): a step of this rule, not a rule of its own, so that the fixed
        # example set CI runs stays the one whose features are listed below.
        self.checked["forgot coalesce keys"] += self.store.prune_coalesce_keys(
            limit=1000, recheck_seconds=0
        )

    @rule()
    def fold_lazy_signals(self) -> None:
        self.store.fold_lazy_signals()
        self.lagging.clear()
        self.lagging_keys.clear()

    @precondition(lambda self: self.model.jobs)
    @rule(seconds=st.sampled_from((100, 200, 1000)))
    def advance_clock(self, seconds: int) -> None:
        # See the module docstring: stored times move back instead of the clock forward.
        self.conn.execute(SHIFT, {"s": seconds})
        self.model.now += seconds

    # ------------------------------------------------------------------ invariants
    @invariant()
    def each_job_is_in_one_tier(self) -> None:
        """Never in both tables; a job that can still run is in the job table."""
        live = {
            row[0]: row[1] for row in self.conn.execute("SELECT id, status FROM django_pgqueue_job")
        }
        finished = {
            row[0]: row[1]
            for row in self.conn.execute("SELECT id, status FROM django_pgqueue_job_history")
        }
        assert not set(live) & set(finished)
        assert all(JobStatus(status).is_terminal for status in finished.values())
        self.checked["jobs in the history"] = max(
            self.checked["jobs in the history"], len(finished)
        )

    @invariant()
    def database_matches_model(self) -> None:
        rows = self.db_rows()
        if TRACE:
            with open(TRACE, "a") as trace:
                trace.write(
                    repr(sorted((r["status"], r["attempts"]) for r in rows.values())) + "\n"
                )
        assert set(rows) == set(self.model.jobs)
        in_flight: Counter[str] = Counter()
        partitions: Counter[str] = Counter()
        for job_id, row in rows.items():
            model = self.model.jobs[job_id]
            status = JobStatus(row["status"])
            assert status == model.status, f"job {job_id}: db {status}, model {model}"
            previous = self.seen_status.get(job_id)
            if previous is not None and previous != status:
                assert (previous, status) in ALLOWED_MOVES, f"job {job_id}: {previous} -> {status}"
            self.seen_status[job_id] = status
            assert row["attempts"] == model.attempts
            assert row["snoozes"] == model.snoozes, f"job {job_id}: snoozes"
            if status == JobStatus.PROCESSING:
                assert row["cancel_requested"] == model.cancel_requested
                assert model.lease is not None
                assert row["lease_generation"] == model.lease.lease_generation
                assert row["claimed_by"] == model.lease.worker_id
                if row["concurrency_key"]:
                    in_flight[row["concurrency_key"]] += 1
                if row["partition_key"]:
                    partitions[row["partition_key"]] += 1
            if status == JobStatus.PENDING and model.coalesce is None:
                assert row["coalesce_key"] is None
        for key, count in in_flight.items():
            assert count <= self.model.limit_of(key), f"key {key}: {count} in flight"
        assert all(count == 1 for count in partitions.values()), partitions
        # One holder per coalesce key among pending jobs (the test runs without the
        # unique index), and the key's row names it.
        holders = Counter(
            row["coalesce_key"]
            for row in rows.values()
            if row["status"] == "pending" and row["coalesce_key"]
        )
        assert all(count == 1 for count in holders.values())
        named = dict(
            self.conn.execute("SELECT coalesce_key, job_id FROM django_pgqueue_coalesce_key")
        )
        for row in rows.values():
            if row["status"] == "pending" and row["coalesce_key"]:
                assert named.get(row["coalesce_key"]) == row["id"], row

    def teardown(self) -> None:
        """Drain: every job must be able to finish once operators stop interfering."""
        try:
            if self.uncommitted:
                self._end_producer_transaction(commit=True)
            for queue in list(self.model.paused):
                self.store.resume_queue(queue)
            self.model.paused.clear()
            # One partition or limited key finishes a job or so per round: enough rounds
            # for every job, and a round that claims nothing ends it.
            for _ in range(len(self.model.jobs) + 5):
                for job in self.model.running():
                    assert job.lease is not None
                    self.store.complete_many_outcomes(job.lease.worker_id, [(job.lease, "null")])
                    self.model.end_attempt(job, JobStatus.SUCCEEDED)
                self.store.fold_lazy_signals()
                self.lagging.clear()
                self.lagging_keys.clear()
                self.conn.execute(SHIFT, {"s": 1000})
                self.model.now += 1000
                claimed = self.store.claim(
                    "drain", list(QUEUES), per_queue=50, lease_seconds=LEASE_SECONDS
                )
                self.check_claim(claimed, QUEUES, 50, exact=True)
                self.take(claimed, "drain")
                if not claimed and not self.model.running():
                    break
            stuck = [job for job in self.model.jobs.values() if job.status not in FINISHED]
            assert not stuck, f"jobs that could not finish: {stuck}"
            rows = self.db_rows()
            assert {JobStatus(row["status"]) for row in rows.values()} <= FINISHED
        finally:
            super().teardown()


def _claim_at_once(
    store: QueueStore,
    worker: str,
    per_queue: int,
    barrier: threading.Barrier,
    *,
    found: dict[str, list[Any]],
    errors: list[BaseException],
) -> None:
    try:
        barrier.wait(10)
        found[worker] = store.claim(
            worker, ["race"], per_queue=per_queue, lease_seconds=LEASE_SECONDS
        )
    except BaseException as error:
        errors.append(error)


def test_every_feature_and_operator_action_together_matches_the_model(
    store, make_store, without_unique_indexes
):
    QueueMachine.store = store
    QueueMachine.second = make_store()
    QueueMachine.producer = make_store()
    checked: Counter[str] = Counter()

    class Recording(QueueMachine):
        def teardown(self) -> None:
            try:
                super().teardown()
            finally:  # the drain's checks count too
                checked.update(self.checked)

    run_state_machine_as_test(
        Recording,
        settings=hypothesis_settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=not os.environ.get("PGQUEUE_MODEL_EXAMPLES"),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    print(dict(checked))
    if os.environ.get("PGQUEUE_MODEL_EXAMPLES"):
        return  # a longer random run: whatever it met, it checked
    # The fixed run CI makes really met the features: each was exercised.
    for what in (
        "claim liveness and order",
        "claims at once never overlapped",
        "cancelled a running job",
        "coalesced into the pending holder",
        "forgot coalesce keys",
        "revived dependents",
        "pruned finished jobs",
        "overdue handler kept its lease",
        "snoozed",
        "snooze over its cap dead-lettered",
        "enqueued from SQL",
        "a late producer's job committed behind newer ones",
        "a late producer's job ran in its turn",
        "a late producer's key job committed while its key ran",
        "a late producer's lazy key signal waited for a fold",
        "a late producer's key job ran",
        "floor rounds took the best jobs after their floors",
        "batch mates from a floor were the best after it",
        "partitions and keys from floors sorted after them",
    ):
        assert checked[what], f"never exercised: {what}"


#: Examples of the run on a job table in segments (its own database; CI's fixed set).
SEGMENT_EXAMPLES = int(os.environ.get("PGQUEUE_MODEL_EXAMPLES", "30"))


class SegmentedMachine(QueueMachine):
    """The same machine on a job table in segments, with housekeeping's rotation as one
    more step: each attaches, switches, moves jobs out of old segments and empties them
    (a segment every job id, so that every step has something to do)."""

    @rule()
    def rotate_segments(self) -> None:
        with self.conn.transaction():
            rotation = segments.rotate(self.conn, jobs_per_segment=1, max_holding=3, lock_wait=0.05)
        assert rotation is not None
        self.checked["segments switched"] += rotation.switched_to is not None
        self.checked["switch waited for an older writer"] += rotation.waiting > 0
        self.checked["jobs moved between segments"] += rotation.moved
        self.checked["segments emptied"] += len(rotation.truncated)
        self.checked["segments dropped"] += len(rotation.dropped)


def test_every_feature_and_operator_action_on_a_job_table_in_segments(transactional_db):
    checked: Counter[str] = Counter()
    with migrated_database("model_segments") as url:
        opened = [worker_connection(url) for _ in range(4)]
        try:
            segments.enable(opened[3])
            SegmentedMachine.store = QueueStore(PsycopgRunner(opened[0], "default"))
            SegmentedMachine.second = QueueStore(PsycopgRunner(opened[1], "default"))
            SegmentedMachine.producer = QueueStore(PsycopgRunner(opened[2], "default"))

            class Recording(SegmentedMachine):
                def teardown(self) -> None:
                    try:
                        super().teardown()
                    finally:
                        checked.update(self.checked)

            run_state_machine_as_test(
                Recording,
                settings=hypothesis_settings(
                    max_examples=SEGMENT_EXAMPLES,
                    stateful_step_count=STEPS,
                    deadline=None,
                    derandomize=not os.environ.get("PGQUEUE_MODEL_EXAMPLES"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                ),
            )
        finally:
            for conn in opened:
                conn.close()
    print(dict(checked))
    if os.environ.get("PGQUEUE_MODEL_EXAMPLES"):
        return
    for what in (
        "claim liveness and order",
        "segments switched",
        "switch waited for an older writer",
        "jobs moved between segments",
        "segments emptied",
        "segments dropped",
    ):
        assert checked[what], f"never exercised: {what}"
