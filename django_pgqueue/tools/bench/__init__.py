"""The benchmark behind ``manage.py queuebench``: measure a queue on your own database.

Every phase uses the real code paths: ``task.enqueue()`` and ``enqueue_many`` through
the Django backend, and worker processes that run the ``runqueueworker`` command itself,
from its command line (argument parsing, checks, logging at the benchmark's verbosity,
default 1 as for ``runqueueworker``), with the settings ``runqueueworker`` would use
unless told otherwise. Benchmark jobs live in their own queue (``queuebench`` unless
told otherwise), served through a ``TASKS`` entry the worker processes add for it, and
are deleted afterwards.
"""

from django_pgqueue.tools.bench.config import (
    BENCH_BACKEND,
    TUNED,
    BenchConfig,
    BenchReport,
    worker_command,
)
from django_pgqueue.tools.bench.run import run_benchmark
from django_pgqueue.tools.bench.tasks import (
    BENCH_QUEUE,
    NOOP_PATH,
    BenchmarkError,
    bench_task,
    latency_probe,
    noop,
)
from django_pgqueue.tools.bench.workers import resolve_settings

__all__ = [
    "BENCH_BACKEND",
    "BENCH_QUEUE",
    "NOOP_PATH",
    "TUNED",
    "BenchConfig",
    "BenchReport",
    "BenchmarkError",
    "bench_task",
    "latency_probe",
    "noop",
    "resolve_settings",
    "run_benchmark",
    "worker_command",
]
