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
for, each non-constructor field with a plain default; otherwise (a Django or backport
release that changes the class) every result goes through the constructor.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Final

from .compat import TaskResult, TaskResultStatus, normalize_json

__all__ = ["SHORTCUT", "build_result", "unshared"]

_CONSTRUCTOR_FIELDS: Final = frozenset(
    {
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
    }
)


def _other_fields() -> tuple[tuple[str, Any], ...] | None:
    """Return ``(name, default)`` of the fields the constructor does not take, or None.

    None when the class is not the one this module was written for.
    """
    try:
        fields = dataclasses.fields(TaskResult)
    except TypeError:  # no longer a dataclass
        return None
    if frozenset(f.name for f in fields if f.init) != _CONSTRUCTOR_FIELDS:
        return None
    others = [f for f in fields if not f.init]
    if any(f.default is dataclasses.MISSING for f in others):
        return None  # a default_factory (or none): only the constructor knows it
    return tuple((f.name, f.default) for f in others)


_OTHERS: Final = _other_fields()
#: Whether :func:`build_result` skips the constructor (see the module docstring).
SHORTCUT: Final = _OTHERS is not None
_new = object.__new__
_set = object.__setattr__


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
    if _OTHERS is None:
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
    _set(result, "task", task)
    _set(result, "id", job_id)
    _set(result, "status", status)
    _set(result, "enqueued_at", enqueued_at)
    _set(result, "started_at", started_at)
    _set(result, "finished_at", finished_at)
    _set(result, "last_attempted_at", last_attempted_at)
    _set(result, "args", args)
    _set(result, "kwargs", kwargs)
    _set(result, "backend", backend)
    _set(result, "errors", errors)
    _set(result, "worker_ids", worker_ids)
    for name, default in _OTHERS:
        _set(result, name, default)
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
