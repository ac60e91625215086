"""Which task a job names, resolved once per process: the task and what running it needs."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django_pgqueue.compat import Task
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import UnknownTask
from django_pgqueue.tasks.backend import PgQueueTask, resolve_task

__all__ = ["TaskEntry", "TaskResolver"]

# How long an import failure is remembered before the import is tried again.
_UNKNOWN_TASK_RETRY_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class TaskEntry:
    """A task this process can run, with what the runner needs precomputed."""

    task: Task  # type: ignore[type-arg]
    func: Callable[..., Any]
    signature: inspect.Signature
    is_async: bool
    takes_context: bool
    atomic: bool
    timeout: float | None
    #: Snoozes a job of this task may ask for before it is dead-lettered.
    max_snoozes: int
    #: Jobs one handler call takes (a batched task), else None.
    batch_size: int | None = None


class TaskResolver:
    """Import task paths once and remember the result (failures for a few seconds)."""

    def __init__(self) -> None:
        self._known: dict[str, TaskEntry] = {}
        self._unknown: dict[str, tuple[float, UnknownTask]] = {}
        self._lock = threading.Lock()

    def resolve(self, task_path: str) -> TaskEntry:
        """Return the entry for ``task_path``; raise :class:`UnknownTask` if unimportable."""
        entry = self._known.get(task_path)
        if entry is not None:
            return entry
        with self._lock:
            failed = self._unknown.get(task_path)
            if failed is not None and time.monotonic() - failed[0] < _UNKNOWN_TASK_RETRY_SECONDS:
                raise failed[1]
            try:
                task = resolve_task(task_path)
            except UnknownTask as error:
                self._unknown[task_path] = (time.monotonic(), error)
                raise
            func = task.func
            options = task if isinstance(task, PgQueueTask) else None
            entry = TaskEntry(
                task=task,
                func=func,
                signature=inspect.signature(func),
                is_async=inspect.iscoroutinefunction(func),
                takes_context=task.takes_context,
                atomic=bool(options and options.atomic),
                timeout=options.timeout if options else None,
                max_snoozes=(
                    options.max_snoozes
                    if options is not None and options.max_snoozes is not None
                    else conf.MAX_SNOOZES
                ),
                batch_size=options.batch_size if options is not None else None,
            )
            self._known[task_path] = entry
            self._unknown.pop(task_path, None)
            return entry
