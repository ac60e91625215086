"""The benchmark behind ``manage.py queuebench``: measure a queue on your own database.

Every phase uses the real code paths: ``task.enqueue()`` and ``enqueue_many`` through
the Django backend, and worker processes that run the ``runqueueworker`` command itself,
from its command line (argument parsing, checks, logging at the benchmark's verbosity,
default 1 as for ``runqueueworker``), with the settings ``runqueueworker`` would use
unless told otherwise. Benchmark jobs live in their own queue (``queuebench`` unless
told otherwise), served through a ``TASKS`` entry the worker processes add for it, and
are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.process import BaseProcess
from typing import Any

from django.conf import settings
from django.core.management import ManagementUtility
from django.db import connections, transaction
from django.test.utils import override_settings

from .backend import PgQueueBackend, resolve_task
from .compat import InvalidTask, Task, task_backends
from .conf import conf
from .decorators import task as pgqueue_task
from .exceptions import InvalidArguments
from .manager import QueueStore
from .payload import encode_arguments
from .pgconn import connect
from .runners import PsycopgRunner
from .values import JobSpec
from .worker.options import WorkerOptions

__all__ = [
    "BenchConfig",
    "BenchReport",
    "BenchmarkError",
    "bench_task",
    "latency_probe",
    "noop",
    "run_benchmark",
]

BENCH_QUEUE = "queuebench"
NOOP_PATH = "django_pgqueue.bench.noop"
IO_SYNC_PATH = "django_pgqueue.bench.io_sync"
IO_ASYNC_PATH = "django_pgqueue.bench.io_async"
#: How long each I/O-bound benchmark job waits.
IO_SECONDS = 0.005
#: The tuned profile: one thread per process and large batches, for no-op jobs.
TUNED = {"concurrency": 1, "batch_size": 500, "prefetch": 500}
_PREFILL_SQL = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, available_at, created_at, started_at, finished_at,
    errors, result
)
SELECT %(queue)s, 'django_pgqueue.bench.noop', '[]', '{}', 0, 'succeeded', 1, 1, 1, 'prefill',
    now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
    now() - interval '1 hour', '[]', 'null'
FROM generate_series(1, %(rows)s)
"""


class BenchmarkError(RuntimeError):
    """A benchmark run could not produce its figures (jobs failed, workers died...)."""


def _bench_task(func: Callable[..., Any]) -> Task:  # type: ignore[type-arg]
    backend = task_backends["default"]
    queue = (
        "default"
        if "default" in backend.queues or not backend.queues
        else sorted(backend.queues)[0]
    )
    return pgqueue_task(queue_name=queue, max_attempts=1)(func)


def bench_task(task_path: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Task:  # type: ignore[type-arg]
    """Return the task ``queuebench --task`` names, checked before anything is written.

    Raises :class:`UnknownTask` if the path is not a task, ``InvalidTask`` if the task's
    backend is not a ``PgQueueBackend``, and :class:`InvalidArguments` if the arguments
    are not plain JSON or do not fit the task's signature.
    """
    task = resolve_task(task_path)
    if not isinstance(task_backends[task.backend], PgQueueBackend):
        raise InvalidTask(f"{task_path} runs on TASKS[{task.backend!r}], not a PgQueueBackend")
    encode_arguments(args, kwargs, limit=conf.MAX_PAYLOAD_BYTES)
    leading = (None,) if task.takes_context else ()
    try:
        inspect.signature(task.func).bind(*leading, *args, **kwargs)
    except TypeError as mismatch:
        raise InvalidArguments(
            "args", f"do not match {task_path}{inspect.signature(task.func)}: {mismatch}"
        ) from mismatch
    return task


# The benchmark tasks are decorated in place: a task's path is its function's, and
# workers import the task by that path.
@_bench_task
def noop() -> None:
    """Do nothing: measures the queue, not the work."""


@_bench_task
def latency_probe() -> float:
    """Return the wall-clock time at which the handler started, for wake-up latency."""
    return time.time()


@_bench_task
def io_sync() -> None:
    """Wait 5 ms in a blocking call: an I/O-bound sync task (an HTTP call, say)."""
    time.sleep(IO_SECONDS)


@_bench_task
async def io_async() -> None:
    """Wait 5 ms on the event loop: an I/O-bound coroutine task."""
    await asyncio.sleep(IO_SECONDS)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure and with which worker settings."""

    jobs: int = 20_000
    processes: int = 2
    #: Worker settings; None takes what ``runqueueworker`` would run with (PGQUEUE_*
    #: settings, else the defaults), resolved in :func:`run_benchmark`.
    concurrency: int | None = None
    batch_size: int | None = None
    prefetch: int | None = None
    prefetch_window: float | None = None
    repeat: int = 3
    prefill: int = 0
    single_enqueues: int = 2_000
    #: Rows each raw-SQL ceiling claims (see :func:`_ceilings`); 0 skips them.
    ceiling_jobs: int = 20_000
    latency_jobs: int = 200
    latency_rate: float = 20.0
    memory_jobs: int = 0
    #: I/O-bound runs (one worker process each): this many jobs that sleep 5 ms, sync
    #: at the worker's concurrency and async at ``io_concurrency``; 0 skips them.
    io_jobs: int = 0
    io_concurrency: int = 500
    queue: str = BENCH_QUEUE
    #: The task every benchmark job runs (checked with :func:`bench_task`), and its
    #: arguments; it runs in the benchmark queue, whatever its own queue is.
    task_path: str = NOOP_PATH
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    database: str = "default"
    keep: bool = False
    #: The worker processes' ``--verbosity``: what they log (1, runqueueworker's default).
    verbosity: int = 1


@dataclass
class BenchReport:
    """The figures of one benchmark run."""

    config: dict[str, Any]
    server_version: str = ""
    #: Django's DEBUG in the benchmarking process: with it on, every enqueue's query is
    #: also recorded in ``connection.queries``, which production does not pay for.
    django_debug: bool = False
    single_enqueue_per_second: float = 0.0
    single_enqueue_atomic_per_second: float = 0.0
    #: The same connection committing one plain INSERT per transaction: the floor set
    #: by the server's commit latency, which no enqueue can beat.
    single_insert_floor_per_second: float = 0.0
    #: What the server allows on this table, one connection, no Python in between:
    #: keyed "claim_10", "claim_100" and "claim_complete_100" (see :func:`_ceilings`).
    ceilings_per_second: dict[str, float] = field(default_factory=dict)
    bulk_enqueue_per_second: list[float] = field(default_factory=list)
    drain_per_second: list[float] = field(default_factory=list)
    drain_wall_seconds: list[float] = field(default_factory=list)
    latency_ms: dict[str, float] = field(default_factory=dict)
    memory_rss_mb: dict[str, float] = field(default_factory=dict)
    #: Jobs per second of the I/O-bound runs, keyed "sync" and "async".
    io_per_second: dict[str, float] = field(default_factory=dict)

    @property
    def drain_median(self) -> float:
        """Return the median drain throughput in jobs per second."""
        return statistics.median(self.drain_per_second) if self.drain_per_second else 0.0

    @property
    def bulk_median(self) -> float:
        """Return the median bulk-enqueue rate in jobs per second."""
        return (
            statistics.median(self.bulk_enqueue_per_second) if self.bulk_enqueue_per_second else 0.0
        )

    def as_json(self) -> str:
        """Return the report as JSON."""
        data = asdict(self)
        data["drain_median_per_second"] = self.drain_median
        data["bulk_enqueue_median_per_second"] = self.bulk_median
        return json.dumps(data, indent=2)

    def as_text(self) -> str:
        """Return the report as an aligned table."""
        c = self.config
        lines = [
            f"queuebench on {self.server_version}",
            f"  {c['jobs']} jobs x {c['repeat']} runs; {c['processes']} processes x "
            f"concurrency {c['concurrency']}, batch {c['batch_size']}, prefetch {c['prefetch']}, "
            f"prefetch window {c['prefetch_window']:g}s; "
            f"{c['prefill']} finished jobs already in the table",
            f"  workers: {' '.join(worker_command(BenchConfig(**c), burst=True))}"
            f" (verbosity {c['verbosity']}: their logging is runqueueworker's)",
            "  Django DEBUG is on: enqueues also record their queries, as production does not"
            if self.django_debug
            else "  Django DEBUG is off",
            f"  task: {c['task_path']}"
            + (
                f" with args {c['args']!r} kwargs {c['kwargs']!r}"
                if c["args"] or c["kwargs"]
                else ""
            ),
            f"  single enqueue (autocommit):       {self.single_enqueue_per_second:>10,.0f} jobs/s",
            f"  single enqueue (in atomic()):      "
            f"{self.single_enqueue_atomic_per_second:>10,.0f} jobs/s",
            f"  plain INSERT + COMMIT (the floor): "
            f"{self.single_insert_floor_per_second:>10,.0f} rows/s",
            f"  bulk enqueue (enqueue_many, 1,000 per call): {self.bulk_median:>10,.0f} jobs/s  "
            f"(runs: {', '.join(f'{v:,.0f}' for v in self.bulk_enqueue_per_second)})",
            f"  drain:                             {self.drain_median:>10,.0f} jobs/s  "
            f"(runs: {', '.join(f'{v:,.0f}' for v in self.drain_per_second)})",
        ]
        if self.ceilings_per_second:
            ceiling = self.ceilings_per_second
            lines.append(
                f"  raw SQL ceilings, one connection: claim 10 per statement "
                f"{ceiling['claim_10']:,.0f}, claim 100 {ceiling['claim_100']:,.0f}, "
                f"claim + fenced completion 100 {ceiling['claim_complete_100']:,.0f} jobs/s "
                f"(drain = {self.drain_median / ceiling['claim_complete_100']:.2f} of the last)"
            )
        if self.latency_ms:
            lat = self.latency_ms
            lines.append(
                f"  wake-up latency at {c['latency_rate']:g} jobs/s: p50 {lat['p50']:.1f} ms, "
                f"p90 {lat['p90']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms "
                f"({int(lat['samples'])} jobs)"
            )
        if self.io_per_second:
            io = self.io_per_second
            ideal = c["concurrency"] / IO_SECONDS
            lines.append(
                f"  I/O-bound, 1 process, {c['io_jobs']:,} jobs of {IO_SECONDS * 1000:g} ms: "
                f"sync {io['sync']:,.0f} jobs/s at concurrency {c['concurrency']} "
                f"({io['sync'] / ideal:.0%} of the {ideal:,.0f} it allows), "
                f"async {io['async']:,.0f} jobs/s at concurrency {c['io_concurrency']}"
            )
        if self.memory_rss_mb:
            mem = self.memory_rss_mb
            lines.append(
                f"  worker RSS over {c['memory_jobs']:,} jobs: {mem['first']:.1f} MB after 10%, "
                f"{mem['last']:.1f} MB at the end ({mem['growth_percent']:+.1f}%)"
            )
        return "\n".join(lines)


def run_benchmark(
    config: BenchConfig, *, progress: Callable[[str], None] = lambda _: None
) -> BenchReport:
    """Run every phase of the benchmark and return the figures."""
    config = resolve_settings(config)
    report = BenchReport(config=asdict(config), django_debug=bool(settings.DEBUG))
    conn = connect(config.database, prepare=False, application_name="queuebench")
    try:
        report.server_version = str(_scalar(conn, "SHOW server_version"))
        _cleanup(conn, config)
        if config.prefill:
            progress(f"prefilling {config.prefill:,} finished jobs")
            conn.execute(_PREFILL_SQL, {"queue": config.queue, "rows": config.prefill})
            conn.execute("VACUUM ANALYZE django_pgqueue_job")
        progress(f"single enqueues: {config.single_enqueues:,}")
        report.single_insert_floor_per_second = _insert_floor(config)
        report.single_enqueue_per_second = _single_enqueues(config, atomic=False)
        report.single_enqueue_atomic_per_second = _single_enqueues(config, atomic=True)
        _delete_pending(conn, config)
        if config.ceiling_jobs:
            progress(f"raw SQL ceilings: {config.ceiling_jobs:,} rows each")
            report.ceilings_per_second = _ceilings(config)
        for run in range(config.repeat):
            progress(f"run {run + 1}/{config.repeat}: enqueue {config.jobs:,} jobs")
            first_id, rate = _bulk_enqueue(config, config.jobs)
            report.bulk_enqueue_per_second.append(rate)
            conn.execute("VACUUM ANALYZE django_pgqueue_job")
            progress(f"run {run + 1}/{config.repeat}: drain with {config.processes} processes")
            started = time.monotonic()
            _run_workers(config, burst=True)
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
                _run_workers(io_config, burst=True)
                report.io_per_second[kind] = _drain_rate(conn, io_config, first_id)
        if config.memory_jobs:
            progress(f"memory: one worker through {config.memory_jobs:,} jobs")
            report.memory_rss_mb = _memory(config)
    finally:
        if not config.keep:
            _cleanup(conn, config)
        conn.close()
    return report


# ---------------------------------------------------------------------- phases
def _scalar(conn: Any, query: str, params: Sequence[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def _cleanup(conn: Any, config: BenchConfig) -> None:
    conn.execute("DELETE FROM django_pgqueue_job WHERE queue = %s", [config.queue])
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


def _insert_floor(config: BenchConfig) -> float:
    """Return single-row INSERTs per second, autocommit, on the Django connection."""
    if not config.single_enqueues:
        return 0.0
    with connections[config.database].cursor() as cursor:
        started = time.perf_counter()
        for _ in range(config.single_enqueues):
            cursor.execute(_FLOOR_INSERT, [config.queue])
        elapsed = time.perf_counter() - started
        cursor.execute(
            "DELETE FROM django_pgqueue_job WHERE queue = %s AND task_path = 'floor'",
            [config.queue],
        )
    return config.single_enqueues / elapsed


_FLOOR_INSERT = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors
)
VALUES (%s, 'floor', '[]', '{}', 0, 'pending', 0, 1, 0, now(), now(), '[]')
"""


#: The raw-SQL ceilings' rows: enough for the claim's index, nothing a worker would run.
_CEILING_FILL = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors
)
SELECT %(queue)s, 'ceiling', '[]', '{}', 0, 'pending', 0, 1, 0, now(), now(), '[]'
FROM generate_series(1, %(rows)s)
"""

#: The claim reduced to what no claim can skip: the same index (pgq_job_claim) and
#: order, SKIP LOCKED, and the lease columns. None of claim_batch's pause, partition
#: and limit checks, and no decoding of the rows.
_CEILING_CLAIM = """
WITH picked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.status = 'pending'
      AND job.partition_key IS NULL
      AND job.concurrency_key IS NULL
      AND job.queue = %(queue)s
      AND job.available_at <= now()
    ORDER BY job.priority DESC, job.available_at, job.id
    LIMIT %(limit)s
    FOR UPDATE OF job SKIP LOCKED
)
UPDATE django_pgqueue_job AS job
SET status = 'processing',
    attempts = job.attempts + 1,
    lease_generation = job.lease_generation + 1,
    claimed_by = 'queuebench ceiling',
    claimed_at = now(),
    started_at = now(),
    lease_expires_at = now() + interval '5 minutes'
WHERE job.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING job.id, job.lease_generation
"""

#: A completion fenced per job as the worker's is (id, lease generation, holder,
#: status), without its lock ordering or its partition and limit refreshes.
_CEILING_COMPLETE = """
UPDATE django_pgqueue_job AS job
SET status = 'succeeded', result = 'null', finished_at = now(), lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[]) AS done (id, lease_generation)
WHERE job.id = done.id
  AND job.lease_generation = done.lease_generation
  AND job.claimed_by = 'queuebench ceiling'
  AND job.status = 'processing'
"""


def _ceilings(config: BenchConfig) -> dict[str, float]:
    """Return what the server allows on this table: jobs per second, one connection.

    Each ceiling claims ``config.ceiling_jobs`` fresh rows with hand-written SQL in a
    loop (10 or 100 per statement; the last one also completes each batch), so the
    drain can be read against what the same server and table allow in the same run.
    The connection prepares its statements, as a worker's does.
    """
    with connect(config.database, application_name="queuebench ceilings") as conn:
        return _ceiling_rates(conn, config)


def _ceiling_rates(conn: Any, config: BenchConfig) -> dict[str, float]:
    rates = {}
    for name, limit, complete in (
        ("claim_10", 10, False),
        ("claim_100", 100, False),
        ("claim_complete_100", 100, True),
    ):
        conn.execute(_CEILING_FILL, {"queue": config.queue, "rows": config.ceiling_jobs})
        conn.execute("VACUUM ANALYZE django_pgqueue_job")
        claimed = 0
        started = time.perf_counter()
        while rows := conn.execute(
            _CEILING_CLAIM, {"queue": config.queue, "limit": limit}
        ).fetchall():
            claimed += len(rows)
            if complete:
                conn.execute(
                    _CEILING_COMPLETE,
                    {"ids": [row[0] for row in rows], "generations": [row[1] for row in rows]},
                )
        elapsed = time.perf_counter() - started
        conn.execute(
            "DELETE FROM django_pgqueue_job WHERE queue = %s AND task_path = 'ceiling'",
            [config.queue],
        )
        if claimed != config.ceiling_jobs:
            raise BenchmarkError(
                f"the {name} ceiling claimed {claimed} of {config.ceiling_jobs} rows"
            )
        rates[name] = claimed / elapsed
    return rates


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
        "FROM django_pgqueue_job WHERE queue = %s AND id >= %s AND status = 'succeeded'",
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


def resolve_settings(config: BenchConfig) -> BenchConfig:
    """Fill the worker settings left unset with what ``runqueueworker`` would use."""
    options = WorkerOptions.from_settings(
        concurrency=config.concurrency,
        batch_size=config.batch_size,
        prefetch=config.prefetch,
        prefetch_window=config.prefetch_window,
    )
    return replace(
        config,
        concurrency=options.concurrency,
        batch_size=options.batch_size,
        prefetch=options.prefetch,
        prefetch_window=options.prefetch_window,
    )


#: The TASKS alias the worker processes add for the benchmark queue.
BENCH_BACKEND = "queuebench"


def worker_command(config: BenchConfig, *, burst: bool) -> list[str]:
    """Return the ``runqueueworker`` command line of a benchmark worker process.

    Only what the benchmark must set (its backend and queue, ``--burst`` to end a
    drain) and what it was told (the worker options given on its command line, and the
    verbosity); everything else is ``runqueueworker``'s own default or setting.
    """
    argv = ["runqueueworker", "--backend", BENCH_BACKEND, "--queue", config.queue]
    for flag, value in (
        ("--concurrency", config.concurrency),
        ("--batch-size", config.batch_size),
        ("--prefetch", config.prefetch),
        ("--prefetch-window", config.prefetch_window),
    ):
        if value is not None:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if burst:
        argv.append("--burst")
    argv += ["--verbosity", str(config.verbosity)]
    return argv


def _bench_tasks_setting(config: BenchConfig) -> dict[str, Any]:
    """Return ``TASKS`` with an entry serving the benchmark queue (see ``_bench_backend``)."""
    resolved = resolve_task(config.task_path)
    configured = task_backends[resolved.backend]
    entry = {
        **settings.TASKS[resolved.backend],
        "QUEUES": [config.queue],
        "OPTIONS": {**configured.options, "DATABASE": config.database},
    }
    return {**settings.TASKS, BENCH_BACKEND: entry}


def _child(argv: list[str], tasks: dict[str, Any]) -> None:
    """Run ``manage.py runqueueworker`` from its command line in this (forked) process."""
    code = 0
    try:
        with override_settings(TASKS=tasks):
            ManagementUtility(["manage.py", *argv]).execute()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    os._exit(code)


def _fork_workers(config: BenchConfig, processes: int, *, burst: bool) -> list[BaseProcess]:
    argv = worker_command(config, burst=burst)
    tasks = _bench_tasks_setting(config)
    connections.close_all()
    context = multiprocessing.get_context("fork")
    children: list[BaseProcess] = [
        context.Process(target=_child, args=(argv, tasks)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    return children


def _run_workers(config: BenchConfig, *, burst: bool) -> None:
    children = _fork_workers(config, config.processes, burst=burst)
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise BenchmarkError(f"a benchmark worker exited with {child.exitcode}")


def _stop(children: Sequence[BaseProcess]) -> None:
    for child in children:
        if child.pid is not None and child.is_alive():
            os.kill(child.pid, signal.SIGTERM)
    for child in children:
        child.join(30)


def _wait_registered(conn: Any, config: BenchConfig, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = _scalar(
            conn,
            "SELECT count(*) FROM django_pgqueue_worker WHERE status = 'alive' AND queues ? %s",
            [config.queue],
        )
        listening = _scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            ["pgqueue listener %"],
        )
        if alive >= count and listening >= count:
            return
        time.sleep(0.05)
    raise BenchmarkError("benchmark workers did not start")


def _latency(config: BenchConfig) -> dict[str, float]:
    latency_config = replace(
        config, task_path="django_pgqueue.bench.latency_probe", args=(), kwargs={}
    )
    children = _fork_workers(latency_config, 1, burst=False)
    conn = connect(config.database, prepare=False)
    store = QueueStore(PsycopgRunner(conn, config.database))
    committed: dict[int, float] = {}
    try:
        _wait_registered(conn, config, 1)
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
            done = _scalar(
                conn,
                "SELECT count(*) FROM django_pgqueue_job "
                "WHERE id = ANY(%s) AND status = 'succeeded'",
                [list(committed)],
            )
            if done == len(committed):
                break
            time.sleep(0.05)
        rows = conn.execute(
            "SELECT id, result FROM django_pgqueue_job WHERE id = ANY(%s) AND status = 'succeeded'",
            [list(committed)],
        ).fetchall()
    finally:
        _stop(children)
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
    children = _fork_workers(config, 1, burst=True)
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
            remaining = _scalar(
                conn,
                "SELECT count(*) FROM django_pgqueue_job WHERE queue = %s AND status = 'pending'",
                [config.queue],
            )
            samples.append((config.memory_jobs - remaining, rss))
            time.sleep(0.1)
        child.join()
    finally:
        _stop(children)
        conn.close()
    # From 10% on (imports, caches and pools are warm), until the worker stops.
    steady = [rss for done, rss in samples if done >= config.memory_jobs * 0.1]
    if len(steady) < 2:
        raise BenchmarkError("the memory run was too short to sample; use more --memory-jobs")
    first, last = steady[0], steady[-1]
    return {"first": first, "last": last, "growth_percent": (last - first) / first * 100}
