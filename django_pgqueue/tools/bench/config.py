"""What a benchmark run is told (:class:`BenchConfig`) and reports (:class:`BenchReport`)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from django_pgqueue.tools.bench.tasks import BENCH_QUEUE, IO_SECONDS, NOOP_PATH

TUNED = {"concurrency": 1, "batch_size": 500, "prefetch": 500}


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
    #: Rows each raw-SQL ceiling claims (see :func:`ceilings`); 0 skips them.
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
    #: keyed "claim_10", "claim_100" and "claim_complete_100" (see :func:`ceilings`).
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
            f"{c['prefill']} finished jobs already in the history",
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
