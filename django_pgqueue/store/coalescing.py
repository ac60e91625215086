"""Coalescing options: the checks shared by enqueue, the task decorator and the system checks.

A coalesce key makes a second enqueue, while the first job is still pending, return that
job (with the newest arguments) instead of inserting another; a debounce moves its start
later on each such enqueue. The SQL is ``enqueue_coalesced`` (sql/enqueue.sql).
"""

from __future__ import annotations

import math
from datetime import timedelta

from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.limits import KEY_MAX_LENGTH
from django_pgqueue.store.payload import check_key

__all__ = ["DEBOUNCE_MAX", "check_coalescing", "debounce_seconds"]

#: Longest debounce accepted: a day. Longer is a schedule, not a debounce.
DEBOUNCE_MAX = timedelta(days=1)


def debounce_seconds(value: object) -> float | None:
    """Return ``value`` (a timedelta or seconds, None for none) in seconds.

    Raises :class:`InvalidOption` for a negative, infinite or over-long delay.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidOption(
            "debounce", f"must be a timedelta or a number of seconds, not {value!r}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidOption("debounce", f"{value!r} is not a delay of zero or more")
    if seconds > DEBOUNCE_MAX.total_seconds():
        raise InvalidOption("debounce", f"{value!r} is longer than {DEBOUNCE_MAX}")
    return seconds


def check_coalescing(
    coalesce_key: object, debounce: object, idempotency_key: object
) -> tuple[str | None, float | None]:
    """Return the valid ``(coalesce_key, debounce seconds)``; raise :class:`InvalidOption`.

    A debounce needs a coalesce key, and a coalesce key cannot go with an idempotency key
    (one dedupes while the job is pending, the other for its whole life: pick one).
    """
    key = check_key("coalesce_key", coalesce_key, max_length=KEY_MAX_LENGTH)
    seconds = debounce_seconds(debounce)
    if seconds is not None and key is None:
        raise InvalidOption("debounce", "needs a coalesce_key")
    if key is not None and idempotency_key is not None:
        raise InvalidOption("coalesce_key", "cannot be combined with an idempotency_key")
    return key, seconds
