"""When a schedule fires: a cron expression (parsed by cronsim) or a plain interval.

Pure computation, no database: every function takes the moment to count from, so the
caller passes the database clock and the tests pass a fixed one. Fire times come back as
aware UTC datetimes.

Cron expressions are evaluated in the schedule's timezone with the semantics of Debian's
cron (cronsim's): a time that does not exist (the hour skipped when clocks go forward)
fires at the first minute after the gap; a time that happens twice (the hour repeated
when clocks go back) fires once, at its first occurrence, unless the expression names
every hour (``*/30 * * * *`` fires in both passes: each is a distinct instant).

Intervals (``@every 30s``, ``@every 1h30m``) are anchored at the Unix epoch, so every
worker computes the same fire times whenever it starts, and a timezone does not apply.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["ALIASES", "Cadence", "CadenceError", "cron_available", "parse_cadence", "zone"]

#: The nicknames of cron(8), spelled out.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_EVERY = re.compile(r"^@every\s+((?:\d+[dhms]\s*)+)$")
_PART = re.compile(r"(\d+)([dhms])")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The most fire times one plan looks back over (a catch-up never needs more).
MAX_LOOKBACK = 1000


class CadenceError(ValueError):
    """The expression cannot be parsed (the message says why)."""


def cron_available() -> bool:
    """Return whether the cron library (the ``cron`` extra: cronsim) is installed."""
    try:
        import cronsim  # noqa: F401
    except ImportError:
        return False
    return True


def zone(name: str) -> ZoneInfo:
    """Return the timezone named ``name``; raise :class:`CadenceError` if unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise CadenceError(f"unknown timezone {name!r}") from error


@dataclass(frozen=True, slots=True)
class Cadence:
    """A parsed schedule expression: exactly one of ``cron`` and ``interval`` is set."""

    #: The expression as declared (``@daily``, ``*/5 * * * *``, ``@every 30s``).
    text: str
    #: The cron fields it stands for (aliases spelled out), or None for an interval.
    cron: str | None = None
    interval: timedelta | None = None

    def next_after(self, moment: datetime, timezone: ZoneInfo) -> datetime:
        """Return the first fire time strictly after ``moment`` (aware UTC)."""
        return next(self._forward(moment, timezone))

    def fires_between(
        self, start: datetime, end: datetime, timezone: ZoneInfo, *, limit: int
    ) -> list[datetime]:
        """Return the latest ``limit`` fire times in ``[start, end]``, oldest first.

        Walks backwards from ``end``, so a schedule that missed a million fires costs
        ``limit`` steps, not a million.
        """
        found: list[datetime] = []
        for fire in self._backward(end + timedelta(microseconds=1), timezone):
            if fire < start or len(found) >= limit:
                break
            found.append(fire)
        return found[::-1]

    def describe(self) -> str:
        """Return the expression in words ("At 02:00 every day", "Every 30 seconds")."""
        if self.interval is not None:
            return f"Every {_spell(self.interval)}"
        text: str = _cronsim(self.cron, _EPOCH).explain()
        return text

    def _forward(self, moment: datetime, timezone: ZoneInfo) -> Iterator[datetime]:
        if self.interval is not None:
            step = self.interval
            count = (moment - _EPOCH) // step + 1
            while True:
                yield _EPOCH + count * step
                count += 1
        for fire in _cronsim(self.cron, moment.astimezone(timezone)):
            yield fire.astimezone(UTC)

    def _backward(self, moment: datetime, timezone: ZoneInfo) -> Iterator[datetime]:
        """Yield fire times strictly before ``moment``, newest first."""
        if self.interval is not None:
            step = self.interval
            count = -((_EPOCH - moment) // step) - 1  # ceil((moment - epoch) / step) - 1
            while True:
                yield _EPOCH + count * step
                count -= 1
        for fire in _cronsim(self.cron, moment.astimezone(timezone), reverse=True):
            yield fire.astimezone(UTC)


def _cronsim(fields: str | None, start: datetime, *, reverse: bool = False) -> Any:
    from cronsim import CronSim

    assert fields is not None
    return CronSim(fields, start, reverse=reverse)


def _spell(interval: timedelta) -> str:
    seconds = int(interval.total_seconds())
    parts = []
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount} {name}{'s' if amount != 1 else ''}")
    return " ".join(parts)


def parse_cadence(text: str) -> Cadence:
    """Parse a cron expression, a cron nickname or ``@every <duration>``.

    Raises :class:`CadenceError` naming what is wrong, and ``ImportError`` (with the
    extra to install) for a cron expression when cronsim is not installed.
    """
    if not isinstance(text, str) or not text.strip():
        raise CadenceError("must be a non-empty string")
    expression = " ".join(text.split())
    every = _EVERY.match(expression)
    if every:
        seconds = sum(int(amount) * _UNITS[unit] for amount, unit in _PART.findall(every.group(1)))
        if seconds < 1:
            raise CadenceError("an interval must be at least one second")
        return Cadence(text=expression, interval=timedelta(seconds=seconds))
    if expression.startswith("@every"):
        raise CadenceError(
            f"{text!r} is not an interval: write @every followed by a duration such as "
            "30s, 5m, 1h30m or 1d"
        )
    fields = ALIASES.get(expression.lower(), expression)
    if fields.startswith("@"):
        raise CadenceError(f"unknown nickname {expression!r} (known: {', '.join(ALIASES)})")
    if not cron_available():
        raise ImportError(
            f"the cron expression {text!r} needs the cron library: "
            "pip install 'django-tasks-pgqueue[cron]' (it installs cronsim)"
        )
    from cronsim import CronSimError

    try:
        _cronsim(fields, _EPOCH)
    except CronSimError as error:
        raise CadenceError(f"{text!r} is not a valid cron expression: {error}") from error
    return Cadence(text=expression, cron=fields)
