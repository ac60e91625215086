"""Check and encode job arguments and results before anything reaches the database.

Everything is validated in Python first, so a bad argument raises a typed error naming it
while the caller's transaction stays usable (a failed SQL statement would abort it).

Arguments are accepted only if the task will receive them unchanged after PostgreSQL's
jsonb round trip (up to the plain form Django's Tasks API gives them too: tuples and other
sequences become lists, mappings become dicts, str/int/float subclasses such as
``TextChoices`` become plain values). Refused: NaN and infinities, ``-0.0`` (jsonb has
no negative zero), integers Python will not convert to text, NUL characters and lone
surrogates (PostgreSQL stores neither), non-string dict keys (JSON would turn ``{1: "a"}``
into ``{"1": "a"}``), bytes, sets, dates and model instances.

Return values are normalised the way Django's own backends do
(``django.utils.json.normalize_json``); one that still cannot be stored is replaced by a
note saying why (:func:`encode_result`): the task's work is done either way.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django_pgqueue.compat import normalize_json
from django_pgqueue.exceptions import InvalidArguments, InvalidOption, PayloadTooLarge

__all__ = [
    "UNSTORABLE_RESULT",
    "StoredResult",
    "check_key",
    "check_text",
    "encode_arguments",
    "encode_result",
]

#: The key of the note stored instead of a return value that cannot be stored.
UNSTORABLE_RESULT = "unstorable_result"

_MAX_DEPTH = 100
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# From 1e16 on, repr() writes floats with an exponent ("1e+16"); jsonb keeps the number but
# prints it back without one, so it would be read back as an int.
_WIDE_FLOAT = 1e16
# Integers shorter than this convert to text under any digit limit (the lowest is 640).
_SAFE_INT_BITS = 2048
# jsonb's numeric type holds at most this many digits before the decimal point.
_NUMERIC_MAX_DIGITS = 131_072
_NOT_BYTES = (bytes, bytearray, memoryview)


@dataclass(frozen=True, slots=True)
class StoredResult:
    """A task's return value as it is stored."""

    #: The JSON text written to the job row.
    json: str
    #: The value ``get_result()`` will return: the normalised return value, or the note.
    value: Any
    #: Why the return value was replaced by a note (None: it was stored).
    problem: str | None = None


_NONE_RESULT = StoredResult("null", None)


def encode_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, limit: int
) -> tuple[str, str]:
    """Return ``(args_json, kwargs_json)``; raise if they would not come back unchanged.

    Raises :class:`InvalidArguments` (also a ``TypeError``) naming the offending argument
    (``args[1]``, ``kwargs['when']['tz']``) or :class:`PayloadTooLarge`.
    """
    if not args and not kwargs and isinstance(args, list | tuple) and isinstance(kwargs, Mapping):
        return "[]", "{}"  # the common case of a task without arguments
    if not isinstance(args, list | tuple):
        raise InvalidArguments("args", f"must be a list or tuple, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise InvalidArguments("kwargs", f"must be a mapping, not {type(kwargs).__name__}")
    args_rewrite = False
    for index, value in enumerate(args):
        args_rewrite |= _check(value, f"args[{index}]", 0, result=False)
    kwargs_rewrite = not isinstance(kwargs, dict)
    for name, value in kwargs.items():
        if not isinstance(name, str):
            raise InvalidArguments(f"kwargs[{name!r}]", "keyword names must be strings")
        path = f"kwargs[{name!r}]"
        _check_text(name, path, "keyword names")
        kwargs_rewrite |= _check(value, path, 0, result=False)
    args_json = _dump(list(args), args_rewrite)
    kwargs_json = _dump(kwargs, kwargs_rewrite)
    size = len(args_json.encode("utf-8")) + len(kwargs_json.encode("utf-8"))
    if size > limit:
        raise PayloadTooLarge(size, limit)
    return args_json, kwargs_json


def encode_result(value: Any) -> StoredResult:
    """Return a task's return value as it will be stored; never raise.

    The value is normalised as Django's backends do (mappings to dicts, sequences to
    lists, UTF-8 bytes to text, non-string keys to JSON's string keys). If it still cannot
    be stored unchanged, the stored value is a note, ``{"unstorable_result": {"type":
    ..., "reason": ...}}``, and :attr:`StoredResult.problem` says why.
    """
    if value is None:
        return _NONE_RESULT  # most tasks return nothing
    try:
        if not _check(value, "return value", 0, result=True):
            return StoredResult(_ENCODER.encode(value), value)  # plain JSON already
    except InvalidArguments:
        pass  # bytes, say, which Django's normalisation turns into text
    try:
        plain = normalize_json(value)
        rewrite = _check(plain, "return value", 0, result=True)
        return StoredResult(_dump(plain, rewrite), plain)
    except Exception as error:  # whatever the reason, the value cannot be stored
        problem = _why_unstorable(value, error)
    kind = type(value)
    note = {
        UNSTORABLE_RESULT: {"type": f"{kind.__module__}.{kind.__qualname__}", "reason": problem}
    }
    return StoredResult(_ENCODER.encode(note), note, problem)


def _why_unstorable(value: Any, error: Exception) -> str:
    if isinstance(error, InvalidArguments):
        return str(error)
    # normalize_json's own messages name no position; walking the raw value finds it.
    try:
        _check(value, "return value", 0, result=True)
    except InvalidArguments as found:
        return str(found)
    except Exception:  # noqa: S110 - fall back to the original error below
        pass
    return f"return value: {type(error).__name__} while converting it to JSON"


def check_text(option: str, value: str) -> None:
    """Raise :class:`InvalidOption` if PostgreSQL cannot store ``value`` as text."""
    problem = _text_problem(value)
    if problem:
        raise InvalidOption(option, problem)


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
    check_text(option, value)
    return value


# ---------------------------------------------------------------------- checking
def _text_problem(text: str) -> str | None:
    """Return why PostgreSQL cannot store ``text`` (None: it can)."""
    if "\x00" in text:
        return "may not contain NUL characters (\\x00)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            return (
                f"contains a lone surrogate ({text[error.start]!r} at index {error.start}), "
                "which is not valid Unicode and cannot be stored"
            )
    return None


def _check_text(text: str, path: str, what: str) -> None:
    problem = _text_problem(text)
    if problem:
        raise InvalidArguments(path, f"{what} {problem}")


def _check(value: Any, path: str, depth: int, *, result: bool) -> bool:
    """Raise :class:`InvalidArguments` naming ``path`` if ``value`` would not come back.

    Return True if the value needs :func:`_write` rather than the C encoder (a wide float,
    or a mapping or sequence the encoder does not know).
    """
    kind = type(value)
    # Exact types first: they are nearly every value, and isinstance() against the
    # Mapping and Sequence ABCs is slow.
    if kind is str:
        _check_text(value, path, "strings")
        return False
    if kind is int and value.bit_length() <= _SAFE_INT_BITS:
        return False
    if kind is dict:
        return _check_items(value, path, depth, result=result, rewrite=False)
    if kind is list or kind is tuple:
        return _check_sequence(value, path, depth, result=result, rewrite=False)
    if value is None or kind is bool:
        return False
    if isinstance(value, str):
        _check_text(value, path, "strings")
        return False
    if isinstance(value, int):
        if value.bit_length() > _SAFE_INT_BITS:
            _check_big_int(value, path)
        return False
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArguments(
                path, f"{value!r} is not valid JSON (NaN and infinities are not)"
            )
        if value == 0 and math.copysign(1.0, value) < 0:
            raise InvalidArguments(
                path, "-0.0 cannot be stored: PostgreSQL's jsonb has no negative zero (pass 0.0)"
            )
        return abs(value) >= _WIDE_FLOAT
    if isinstance(value, Mapping):
        return _check_items(value, path, depth, result=result, rewrite=not isinstance(value, dict))
    if isinstance(value, Sequence) and not isinstance(value, _NOT_BYTES):
        rewrite = not isinstance(value, list | tuple)
        return _check_sequence(value, path, depth, result=result, rewrite=rewrite)
    raise InvalidArguments(path, _why_not_json(value))


def _check_items(
    value: Mapping[Any, Any], path: str, depth: int, *, result: bool, rewrite: bool
) -> bool:
    if depth >= _MAX_DEPTH:
        raise InvalidArguments(path, f"nested deeper than {_MAX_DEPTH} levels")
    for key, item in value.items():
        item_path = f"{path}[{key!r}]"
        if isinstance(key, str):
            _check_text(key, item_path, "dict keys")
        elif not (result and (key is None or isinstance(key, int | float))):
            # A return value's keys become strings as JSON makes them (Django's
            # backends store them so); an argument's would reach the task changed.
            raise InvalidArguments(
                item_path,
                f"dict keys must be strings, not {type(key).__name__} "
                "(JSON would turn the key into a string)",
            )
        elif isinstance(key, float) and not math.isfinite(key):
            raise InvalidArguments(item_path, f"dict key {key!r} is not valid JSON")
        rewrite |= _check(item, item_path, depth + 1, result=result)
    return rewrite


def _check_sequence(
    value: Sequence[Any], path: str, depth: int, *, result: bool, rewrite: bool
) -> bool:
    if depth >= _MAX_DEPTH:
        raise InvalidArguments(path, f"nested deeper than {_MAX_DEPTH} levels")
    for index, item in enumerate(value):
        rewrite |= _check(item, f"{path}[{index}]", depth + 1, result=result)
    return rewrite


def _check_big_int(value: int, path: str) -> None:
    try:
        digits = len(int.__repr__(abs(value)))
    except ValueError:  # over sys.get_int_max_str_digits()
        raise InvalidArguments(
            path,
            "integer has more digits than Python converts to text "
            f"(sys.get_int_max_str_digits() is {sys.get_int_max_str_digits()}); "
            "pass it as a string",
        ) from None
    if digits > _NUMERIC_MAX_DIGITS:
        raise InvalidArguments(
            path, f"integer has {digits} digits; PostgreSQL's jsonb holds {_NUMERIC_MAX_DIGITS}"
        )


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


# ---------------------------------------------------------------------- encoding
def _dump(value: Any, rewrite: bool) -> str:
    """Return checked ``value`` as JSON text (the C encoder unless it cannot be exact)."""
    if not rewrite:
        return _ENCODER.encode(value)
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _write(value: Any, parts: list[str]) -> None:
    """Append checked ``value`` as JSON to ``parts``, keeping every float a float.

    The standard encoder has no hook for number formatting, and jsonb reads ``1e+20`` as
    the integer 100000000000000000000; ``100000000000000000000.0`` it keeps as written.
    """
    if value is None or value is True or value is False:
        parts.append(_ENCODER.encode(value))
    elif isinstance(value, str):
        parts.append(_ENCODER.encode(str.__str__(value)))
    elif isinstance(value, int):
        parts.append(int.__repr__(value))
    elif isinstance(value, float):
        parts.append(_float_text(value))
    elif isinstance(value, Mapping):
        parts.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                parts.append(",")
            parts.append(_ENCODER.encode(_key_text(key)))
            parts.append(":")
            _write(item, parts)
        parts.append("}")
    else:  # a sequence (checked)
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _write(item, parts)
        parts.append("]")


def _float_text(value: float) -> str:
    text = float.__repr__(value)
    if abs(value) < _WIDE_FLOAT:
        return text
    # The exact decimal of the shortest repr reads back as the same float.
    return format(Decimal(text), "f") + ".0"


def _key_text(key: Any) -> str:
    """Return a dict key as JSON's string key (as ``json.dumps`` converts them)."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is None or key is True or key is False:
        return str(_ENCODER.encode(key))
    if isinstance(key, int):
        return int.__repr__(key)
    return float.__repr__(key)
