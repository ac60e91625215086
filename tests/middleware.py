"""Middleware the tests list in ``PGQUEUE_MIDDLEWARE`` (importable by worker subprocesses).

Each appends what it saw to :data:`EVENTS` (in-process tests read it) and, in a worker,
the tenant it set is what ``tests.tasks.tenant_probe`` returns.
"""

from __future__ import annotations

import contextvars
from typing import Any

from django_pgqueue import PermanentError, Snooze
from django_pgqueue.tasks.middleware import Attempt, Enqueue

EVENTS: list[str] = []
TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


def _label(call: Any) -> str:
    return call.kind


class Outer:
    """Records before and after, around everything inside it."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, call: Attempt | Enqueue) -> Any:
        EVENTS.append(f"outer:before:{_label(call)}")
        try:
            return self.get_response(call)
        finally:
            EVENTS.append(f"outer:after:{_label(call)}")


def inner(get_response: Any) -> Any:
    """A function factory, as Django allows: records, and sees the raised error."""

    def middleware(call: Attempt | Enqueue) -> Any:
        EVENTS.append(f"inner:before:{_label(call)}")
        try:
            result = get_response(call)
        except Exception as error:
            EVENTS.append(f"inner:raised:{type(error).__name__}")
            raise
        EVENTS.append(f"inner:after:{_label(call)}")
        return result

    return middleware


class Tenant:
    """Carries the producer's tenant to the attempt: a kwarg at enqueue, a context var in
    the worker (and the kwarg taken off before the task sees it)."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, call: Attempt | Enqueue) -> Any:
        if isinstance(call, Enqueue):
            call.calls = [(args, {**kwargs, "_tenant": "acme"}) for args, kwargs in call.calls]
            return self.get_response(call)
        token = TENANT.set(call.kwargs.pop("_tenant", None))
        try:
            return self.get_response(call)
        finally:
            TENANT.reset(token)


class Refuse:
    """Raises before the task runs, for jobs whose kwargs say so."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, call: Attempt | Enqueue) -> Any:
        if isinstance(call, Attempt):
            how = call.kwargs.get("refuse")
            if how == "error":
                raise RuntimeError("refused by middleware")
            if how == "permanent":
                raise PermanentError("refused for good by middleware")
            if how == "snooze":
                raise Snooze(30)
            if how == "short":
                return {"short_circuit": True}
        return self.get_response(call)


class AsyncAware:
    """Async-capable: awaits the coroutine itself (no thread)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction

        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, call: Any) -> Any:
        from asgiref.sync import iscoroutinefunction

        if iscoroutinefunction(self.get_response):
            return self._acall(call)
        EVENTS.append("async-aware:sync")
        return self.get_response(call)

    async def _acall(self, call: Any) -> Any:
        EVENTS.append("async-aware:async")
        return await self.get_response(call)


class NotCallable:
    """Returns None from its factory: refused when the chain is built."""

    def __new__(cls, get_response: Any) -> Any:
        return None


NOT_A_FACTORY = 42
