"""Check and encode job arguments before anything reaches the database.

Everything is validated in Python first, so a bad argument raises a typed error naming it
while the caller's transaction stays usable (a failed SQL statement would abort it).
Only values that survive a JSON round trip unchanged are accepted: no NaN or infinities,
no NUL characters (PostgreSQL's jsonb rejects them), no non-string dict keys (JSON would
silently turn ``{1: "a"}`` into ``{"1": "a"}``), no bytes, dates or model instances.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import InvalidArguments, InvalidOption, PayloadTooLarge

__all__ = ["check_key", "encode_arguments", "encode_result"]

_MAX_DEPTH = 100
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, limit: int
) -> tuple[str, str]:
    """Return ``(args_json, kwargs_json)``; raise if they are not plain JSON or too large.

    Raises :class:`InvalidArguments` naming the offending argument (``args[1]``,
    ``kwargs['when']['tz']``) or :class:`PayloadTooLarge`.
    """
    if not args and not kwargs and isinstance(args, list | tuple) and isinstance(kwargs, Mapping):
        return "[]", "{}"  # the common case of a task without arguments
    if not isinstance(args, list | tuple):
        raise InvalidArguments("args", f"must be a list or tuple, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise InvalidArguments("kwargs", f"must be a mapping, not {type(kwargs).__name__}")
    for index, value in enumerate(args):
        _check(value, f"args[{index}]", 0)
    for name, value in kwargs.items():
        if not isinstance(name, str):
            raise InvalidArguments(f"kwargs[{name!r}]", "keyword names must be strings")
        _check(value, f"kwargs[{name!r}]", 0)
    args_json = _ENCODER.encode(list(args))
    kwargs_json = _ENCODER.encode(dict(kwargs))
    size = len(args_json.encode("utf-8")) + len(kwargs_json.encode("utf-8"))
    if size > limit:
        raise PayloadTooLarge(size, limit)
    return args_json, kwargs_json


def encode_result(value: Any) -> str:
    """Return a task's return value as JSON text.

    Raises :class:`InvalidArguments` if the value is not plain JSON.
    """
    _check(value, "return value", 0)
    return _ENCODER.encode(value)


def _check(value: Any, path: str, depth: int) -> None:
    # Exact type checks: bool is an int subclass and is fine, but subclasses of str/int/float
    # (enums, Decimal-like wrappers) might not survive the round trip unchanged.
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return
    if kind is str:
        if "\x00" in value:
            raise InvalidArguments(path, "strings may not contain NUL characters (\\x00)")
        return
    if kind is float:
        if not math.isfinite(value):
            raise InvalidArguments(
                path, f"{value!r} is not valid JSON (NaN and infinities are not)"
            )
        return
    if depth >= _MAX_DEPTH:
        raise InvalidArguments(path, f"nested deeper than {_MAX_DEPTH} levels")
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", depth + 1)
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidArguments(
                    f"{path}[{key!r}]",
                    f"dict keys must be strings, not {type(key).__name__} "
                    "(JSON would turn the key into a string)",
                )
            if "\x00" in key:
                raise InvalidArguments(path, "dict keys may not contain NUL characters (\\x00)")
            _check(item, f"{path}[{key!r}]", depth + 1)
        return
    raise InvalidArguments(path, _why_not_json(value))


def _why_not_json(value: object) -> str:
    name = type(value).__name__
    hints = {
        "datetime": "pass value.isoformat() and parse it in the task",
        "date": "pass value.isoformat() and parse it in the task",
        "Decimal": "pass str(value)",
        "UUID": "pass str(value)",
        "bytes": "decode it, or store the data elsewhere and pass a reference",
        "set": "pass a sorted list",
        "frozenset": "pass a sorted list",
    }
    hint = hints.get(name, "pass the primary key instead" if hasattr(value, "_meta") else "")
    message = f"{name} is not JSON-serializable"
    return f"{message}; {hint}" if hint else message


def check_key(option: str, value: object, *, max_length: int) -> str | None:
    """Return a valid key (idempotency or partition) or None; raise :class:`InvalidOption`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidOption(option, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidOption(option, "must not be empty (use None for no key)")
    if len(value) > max_length:
        raise InvalidOption(option, f"is {len(value)} characters long, the limit is {max_length}")
    if "\x00" in value:
        raise InvalidOption(option, "may not contain NUL characters (\\x00)")
    return value
