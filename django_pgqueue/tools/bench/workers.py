"""The benchmark's worker processes: ``runqueueworker`` itself, forked with the run's settings."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.process import BaseProcess
from typing import Any

from django.conf import settings
from django.core.management import ManagementUtility
from django.db import connections
from django.test.utils import override_settings

from django_pgqueue.compat import task_backends
from django_pgqueue.tasks.backend import resolve_task
from django_pgqueue.tools.bench.config import BENCH_BACKEND, BenchConfig, worker_command
from django_pgqueue.tools.bench.tasks import BenchmarkError
from django_pgqueue.worker.options import WorkerOptions


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


def fork_workers(config: BenchConfig, processes: int, *, burst: bool) -> list[BaseProcess]:
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


def run_workers(config: BenchConfig, *, burst: bool) -> None:
    children = fork_workers(config, config.processes, burst=burst)
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise BenchmarkError(f"a benchmark worker exited with {child.exitcode}")


def stop(children: Sequence[BaseProcess]) -> None:
    for child in children:
        if child.pid is not None and child.is_alive():
            os.kill(child.pid, signal.SIGTERM)
    for child in children:
        child.join(30)


def wait_registered(conn: Any, config: BenchConfig, count: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = scalar(
            conn,
            "SELECT count(*) FROM django_pgqueue_worker WHERE status = 'alive' AND queues ? %s",
            [config.queue],
        )
        listening = scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            ["pgqueue listener %"],
        )
        if alive >= count and listening >= count:
            return
        time.sleep(0.05)
    raise BenchmarkError("benchmark workers did not start")


def scalar(conn: Any, query: str, params: Sequence[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]
