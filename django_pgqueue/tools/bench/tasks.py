"""The benchmark's tasks (no-op, latency probe, I/O-bound), and the check of ``--task``."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django_pgqueue.compat import InvalidTask, Task, task_backends
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import InvalidArguments
from django_pgqueue.store.payload import encode_arguments
from django_pgqueue.tasks.backend import PgQueueBackend, resolve_task
from django_pgqueue.tasks.decorators import task as pgqueue_task

BENCH_QUEUE = "queuebench"
NOOP_PATH = "django_pgqueue.tools.bench.tasks.noop"
IO_SYNC_PATH = "django_pgqueue.tools.bench.tasks.io_sync"
IO_ASYNC_PATH = "django_pgqueue.tools.bench.tasks.io_async"
#: How long each I/O-bound benchmark job waits.
IO_SECONDS = 0.005
#: The tuned profile: one thread per process and large batches, for no-op jobs.


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
