"""Build ``TaskResult`` values for jobs whose arguments are JSON values already.

``TaskResult`` is a frozen dataclass: its ``__init__`` sets each field through
``object.__setattr__`` and its ``__post_init__`` walks ``args`` and ``kwargs`` through
``normalize_json``, about 3 µs per result. A bulk enqueue returns a thousand of them
per call and a worker builds one per attempt, so that is a tenth of a bulk call and a
twentieth of a worker's CPU per job.

Our arguments come from the job's stored JSON (decoded by ``json.loads`` or by psycopg),
so they are lists, dicts, strings, numbers, booleans and None already, and the walk
would only copy them. :func:`build_result` sets the same fields without it. Where the
caller still holds the arguments (a worker passes them to the task), it copies them as
the walk would, so the result never shares a list or dict with the handler.

The shortcut is taken only while ``TaskResult`` has exactly the fields it was written
for, each a slot, and each non-constructor field with a plain default; otherwise (a
Django or backport release that changes the class) every result goes through the
constructor.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from django_pgqueue.compat import TaskResult, TaskResultStatus, normalize_json

__all__ = ["SHORTCUT", "build_result", "unshared"]

#: The constructor's fields, in the order :func:`build_result` sets them.
_CONSTRUCTOR_FIELDS: Final = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
)

_Setter = Callable[[Any, Any], None]


def _setters() -> tuple[tuple[_Setter, ...], tuple[tuple[_Setter, Any], ...]] | None:
    """Return the slot setters of the constructor's fields, and ``(setter, default)`` of
    the others; None when ``TaskResult`` is not the class this module was written for.

    A slot's own descriptor sets it without the type lookup ``object.__setattr__`` makes
    (0.5 µs per result instead of 0.85), and bypasses the frozen class's ``__setattr__``
    as the constructor itself does.
    """
    try:
        fields = dataclasses.fields(TaskResult)
    except TypeError:  # no longer a dataclass
        return None
    if frozenset(f.name for f in fields if f.init) != frozenset(_CONSTRUCTOR_FIELDS):
        return None
    descriptors: dict[str, types.MemberDescriptorType] = {}
    for f in fields:
        descriptor = vars(TaskResult).get(f.name)
        if not isinstance(descriptor, types.MemberDescriptorType):
            return None  # not slotted: the fields live elsewhere
        descriptors[f.name] = descriptor
    others = [f for f in fields if not f.init]
    if any(f.default is dataclasses.MISSING for f in others):
        return None  # a default_factory (or none): only the constructor knows it
    return (
        tuple(descriptors[name].__set__ for name in _CONSTRUCTOR_FIELDS),
        tuple((descriptors[f.name].__set__, f.default) for f in others),
    )


_PLAN: Final = _setters()
#: Whether :func:`build_result` skips the constructor (see the module docstring).
SHORTCUT: bool = _PLAN is not None


def _unused(instance: Any, value: Any) -> None:  # pragma: no cover - never called
    raise AssertionError("build_result's shortcut is off")


(
    _task,
    _id,
    _status,
    _enqueued_at,
    _started_at,
    _finished_at,
    _last_attempted_at,
    _args,
    _kwargs,
    _backend,
    _errors,
    _worker_ids,
) = _PLAN[0] if _PLAN is not None else (_unused,) * len(_CONSTRUCTOR_FIELDS)
_OTHERS: Final = _PLAN[1] if _PLAN is not None else ()
_new = object.__new__


def build_result(
    *,
    task: Any,
    job_id: str,
    status: TaskResultStatus,
    enqueued_at: datetime | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    last_attempted_at: datetime | None,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    errors: list[Any],
    worker_ids: list[str],
) -> TaskResult:  # type: ignore[type-arg]
    """Return the ``TaskResult`` the constructor would, for JSON-valued arguments.

    ``args`` and ``kwargs`` must be JSON values owned by the result (freshly decoded,
    or copied with :func:`unshared`): they are stored as they are.
    """
    if not SHORTCUT:
        return TaskResult(
            task=task,
            id=job_id,
            status=status,
            enqueued_at=enqueued_at,
            started_at=started_at,
            finished_at=finished_at,
            last_attempted_at=last_attempted_at,
            args=args,
            kwargs=kwargs,
            backend=backend,
            errors=errors,
            worker_ids=worker_ids,
        )
    result = _new(TaskResult)
    _task(result, task)
    _id(result, job_id)
    _status(result, status)
    _enqueued_at(result, enqueued_at)
    _started_at(result, started_at)
    _finished_at(result, finished_at)
    _last_attempted_at(result, last_attempted_at)
    _args(result, args)
    _kwargs(result, kwargs)
    _backend(result, backend)
    _errors(result, errors)
    _worker_ids(result, worker_ids)
    for setter, default in _OTHERS:
        setter(result, default)
    return result


def unshared(value: Any) -> Any:
    """Return a copy of a JSON value that shares no list or dict with ``value``.

    What the constructor's ``normalize_json`` walk returns for it; an empty list or
    dict (most jobs' arguments) is copied without the walk.
    """
    if type(value) is list and not value:
        return []
    if type(value) is dict and not value:
        return {}
    return normalize_json(value)
