"""``django_pgqueue.task``: Django's ``@task`` with django-pgqueue's options, typed.

``django.tasks.task`` accepts these options too (it passes unknown keyword arguments to
the backend's task class), but type checkers only know Django's own parameters. This
decorator spells them out and returns a :class:`PgQueueTask`, whose ``using()`` also
knows them.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, overload

from django_pgqueue.compat import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_PRIORITY,
    DEFAULT_TASK_QUEUE_NAME,
    InvalidTask,
    task_backends,
)
from django_pgqueue.tasks.backend import PgQueueTask

__all__ = ["task"]


@overload
def task(function: Callable[..., Any], /) -> PgQueueTask: ...


@overload
def task(
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    max_attempts: int | None = None,
    timeout: float | None = None,
    max_snoozes: int | None = None,
    atomic: bool = False,
    batch_size: int | None = None,
    idempotency_key: str | None = None,
    partition_key: str | None = None,
    coalesce_key: str | None = None,
    debounce: timedelta | float | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    rate_limit: str | None = None,
) -> Callable[[Callable[..., Any]], PgQueueTask]: ...


def task(
    function: Callable[..., Any] | None = None,
    /,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    max_attempts: int | None = None,
    timeout: float | None = None,
    max_snoozes: int | None = None,
    atomic: bool = False,
    batch_size: int | None = None,
    idempotency_key: str | None = None,
    partition_key: str | None = None,
    coalesce_key: str | None = None,
    debounce: timedelta | float | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    rate_limit: str | None = None,
) -> PgQueueTask | Callable[[Callable[..., Any]], PgQueueTask]:
    """Declare a task run by django-pgqueue; use it like ``django.tasks.task``.

    Raises ``InvalidTask`` if ``backend`` is not a ``PgQueueBackend``, or (as an
    ``InvalidOption``) if an option is out of range.
    """

    def wrapper(func: Callable[..., Any]) -> PgQueueTask:
        task_class = task_backends[backend].task_class
        if not (isinstance(task_class, type) and issubclass(task_class, PgQueueTask)):
            raise InvalidTask(
                f"django_pgqueue.task needs TASKS[{backend!r}] to be a PgQueueBackend"
            )
        return task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,  # Django 6.0's Task has no default for it
            max_attempts=max_attempts,
            timeout=timeout,
            max_snoozes=max_snoozes,
            atomic=atomic,
            batch_size=batch_size,
            idempotency_key=idempotency_key,
            partition_key=partition_key,
            coalesce_key=coalesce_key,
            debounce=debounce,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            rate_limit=rate_limit,
        )

    if function is not None:
        return wrapper(function)
    return wrapper
