"""Fault-injection soak: a mixed workload over several workers while the test hurts them.

Thousands of jobs — short plain jobs, partitioned and not, mixed priorities; jobs that fail
their first attempt; sync jobs that overrun their timeout in a sleep nothing can stop;
atomic jobs that record steps and hold their transaction open for up to longer than a
lease (issue 19's shape); poison jobs whose messages or results hold NUL or lone
surrogates; jobs under concurrency and rate limits; coalesced jobs (several enqueues per
key); dependents (after= one to three jobs, chains of them, some in a partition or under
a limit, either failure policy) — run on two standalone workers and a ``--processes 2``
supervisor, while the test pauses worker processes (SIGSTOP/SIGCONT, sometimes longer
than a lease), kills them (SIGKILL), terminates their connections
(``pg_terminate_backend``), restarts the suite's own embedded PostgreSQL once, and acts
as an operator: it cancels running jobs (limited and partitioned ones first) and retries
dead letters and cancelled jobs, sometimes reviving their dependents. The tasks write an
execution ledger; at the end :mod:`tests.invariants` checks it against the job rows, the
dependencies and the record of the faults and operator actions: besides no overlap and
per-partition order, a limit is never exceeded (a cancelled handler keeps its slot until
it returns), dependents run only after their blockers finished, and nothing is stuck.

It also samples ``pg_stat_activity`` for worker connections waiting on a lock and prints the
longest wait per connection kind.

Deterministic where it can be: the workload and the fault schedule come from one seed,
printed at the start (``PGQUEUE_SOAK_SEED=<seed>`` replays them; the interleaving of
processes of course differs). ``PGQUEUE_SOAK_JOBS`` changes the job count. With
``DATABASE_URL`` set the server restart is skipped: only the suite's own embedded server is
ever restarted. ``PGQUEUE_SOAK_REPORT=<file>`` writes every violation with its ledger lines
there (the failure message shows the first few of each invariant).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from django.db import connections

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import JobSpec
from tests import invariants
from tests.database import embedded_server
from tests.faults import Database, LockWaitSampler, WorkerFleet

pytestmark = [pytest.mark.soak, pytest.mark.timeout(480)]

JOBS = int(os.environ.get("PGQUEUE_SOAK_JOBS", "3000"))
PARTITIONS = 40
LEASE_SECONDS = 2.0
# Faults stop after this long (or once nearly every job is done); the workers then get
# until DRAIN_SECONDS after the start to finish everything.
FAULT_SECONDS = 100.0
DRAIN_SECONDS = 200.0
# Once the faults ended, a soak in which no job finishes for this long is stuck: report.
STALL_SECONDS = 30.0
WORKER_ARGS = (
    "--queue",
    "default",
    "--queue",
    "emails",
    "--lease-seconds",
    str(LEASE_SECONDS),
    "--poll-interval",
    "0.2",
    "--concurrency",
    "4",
    "--prefetch",
    "2",
    "--grace-seconds",
    "5",
)
WORKER_SETTINGS = {
    "HOUSEKEEPING_INTERVAL_SECONDS": 0.3,
    "WORKER_TIMEOUT_SECONDS": 4.0,
    "RETRY_BASE_SECONDS": 0.05,
    "RETRY_MAX_SECONDS": 0.5,
    "RETRY_JITTER": 0,
}
POISON = ("nul-message", "surrogate-message", "surrogate-result", "nul-result")
#: Coalesced enqueues (a few keys, so many of them meet a pending holder) and dependents.
COALESCED = JOBS // 25
COALESCE_KEYS = 12
DEPENDENTS = JOBS // 20


def workload(rng: random.Random) -> list[tuple[str, JobSpec]]:
    """Return (kind, spec) of every job of the soak."""
    jobs = []
    for _ in range(JOBS):
        queue = rng.choice(("default", "emails"))
        priority = rng.choice((-10, 0, 0, 10))
        partition = f"p{rng.randrange(PARTITIONS)}" if rng.random() < 0.4 else None
        roll = rng.random()
        max_attempts = 5
        if roll < 0.81:
            kind, task, kwargs = (
                "plain",
                "soak_plain",
                {"seconds": rng.choice((0, 0, 0.005, 0.02))},
            )
        elif roll < 0.91:
            kind, task, kwargs = "flaky", "soak_plain", {"kind": "flaky", "fail_first": True}
        elif roll < 0.945:
            kind, task, kwargs = "overrun", "soak_overrun", {"seconds": 1.2}
        elif roll < 0.975:
            kind, task = "atomic", "soak_atomic"
            kwargs = {"hold": round(rng.uniform(0.3, 2.6), 2)}
        elif roll < 0.98:
            how = rng.choice(POISON)
            kind, task, kwargs = f"poison-{how}", "soak_poison", {"how": how}
            max_attempts = 3
        else:
            kind, task, kwargs = "plain", "soak_plain", {}
        # Flow limits (never with a partition key): a few tenants of at most 2 in flight,
        # and a rate-limited API key.
        limits: dict[str, Any] = {}
        if kind == "plain" and partition is None and rng.random() < 0.15:
            if rng.random() < 0.6:
                kind = "limited"
                limits = {"concurrency_key": f"tenant{rng.randrange(4)}", "concurrency_limit": 2}
                kwargs = {"seconds": rng.choice((0.005, 0.02, 0.1))}
            else:
                kind = "rated"
                limits = {"concurrency_key": "label-api", "rate_limit": "20/s"}
        jobs.append(
            (
                kind,
                JobSpec(
                    f"tests.tasks.{task}",
                    queue=queue,
                    priority=priority,
                    kwargs=kwargs,
                    partition_key=partition,
                    max_attempts=max_attempts,
                    **limits,
                ),
            )
        )
    return jobs


def coalesced(rng: random.Random) -> list[tuple[str, JobSpec]]:
    """Return enqueues that share a few coalesce keys (some of them in a partition)."""
    return [
        (
            "coalesced",
            JobSpec(
                "tests.tasks.soak_plain",
                queue=rng.choice(("default", "emails")),
                kwargs={"kind": "coalesced", "seconds": rng.choice((0, 0.01))},
                coalesce_key=f"doc:{rng.randrange(COALESCE_KEYS)}",
                partition_key=rng.choice((None, None, f"p{rng.randrange(PARTITIONS)}")),
            ),
        )
        for _ in range(COALESCED)
    ]


def dependent(rng: random.Random, pool: list[int]) -> tuple[str, JobSpec]:
    """Return a job after one to three jobs of ``pool`` (chains: pool grows with them)."""
    limits: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.3:
        limits = {"partition_key": f"p{rng.randrange(PARTITIONS)}"}
    elif roll < 0.45:
        limits = {"concurrency_key": f"tenant{rng.randrange(4)}", "concurrency_limit": 2}
    return (
        "dependent",
        JobSpec(
            "tests.tasks.soak_plain",
            queue=rng.choice(("default", "emails")),
            kwargs={"kind": "dependent", "seconds": rng.choice((0, 0.01, 0.05))},
            after=rng.sample(pool, rng.randint(1, 3)),
            on_blocker_failure=rng.choice(("cancel", "cancel", "run")),
            **limits,
        ),
    )


def act_as_operator(rng: random.Random, db: Database, ours: list[int], operated: set[int]) -> None:
    """Cancel a running job (a limited or partitioned one first), or retry a finished one."""
    store = QueueStore(PsycopgRunner(db.conn, "default"))
    if rng.random() < 0.5:
        rows = db.execute(
            "SELECT id FROM django_pgqueue_job_all WHERE status = 'processing' AND id = ANY(%s) "
            "ORDER BY (concurrency_key IS NULL AND partition_key IS NULL), random() LIMIT 1",
            [ours],
        )
        if rows:
            operated.update(store.cancel([rows[0][0]], reason="soak operator").done)
        return
    rows = db.execute(
        "SELECT id FROM django_pgqueue_job_all WHERE status IN ('dead_letter', 'cancelled') "
        "AND id = ANY(%s) ORDER BY random() LIMIT 1",
        [ours],
    )
    if rows:
        revive = rng.random() < 0.5
        operated.update(store.retry([rows[0][0]], revive_dependents=revive).done)


def test_execution_safety_under_injected_faults(db_url):
    seed = int(os.environ.get("PGQUEUE_SOAK_SEED") or random.SystemRandom().randrange(1_000_000))
    print(f"\nsoak seed {seed} (PGQUEUE_SOAK_SEED={seed} replays workload and fault schedule)")
    rng = random.Random(seed)
    restart_server = not os.environ.get("DATABASE_URL")
    if not restart_server:
        print(
            "soak: DATABASE_URL is set, so the PostgreSQL restart is skipped "
            "(only the suite's own embedded server is ever restarted)"
        )
    db = Database(db_url)
    jobs = workload(rng)
    numbered = list(enumerate(jobs))
    kinds = Counter(kind for kind, _ in jobs)
    print(f"soak: {len(jobs)} jobs: {dict(sorted(kinds.items()))}")
    kind_of: dict[int, str] = {}

    run_token = time.time_ns()

    def enqueue(chunk: list[tuple[int, tuple[str, JobSpec]]]) -> None:
        # Late chunks arrive while faults land: a connection cut mid-statement leaves the
        # producer not knowing whether it committed, so it retries with idempotency keys
        # (as a producer should), which return the jobs already there.
        keyed = [
            (kind, dataclasses.replace(spec, idempotency_key=f"soak:{run_token}:{index}"))
            for index, (kind, spec) in chunk
        ]
        deadline = time.monotonic() + 60
        while True:
            try:
                store = QueueStore(PsycopgRunner(db.conn, "default"))
                outcomes = store.enqueue_many(spec for _, spec in keyed)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                db.close()
                time.sleep(0.2)
        for (kind, _), outcome in zip(keyed, outcomes, strict=True):
            kind_of[outcome.id] = kind

    # Two thirds at once; the rest arrives while the workers run (wake-ups, fresh heads).
    later = [numbered[len(jobs) * 2 // 3 :][i::2] for i in range(2)]
    enqueue(numbered[: len(jobs) * 2 // 3])
    # Coalesced jobs and dependents before the faults begin: neither can carry the
    # idempotency key that makes a producer's retry after a cut connection safe.
    store = QueueStore(PsycopgRunner(db.conn, "default"))
    coalescing = coalesced(rng)
    # A third now; the rest while the workers run, so that some meet a job of their key
    # that already started (and, retried, comes back beside its twin).
    for kind, spec in coalescing[: len(coalescing) // 3]:
        kind_of[store.enqueue(spec).id] = kind
    coalescing = coalescing[len(coalescing) // 3 :]
    pool = sorted(kind_of)
    for _ in range(DEPENDENTS):
        kind, spec = dependent(rng, pool)
        job_id = store.enqueue(spec).id
        kind_of[job_id] = kind
        pool.append(job_id)
    kinds.update(kind for kind in kind_of.values() if kind in ("coalesced", "dependent"))
    made = kinds["coalesced"]
    print(f"soak: {COALESCED} coalesced enqueues made {made} jobs; {DEPENDENTS} dependents")
    operated: set[int] = set()
    next_operator = 0.0

    fleet = WorkerFleet(db_url, WORKER_ARGS, WORKER_SETTINGS, standalone=2, supervised=2)
    sampler = LockWaitSampler(db_url)
    started = time.monotonic()
    fleet.start()
    sampler.start()
    restarted = not restart_server
    next_fault = started + rng.uniform(1.0, 2.0)
    finished = 0
    progress = (0, started)
    try:
        while time.monotonic() - started < DRAIN_SECONDS:
            time.sleep(0.1)
            fleet.tick()
            elapsed = time.monotonic() - started
            if later and elapsed > 4 * (3 - len(later)):
                enqueue(later.pop(0))
            finished = db.execute(
                "SELECT count(*) FROM django_pgqueue_job_all "
                "WHERE status IN ('succeeded', 'dead_letter', 'cancelled')"
            )[0][0]
            if finished >= len(kind_of) and not later and not coalescing:
                break
            if finished != progress[0]:
                progress = (finished, time.monotonic())
            faults_on = elapsed < FAULT_SECONDS
            if not faults_on and time.monotonic() - progress[1] > STALL_SECONDS:
                print(f"soak: no job finished for {STALL_SECONDS:.0f}s after the faults ended")
                break
            if faults_on and time.monotonic() >= next_operator:
                next_operator = time.monotonic() + rng.uniform(0.15, 0.5)
                try:
                    act_as_operator(rng, db, sorted(kind_of), operated)
                    # A few coalesced enqueues (a cut connection loses at most a
                    # coalesced duplicate: the job it made still runs and is checked
                    # once found below).
                    for kind, spec in coalescing[:4]:
                        kind_of[QueueStore(PsycopgRunner(db.conn, "default")).enqueue(spec).id] = (
                            kind
                        )
                    coalescing = coalescing[4:]
                except psycopg.OperationalError:
                    db.close()  # the server restarted under it: next time
            if not faults_on or time.monotonic() < next_fault:
                continue
            next_fault = time.monotonic() + rng.uniform(0.8, 2.5)
            pids = fleet.leaves()
            if not pids:
                continue
            victim = rng.choice(sorted(pids))
            if not restarted and finished >= len(jobs) * 0.3:
                restarted = True
                mode = rng.choice(("fast", "immediate"))
                fleet.server_fault(
                    f"PostgreSQL restart ({mode})",
                    lambda mode=mode: embedded_server().restart(mode),
                )
                connections.close_all()  # Django's own connections in this process broke
                continue
            roll = rng.random()
            if roll < 0.45:
                long_pause = rng.random() < 0.4
                seconds = rng.uniform(2.5, 5.0) if long_pause else rng.uniform(0.2, 1.5)
                fleet.pause(victim, seconds)
            elif roll < 0.7:
                fleet.terminate_connections(victim, db)
            else:
                fleet.kill(victim)
        fleet.resume_all()
    finally:
        fleet.stop()
        sampler.stop()
    took = time.monotonic() - started
    # A coalesced enqueue whose answer a fault cut off still made its job: find them all.
    for (job_id,) in db.execute(
        "SELECT id FROM django_pgqueue_job_all WHERE kwargs ->> 'kind' = 'coalesced'"
    ):
        kind_of.setdefault(job_id, "coalesced")
    evidence = invariants.load_evidence(db.conn, sorted(kind_of))
    report = invariants.check(
        evidence,
        faults=fleet.faults,
        exits=fleet.exits,
        lease_seconds=LEASE_SECONDS,
        operated=operated,
    )
    statuses = Counter(job["status"] for job in evidence.jobs.values())
    by_kind: dict[str, Counter[str]] = {}
    for job_id, job in evidence.jobs.items():
        by_kind.setdefault(kind_of[job_id], Counter())[job["status"]] += 1
    print(f"soak: operator actions touched {len(operated)} jobs")
    print(
        f"soak: ran {took:.1f}s; {finished}/{len(kind_of)} jobs terminal; statuses {dict(statuses)}"
    )
    for kind, counts in sorted(by_kind.items()):
        print(f"  {kind}: {dict(counts)}")
    print(f"soak: faults injected: {dict(sorted(fleet.counts.items()))}")
    crashed = Counter(exit_.code for exit_ in fleet.exits if not exit_.injected)
    print(f"soak: worker processes that exited on their own, by exit code: {dict(crashed)}")
    print(sampler.summary())
    print(report.summary())
    if report.violations:
        # What was injected, and when: a violation is judged by the faults on its processes.
        print("soak: faults injected, by start:")
        for fault in sorted(fleet.faults, key=lambda fault: fault.start):
            pids = "the server" if fault.pids is None else ", ".join(map(str, sorted(fault.pids)))
            print(
                f"  {fault.start.isoformat(timespec='milliseconds')} -> "
                f"{fault.end.isoformat(timespec='milliseconds')} {fault.kind} ({pids})"
            )
    db.close()
    report_path = os.environ.get("PGQUEUE_SOAK_REPORT")
    if report_path:
        with open(report_path, "w") as report_file:
            report_file.write(f"seed {seed}\n{report.summary()}\n\n{report.details()}\n")
        print(f"soak: every violation with its ledger lines written to {report_path}")
    report.assert_ok()
