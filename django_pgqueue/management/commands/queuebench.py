"""``manage.py queuebench``: measure enqueue rate, drain throughput, latency and memory."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue.compat import InvalidTask
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.tools.bench import (
    NOOP_PATH,
    TUNED,
    BenchConfig,
    BenchmarkError,
    bench_task,
    run_benchmark,
)


class Command(BaseCommand):
    help = (
        "Benchmark django-pgqueue on this project's database: enqueue no-op jobs (or jobs of "
        "a given task), drain them with worker processes, and report throughput, enqueue "
        "rates, I/O-bound throughput and wake-up latency. The workers run the runqueueworker "
        "command, at this command's --verbosity (1, its default) and with the settings "
        "runqueueworker would use unless told otherwise. Benchmark jobs use their own queue "
        "and are deleted afterwards."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the options."""
        parser.add_argument("--jobs", type=int, default=20_000, help="Jobs per drain run (20000).")
        parser.add_argument(
            "--task",
            default=NOOP_PATH,
            help="Dotted path of the task every job runs (a no-op task by default).",
        )
        parser.add_argument(
            "--args",
            dest="task_args",
            default="[]",
            help="The task's positional arguments, a JSON list ([]).",
        )
        parser.add_argument(
            "--kwargs",
            dest="task_kwargs",
            default="{}",
            help="The task's keyword arguments, a JSON object ({}).",
        )
        parser.add_argument(
            "--repeat", type=int, default=3, help="Drain runs; the median is reported (3)."
        )
        parser.add_argument("--processes", type=int, default=2, help="Worker processes (2).")
        parser.add_argument(
            "--profile",
            choices=("defaults", "tuned"),
            default="defaults",
            help="Worker settings: 'defaults' (what runqueueworker runs with: the PGQUEUE_* "
            "settings, else the built-in defaults) or 'tuned' (for no-op jobs: concurrency "
            "1, batch 500, prefetch 500). The options below override either.",
        )
        parser.add_argument("--concurrency", type=int, help="Threads per worker.")
        parser.add_argument("--batch-size", type=int, help="Most jobs per claim.")
        parser.add_argument("--prefetch", type=int, help="Jobs held beyond free threads.")
        parser.add_argument(
            "--prefetch-window",
            type=float,
            metavar="SECONDS",
            help="Adaptive prefetch window (0 turns it off).",
        )
        parser.add_argument(
            "--prefill", type=int, default=0, help="Finished jobs inserted first (0)."
        )
        parser.add_argument(
            "--single-enqueues",
            type=int,
            default=2000,
            help="task.enqueue() calls, one transaction each (2000).",
        )
        parser.add_argument(
            "--ceiling-jobs",
            type=int,
            default=20_000,
            help="Rows each raw-SQL ceiling claims: claim 10 and 100 per statement, and "
            "claim + completion 100, one connection (20000; 0 skips).",
        )
        parser.add_argument(
            "--latency-jobs",
            type=int,
            default=200,
            help="Jobs for the latency test (200; 0 skips).",
        )
        parser.add_argument(
            "--latency-rate",
            type=float,
            default=20.0,
            help="Jobs per second in the latency test (20).",
        )
        parser.add_argument(
            "--memory-jobs", type=int, default=0, help="Jobs for the worker RSS test (0 skips)."
        )
        parser.add_argument(
            "--io-jobs",
            type=int,
            default=5000,
            help="Jobs of each I/O-bound run: tasks that wait 5 ms, sync (time.sleep, at the "
            "worker's concurrency) and async (asyncio.sleep), one process each (5000; 0 skips).",
        )
        parser.add_argument(
            "--io-concurrency",
            type=int,
            default=500,
            help="Concurrency of the async I/O-bound run (500).",
        )
        parser.add_argument(
            "--queue", default="queuebench", help="Queue the benchmark jobs use (queuebench)."
        )
        parser.add_argument("--database", default="default", help="Database alias (default).")
        parser.add_argument(
            "--keep", action="store_true", help="Keep the benchmark jobs afterwards."
        )
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the benchmark and print the report."""
        if options["profile"] == "tuned":
            for name, value in TUNED.items():
                if options[name] is None:
                    options[name] = value
        for name in ("jobs", "repeat", "processes", "concurrency", "batch_size", "io_concurrency"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1", returncode=2)
        for name in (
            "prefetch",
            "prefetch_window",
            "prefill",
            "single_enqueues",
            "ceiling_jobs",
            "latency_jobs",
            "memory_jobs",
            "io_jobs",
        ):
            if options[name] is not None and options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must be 0 or more", returncode=2)
        if options["latency_rate"] <= 0:
            raise CommandError("--latency-rate must be positive", returncode=2)
        # Django's own ``args``/``kwargs`` are the command's; ours have their own names.
        args = _json_option(options["task_args"], "--args", list)
        kwargs = _json_option(options["task_kwargs"], "--kwargs", dict)
        try:
            bench_task(options["task"], args, kwargs)
        except InvalidTask as error:  # UnknownTask and InvalidArguments included
            raise CommandError(f"--task {options['task']}: {error}", returncode=2) from error
        config = BenchConfig(
            jobs=options["jobs"],
            repeat=options["repeat"],
            processes=options["processes"],
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            prefetch=options["prefetch"],
            prefetch_window=options["prefetch_window"],
            prefill=options["prefill"],
            single_enqueues=options["single_enqueues"],
            ceiling_jobs=options["ceiling_jobs"],
            latency_jobs=options["latency_jobs"],
            latency_rate=options["latency_rate"],
            memory_jobs=options["memory_jobs"],
            io_jobs=options["io_jobs"],
            io_concurrency=options["io_concurrency"],
            queue=options["queue"],
            task_path=options["task"],
            args=tuple(args),
            kwargs=kwargs,
            database=options["database"],
            keep=options["keep"],
            verbosity=options["verbosity"],
        )
        progress = (
            (lambda message: None)
            if options["json"]
            else (lambda message: self.stderr.write(f"queuebench: {message}"))
        )
        try:
            report = run_benchmark(config, progress=progress)
        except ConfigurationError as error:
            raise CommandError(str(error), returncode=2) from error
        except BenchmarkError as error:
            raise CommandError(f"queuebench failed: {error}") from error
        self.stdout.write(report.as_json() if options["json"] else report.as_text())


def _json_option(text: str, flag: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise CommandError(f"{flag} is not valid JSON: {error}", returncode=2) from error
    if not isinstance(value, kind):
        expected = "a JSON list" if kind is list else "a JSON object"
        raise CommandError(f"{flag} must be {expected}", returncode=2)
    return value
