"""The phases of a run: enqueue, drain, wake-up latency, I/O-bound work and memory."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from django_pgqueue.compat import Task, task_backends
from django_pgqueue.store.pgconn import connect
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tasks.backend import PgQueueBackend, resolve_task
from django_pgqueue.tools.bench.ceiling import ceilings, insert_floor
from django_pgqueue.tools.bench.config import BenchConfig, BenchReport
from django_pgqueue.tools.bench.tasks import IO_ASYNC_PATH, IO_SYNC_PATH, BenchmarkError
from django_pgqueue.tools.bench.workers import (
    fork_workers,
    resolve_settings,
    run_workers,
    scalar,
    stop,
    wait_registered,
)

# Finished jobs as the workers leave them: in the history tier, today's partition of
# the succeeded class.
_PREFILL_SQL = """
INSERT INTO django_pgqueue_job_history (
    id, queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, available_at, created_at, started_at, finished_at,
    errors, result, history_class
)
SELECT nextval(pg_get_serial_sequence('django_pgqueue_job', 'id')), %(queue)s::text,
    'django_pgqueue.tools.bench.tasks.noop', '[]', '{}', 0, 'succeeded', 1, 1, 1, 'prefill',
    now() - interval '1 minute', now() - interval '1 minute', now() - interval '1 minute',
    now() - interval '1 minute', '[]', 'null',
    django_pgqueue_history_class_of('succeeded', %(queue)s::text)
FROM generate_series(1, %(rows)s)
"""


def run_benchmark(
    config: BenchConfig, *, progress: Callable[[str], None] = lambda _: None
) -> BenchReport:
    """Run every phase of the benchmark and return the figures."""
    config = resolve_settings(config)
    report = BenchReport(config=asdict(config), django_debug=bool(settings.DEBUG))
    conn = connect(config.database, prepare=False, application_name="queuebench")
    try:
        report.server_version = str(scalar(conn, "SHOW server_version"))
        _cleanup(conn, config)
        if config.prefill:
            progress(f"prefilling {config.prefill:,} finished jobs")
            conn.execute(_PREFILL_SQL, {"queue": config.queue, "rows": config.prefill})
            conn.execute("VACUUM ANALYZE django_pgqueue_job_history")
        progress(f"single enqueues: {config.single_enqueues:,}")
        report.single_insert_floor_per_second = insert_floor(config)
        report.single_enqueue_per_second = _single_enqueues(config, atomic=False)
        report.single_enqueue_atomic_per_second = _single_enqueues(config, atomic=True)
        _delete_pending(conn, config)
        if config.ceiling_jobs:
            progress(f"raw SQL ceilings: {config.ceiling_jobs:,} rows each")
            report.ceilings_per_second = ceilings(config)
        for run in range(config.repeat):
            progress(f"run {run + 1}/{config.repeat}: enqueue {config.jobs:,} jobs")
            first_id, rate = _bulk_enqueue(config, config.jobs)
            report.bulk_enqueue_per_second.append(rate)
            conn.execute("VACUUM ANALYZE django_pgqueue_job")
            progress(f"run {run + 1}/{config.repeat}: drain with {config.processes} processes")
            started = time.monotonic()
            run_workers(config, burst=True)
            report.drain_wall_seconds.append(time.monotonic() - started)
            report.drain_per_second.append(_drain_rate(conn, config, first_id))
        if config.latency_jobs:
            progress(f"wake-up latency: {config.latency_jobs} jobs at {config.latency_rate:g}/s")
            report.latency_ms = _latency(config)
        if config.io_jobs:
            for kind, path, concurrency in (
                ("sync", IO_SYNC_PATH, config.concurrency),
                ("async", IO_ASYNC_PATH, config.io_concurrency),
            ):
                progress(f"I/O-bound {kind}: {config.io_jobs:,} jobs, concurrency {concurrency}")
                io_config = replace(
                    config,
                    task_path=path,
                    args=(),
                    kwargs={},
                    jobs=config.io_jobs,
                    processes=1,
                    concurrency=concurrency,
                )
                first_id, _ = _bulk_enqueue(io_config, config.io_jobs)
                conn.execute("VACUUM ANALYZE django_pgqueue_job")
                run_workers(io_config, burst=True)
                report.io_per_second[kind] = _drain_rate(conn, io_config, first_id)
        if config.memory_jobs:
            progress(f"memory: one worker through {config.memory_jobs:,} jobs")
            report.memory_rss_mb = _memory(config)
    finally:
        if not config.keep:
            _cleanup(conn, config)
        conn.close()
    return report


def _cleanup(conn: Any, config: BenchConfig) -> None:
    conn.execute("DELETE FROM django_pgqueue_job WHERE queue = %s", [config.queue])
    conn.execute("DELETE FROM django_pgqueue_job_history WHERE queue = %s", [config.queue])
    conn.execute("DELETE FROM django_pgqueue_worker WHERE queues ? %s", [config.queue])
    conn.execute("DELETE FROM django_pgqueue_queuestat WHERE queue = %s", [config.queue])


def _delete_pending(conn: Any, config: BenchConfig) -> None:
    conn.execute(
        "DELETE FROM django_pgqueue_job WHERE queue = %s AND status = 'pending'", [config.queue]
    )


def _single_enqueues(config: BenchConfig, *, atomic: bool) -> float:
    """Return ``task.enqueue()`` calls per second, each its own transaction.

    In autocommit mode the INSERT is the transaction (one round trip); inside
    ``transaction.atomic()`` there are three (BEGIN, INSERT, COMMIT).
    """
    if not config.single_enqueues:
        return 0.0
    task = _in_queue(resolve_task(config.task_path), config.queue)
    # The backend's own enqueue path, on a copy of the task's backend that also serves
    # the benchmark queue (which the project's QUEUES does not list).
    backend = _bench_backend(config, task)
    started = time.perf_counter()
    if atomic:
        for _ in range(config.single_enqueues):
            with transaction.atomic(using=config.database):
                backend.enqueue(task, config.args, config.kwargs)
    else:
        for _ in range(config.single_enqueues):
            backend.enqueue(task, config.args, config.kwargs)
    elapsed = time.perf_counter() - started
    connections[config.database].close()
    return config.single_enqueues / elapsed


def _in_queue(bench_task: Task, queue: str) -> Task:  # type: ignore[type-arg]
    # The benchmark queue is not in QUEUES: build the task without re-validating it.
    clone = object.__new__(type(bench_task))
    for name in bench_task.__dataclass_fields__:
        object.__setattr__(clone, name, getattr(bench_task, name))
    object.__setattr__(clone, "queue_name", queue)
    return clone


def _bench_backend(config: BenchConfig, task: Task) -> PgQueueBackend:  # type: ignore[type-arg]
    """Return a copy of ``task``'s backend that also serves the benchmark queue.

    The project's QUEUES does not list the benchmark queue; everything else (database,
    options) is the configured backend's, so enqueues take the public code path.
    """
    configured = task_backends[task.backend]
    return PgQueueBackend(
        configured.alias,
        {
            "QUEUES": [*configured.queues, config.queue],
            "OPTIONS": {**configured.options, "DATABASE": config.database},
        },
    )


#: Jobs per ``enqueue_many`` call in the bulk phase: what an application batches.
BULK_CALL = 1_000


def _bulk_enqueue(config: BenchConfig, count: int) -> tuple[int, float]:
    """Enqueue ``count`` jobs through ``enqueue_many``, 1,000 per call (autocommit).

    Return the first job's id and the rate. This is the path of ``Task.enqueue_many``
    (the task's backend, its checks and its ``task_enqueued`` signal), on a backend that
    serves the benchmark queue.
    """
    task = _in_queue(resolve_task(config.task_path), config.queue)
    backend = _bench_backend(config, task)
    calls = [(config.args, config.kwargs)] * count
    first_id = None
    started = time.perf_counter()
    for start in range(0, count, BULK_CALL):
        results = backend.enqueue_many(task, calls[start : start + BULK_CALL])
        if first_id is None:
            first_id = int(results[0].id)
    elapsed = time.perf_counter() - started
    connections[config.database].close()
    assert first_id is not None
    return first_id, count / elapsed


def _drain_rate(conn: Any, config: BenchConfig, first_id: int) -> float:
    row = conn.execute(
        "SELECT count(*), extract(epoch FROM max(finished_at) - min(claimed_at)) "
        "FROM django_pgqueue_job_all WHERE queue = %s AND id >= %s AND status = 'succeeded'",
        [config.queue, first_id],
    ).fetchone()
    assert row is not None
    done, seconds = row
    if done != config.jobs:
        failed = config.jobs - done
        raise BenchmarkError(
            f"only {done} of {config.jobs} benchmark jobs succeeded ({failed} did not; "
            f"their errors are kept with --keep)"
        )
    return float(done) / max(float(seconds), 1e-6)


def _latency(config: BenchConfig) -> dict[str, float]:
    latency_config = replace(
        config, task_path="django_pgqueue.tools.bench.latency_probe", args=(), kwargs={}
    )
    children = fork_workers(latency_config, 1, burst=False)
    conn = connect(config.database, prepare=False)
    store = QueueStore(PsycopgRunner(conn, config.database))
    committed: dict[int, float] = {}
    try:
        wait_registered(conn, config, 1)
        interval = 1.0 / config.latency_rate
        next_at = time.monotonic()
        for _ in range(config.latency_jobs):
            next_at += interval
            outcome = store.enqueue(
                JobSpec(latency_config.task_path, queue=config.queue, max_attempts=1)
            )
            committed[outcome.id] = time.time()  # autocommit: visible and notified now
            time.sleep(max(0.0, next_at - time.monotonic()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = scalar(
                conn,
                "SELECT count(*) FROM django_pgqueue_job_all "
                "WHERE id = ANY(%s) AND status = 'succeeded'",
                [list(committed)],
            )
            if done == len(committed):
                break
            time.sleep(0.05)
        rows = conn.execute(
            "SELECT id, result FROM django_pgqueue_job_all "
            "WHERE id = ANY(%s) AND status = 'succeeded'",
            [list(committed)],
        ).fetchall()
    finally:
        stop(children)
        conn.close()
    samples = sorted(
        max(
            0.0,
            (float(json.loads(result) if isinstance(result, str) else result) - committed[job_id])
            * 1000,
        )
        for job_id, result in rows
    )
    if not samples:
        raise BenchmarkError("no latency samples were collected")

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, round(p / 100 * (len(samples) - 1)))]

    return {
        "samples": float(len(samples)),
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": samples[-1],
    }


def _rss_mb(pid: int) -> float | None:
    """Return the resident set size of ``pid`` in MB (None once it is exiting)."""
    with open(f"/proc/{pid}/status") as status:  # Linux only, by design
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def _memory(config: BenchConfig) -> dict[str, float]:
    conn = connect(config.database, prepare=False)
    _bulk_enqueue(config, config.memory_jobs)
    conn.execute("VACUUM ANALYZE django_pgqueue_job")
    children = fork_workers(config, 1, burst=True)
    (child,) = children
    assert child.pid is not None
    samples: list[tuple[int, float]] = []
    try:
        while child.is_alive():
            try:
                rss = _rss_mb(child.pid)
            except FileNotFoundError:
                break
            if rss is None:
                break
            remaining = scalar(
                conn,
                "SELECT count(*) FROM django_pgqueue_job WHERE queue = %s AND status = 'pending'",
                [config.queue],
            )
            samples.append((config.memory_jobs - remaining, rss))
            time.sleep(0.1)
        child.join()
    finally:
        stop(children)
        conn.close()
    # From 10% on (imports, caches and pools are warm), until the worker stops.
    steady = [rss for done, rss in samples if done >= config.memory_jobs * 0.1]
    if len(steady) < 2:
        raise BenchmarkError("the memory run was too short to sample; use more --memory-jobs")
    first, last = steady[0], steady[-1]
    return {"first": first, "last": last, "growth_percent": (last - first) / first * 100}
