"""``PGQUEUE_MIDDLEWARE``: code around every attempt and every enqueue, in Django's shape.

A middleware is a factory (a class, usually) listed by dotted path. It is called once
per chain with ``get_response``, the next step, and returns a callable that takes the
call (an :class:`Attempt` in a worker, an :class:`Enqueue` in a producer), may do
something before and after, and returns what ``get_response(call)`` returned: the
handler's return value, or the enqueue's task results. The first middleware listed is
the outermost, as in ``MIDDLEWARE``. Exceptions travel up the chain unchanged; a
middleware may catch, replace or raise one (a :class:`Snooze`, a ``PermanentError``), and
one that returns without calling ``get_response`` decides the outcome itself.

Async tasks get a chain of their own: a middleware whose factory sets
``async_capable = True`` is given an async ``get_response`` and must return a coroutine
function; any other runs in a thread of its own around the coroutine (``asgiref``'s
adapters, as Django does), which works but costs a thread per running job.

With no middleware listed nothing here runs: the worker and the backend check one
attribute and call the task (``tests/test_middleware.py`` measures it).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from django_pgqueue.compat import Task
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.tasks.batches import BatchJob
from django_pgqueue.tasks.context import JobContext

__all__ = [
    "Attempt",
    "Enqueue",
    "MiddlewareError",
    "attempt_chain",
    "enqueue_chain",
    "middleware_paths",
    "middleware_problems",
]

SETTING = "PGQUEUE_MIDDLEWARE"

Handler = Callable[[Any], Any]


class MiddlewareError(ConfigurationError):
    """An entry of ``PGQUEUE_MIDDLEWARE`` cannot be imported or built (check E129)."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = path
        super().__init__(f"{SETTING}: {path!r} {reason} (django_pgqueue.E129)")


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt of a job, as a worker is about to run it.

    ``args`` and ``kwargs`` are what the task is called with (a middleware may change
    them); ``context`` is the :class:`JobContext` a ``takes_context=True`` task gets, else
    None. ``attempt`` counts from 1.

    A batched task's handler call is one attempt here: ``batch`` holds its jobs (also
    ``args[0]``), and ``job_id`` and ``attempt`` are the first job's.
    """

    job_id: int
    task: Task  # type: ignore[type-arg]
    task_path: str
    queue: str
    attempt: int
    worker_id: str
    args: list[Any]
    kwargs: dict[str, Any]
    context: JobContext | None = None
    is_async: bool = False
    batch: list[BatchJob] | None = None
    kind: Literal["attempt"] = field(default="attempt", init=False)


@dataclass(slots=True, eq=False)
class Enqueue:
    """One ``enqueue()`` (one call) or ``enqueue_many()`` (many), before it is written.

    ``calls`` holds one ``(args, kwargs)`` pair per job; a middleware may change or
    replace them (they are validated after it, so a bad value is refused as usual). The
    chain returns the ``TaskResult`` of each, in order.
    """

    task: Task  # type: ignore[type-arg]
    backend: str
    calls: list[tuple[Sequence[Any], dict[str, Any]]]
    kind: Literal["enqueue"] = field(default="enqueue", init=False)


def middleware_paths() -> list[str]:
    """Return ``PGQUEUE_MIDDLEWARE``; raise ``ConfigurationError`` (E128) if malformed."""
    return conf.MIDDLEWARE


def middleware_problems(paths: Sequence[str]) -> list[str]:
    """Return what is wrong with each entry that cannot be imported or is not callable."""
    problems = []
    for path in paths:
        try:
            _factory(path)
        except MiddlewareError as error:
            problems.append(str(error))
    return problems


def _factory(path: str) -> Callable[[Handler], Handler]:
    try:
        factory = import_string(path)
    except ImportError as error:
        raise MiddlewareError(path, f"cannot be imported: {error}") from error
    if not callable(factory):
        raise MiddlewareError(path, "is not callable (a class or a function taking get_response)")
    return factory  # type: ignore[no-any-return]


def _build(path: str, factory: Callable[[Handler], Handler], handler: Handler) -> Handler:
    middleware = factory(handler)
    if middleware is None or not callable(middleware):
        raise MiddlewareError(path, f"returned {middleware!r}, not a callable")
    return middleware


def _chain(inner: Handler, paths: Sequence[str], *, is_async: bool) -> Handler:
    handler = inner
    for path in reversed(paths):
        factory = _factory(path)
        if not is_async:
            handler = _build(path, factory, handler)
            continue
        if getattr(factory, "async_capable", False):
            built = _build(path, factory, handler)
            if not iscoroutinefunction(built) and not inspect.iscoroutinefunction(
                getattr(built, "__call__", None)  # noqa: B004 - a class's async __call__
            ):
                raise MiddlewareError(
                    path, "sets async_capable but did not return a coroutine function"
                )
            handler = built
            continue
        # A sync middleware around a coroutine: it runs in a thread of its own and its
        # get_response waits for the coroutine on the worker's event loop.
        built = _build(path, factory, async_to_sync(handler))
        adapted = sync_to_async(built, thread_sensitive=False)
        handler = markcoroutinefunction(adapted)
    return handler


@functools.cache
def _attempt_chains() -> tuple[Handler | None, Handler | None]:
    paths = middleware_paths()
    if not paths:
        return None, None
    return _chain(_call_task, paths, is_async=False), _chain(
        markcoroutinefunction(_acall_task), paths, is_async=True
    )


def attempt_chain(*, is_async: bool) -> Handler | None:
    """Return the chain around an attempt (sync or async), or None if none is listed."""
    return _attempt_chains()[1 if is_async else 0]


@functools.cache
def _enqueue_chain(inner: Handler) -> Handler | None:
    paths = middleware_paths()
    return _chain(inner, paths, is_async=False) if paths else None


def enqueue_chain(inner: Handler) -> Handler | None:
    """Return the chain around an enqueue whose innermost step is ``inner`` (or None)."""
    return _enqueue_chain(inner)


def _call_task(attempt: Attempt) -> Any:
    func = attempt.task.func
    if attempt.context is not None:
        return func(attempt.context, *attempt.args, **attempt.kwargs)
    return func(*attempt.args, **attempt.kwargs)


async def _acall_task(attempt: Attempt) -> Any:
    return await _call_task(attempt)


def _forget(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING:
        _attempt_chains.cache_clear()
        _enqueue_chain.cache_clear()


setting_changed.connect(_forget, dispatch_uid="django_pgqueue.tasks.middleware")
