"""Chains and groups: thin helpers over dependencies (``after=``).

A step is a task and its arguments, made with :func:`step`. :func:`chain` enqueues
steps that run one after the other (each one ``after=`` the one before, reading its
result as ``context.previous_result``); :func:`group` enqueues steps that run side by
side; a job enqueued ``after=`` a group's results fans in and reads them all as
``context.dependency_results``. Everything is enqueued in the caller's transaction, in a
savepoint: if any step is invalid, none of them exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from django_pgqueue.compat import TaskResult
from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.tasks.backend import PgQueueBackend, PgQueueTask

__all__ = ["Step", "chain", "group", "step"]


@dataclass(frozen=True, slots=True)
class Step:
    """One task call of a workflow, not enqueued yet."""

    task: PgQueueTask
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def enqueue(self, after: Iterable[Any] = ()) -> TaskResult:  # type: ignore[type-arg]
        """Enqueue this call, running after ``after`` (task results or job ids)."""
        after = tuple(after)
        task = self.task.using(after=after) if after else self.task
        return task.enqueue(*self.args, **self.kwargs)


def step(task: Any, /, *args: Any, **kwargs: Any) -> Step:
    """Return the step "call ``task`` with these arguments" (a ``django_pgqueue`` task)."""
    if not isinstance(task, PgQueueTask):
        raise InvalidOption("task", f"must be a task of a PgQueueBackend, not {task!r}")
    return Step(task, args, dict(kwargs))


def chain(*steps: Step, after: Iterable[Any] = ()) -> list[TaskResult]:  # type: ignore[type-arg]
    """Enqueue ``steps`` to run one after the other; return their results in order.

    A step runs only once the one before succeeded; if one fails for good, the rest are
    cancelled (naming it), and retrying it with ``revive_dependents`` revives them.
    """
    results: list[TaskResult] = []  # type: ignore[type-arg]
    previous = tuple(after)
    with transaction.atomic(using=_database(steps)):
        for item in steps:
            result = item.enqueue(previous)
            results.append(result)
            previous = (result,)
    return results


def group(*steps: Step, after: Iterable[Any] = ()) -> list[TaskResult]:  # type: ignore[type-arg]
    """Enqueue ``steps`` to run side by side (each after ``after``); return their results.

    Pass the returned list as ``after=`` of a job to fan in.
    """
    previous = tuple(after)
    with transaction.atomic(using=_database(steps)):
        return [item.enqueue(previous) for item in steps]


def _database(steps: tuple[Step, ...]) -> str:
    if not steps:
        raise InvalidOption("steps", "a workflow needs at least one step")
    databases = set()
    for item in steps:
        if not isinstance(item, Step):
            raise InvalidOption("steps", f"must be made with step(), not {item!r}")
        backend = item.task.get_backend()
        if not isinstance(backend, PgQueueBackend):
            raise InvalidOption("steps", f"{item.task.name} does not use a PgQueueBackend")
        databases.add(backend.database)
    if len(databases) > 1:
        raise InvalidOption("steps", "every step must use the same database")
    return databases.pop()
