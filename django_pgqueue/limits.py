"""Bounds of the job fields, and the syntax of concurrency and rate limits.

Shared by the settings, the models and the checks on what is enqueued.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta

from django_pgqueue.exceptions import InvalidOption

QUEUE_MAX_LENGTH = 100
TASK_PATH_MAX_LENGTH = 255
KEY_MAX_LENGTH = 255
WORKER_ID_MAX_LENGTH = 200
SCHEDULE_NAME_MAX_LENGTH = 150
MAX_ATTEMPTS_LIMIT = 1000
MAX_SNOOZES_LIMIT = 1_000_000
# The most jobs one call of a batched task's handler takes.
MAX_BATCH_SIZE = 1000
# Job ids are bigint: ids outside this range are refused before PostgreSQL sees them.
JOB_ID_MIN = -(2**63)
JOB_ID_MAX = 2**63 - 1

#: Highest limit accepted: beyond it, a limit is no limit.
CONCURRENCY_LIMIT_MAX = 100_000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|m|h|d)\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` starts per ``period`` seconds (a token bucket of ``limit``)."""

    limit: int
    period: float

    def __str__(self) -> str:
        return f"{self.limit}/{self.period:g}s"


def check_limit(name: str, limit: object) -> int:
    """Return ``limit`` if it is a valid concurrency limit; raise :class:`InvalidOption`."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidOption(name, f"must be an integer, not {limit!r}")
    if not 1 <= limit <= CONCURRENCY_LIMIT_MAX:
        raise InvalidOption(name, f"{limit} is outside 1..{CONCURRENCY_LIMIT_MAX}")
    return limit


def parse_rate(name: str, value: object) -> Rate:
    """Parse ``"20/s"``, ``"1000/h"``, ``"3/10s"``, ``"5/m"``, ``"100/d"``.

    Raises :class:`InvalidOption` naming ``name`` for anything else (a limit of 0, a
    period of 0 or less).
    """
    if isinstance(value, Rate):
        return value
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidOption(
            name, f"{value!r} is not a rate like '20/s', '1000/h' or '3/10s' (starts/period)"
        )
    limit = int(match.group(1))
    period = float(match.group(2) or 1) * _UNITS[match.group(3)]
    if not 1 <= limit <= CONCURRENCY_LIMIT_MAX:
        raise InvalidOption(name, f"{value!r}: the limit is outside 1..{CONCURRENCY_LIMIT_MAX}")
    if period <= 0:
        raise InvalidOption(name, f"{value!r}: the period must be longer than 0")
    return Rate(limit, period)


#: The lengths a history partition can have (PGQUEUE_HISTORY_PERIOD): date_trunc units.
HISTORY_PERIODS = ("hour", "day", "week")

#: The final statuses a retention can be given (PGQUEUE_RETENTION's keys besides "queues").
RETENTION_STATUSES = ("succeeded", "cancelled", "dead_letter")


def _retention_seconds(where: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} must be a number of seconds, a timedelta or None, not {value!r}")
    if value < 0:
        raise ValueError(f"{where} must be >= 0, not {value!r}")
    return float(value)


def parse_retention(
    value: object, defaults: dict[str, float | None]
) -> dict[str | None, dict[str, float | None]]:
    """Return PGQUEUE_RETENTION resolved: ``{None: {status: seconds}, queue: {...}}``.

    ``value`` maps a final status to how long its jobs are kept (seconds, a timedelta,
    or None: kept), and ``"queues"`` to per-queue maps of the same shape; a status a map
    leaves out keeps its default (``defaults``, then the every-queue value). Raises
    ``ValueError`` naming what is wrong.
    """
    if not isinstance(value, dict):
        raise ValueError(f"PGQUEUE_RETENTION must be a dict, not {type(value).__name__}")
    every = dict(defaults)
    for key, seconds in value.items():
        if key == "queues":
            continue
        if key not in RETENTION_STATUSES:
            raise ValueError(
                f"PGQUEUE_RETENTION: {key!r} is not a final status "
                f"({', '.join(RETENTION_STATUSES)}) or 'queues'"
            )
        every[key] = _retention_seconds(f"PGQUEUE_RETENTION[{key!r}]", seconds)
    resolved: dict[str | None, dict[str, float | None]] = {None: every}
    queues = value.get("queues", {})
    if not isinstance(queues, dict):
        raise ValueError(f"PGQUEUE_RETENTION['queues'] must be a dict, not {queues!r}")
    for queue, statuses in queues.items():
        if not isinstance(queue, str) or not 0 < len(queue) <= QUEUE_MAX_LENGTH:
            raise ValueError(
                f"PGQUEUE_RETENTION['queues']: {queue!r} is not a queue name "
                f"(1 to {QUEUE_MAX_LENGTH} characters)"
            )
        if not isinstance(statuses, dict) or not statuses:
            raise ValueError(
                f"PGQUEUE_RETENTION['queues'][{queue!r}] must be a non-empty dict of final "
                f"status to seconds, not {statuses!r}"
            )
        own = {}
        for status, seconds in statuses.items():
            if status not in RETENTION_STATUSES:
                raise ValueError(
                    f"PGQUEUE_RETENTION['queues'][{queue!r}]: {status!r} is not a final "
                    f"status ({', '.join(RETENTION_STATUSES)})"
                )
            own[status] = _retention_seconds(
                f"PGQUEUE_RETENTION['queues'][{queue!r}][{status!r}]", seconds
            )
        resolved[queue] = own
    return resolved
