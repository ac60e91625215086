"""Settings: one typed property per ``PGQUEUE_*`` setting, read when accessed.

Reading at access time (never caching) keeps ``override_settings`` working in tests. Each
property validates its value and raises :class:`~django_pgqueue.exceptions.ConfigurationError`
naming the setting; the system checks (``checks.py``) report the same problems at start-up.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from django.conf import settings

from django_pgqueue.exceptions import ConfigurationError, InvalidOption
from django_pgqueue.limits import HISTORY_PERIODS, MAX_SNOOZES_LIMIT, parse_rate, parse_retention

__all__ = ["SETTINGS", "Settings", "conf"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One setting: its name, default and what it controls (the docs are built from this)."""

    name: str
    default: object
    help: str


#: Every setting, in documentation order.
SETTINGS: Final[tuple[SettingSpec, ...]] = (
    SettingSpec("MAX_ATTEMPTS", 5, "Attempts a job gets when its task sets no max_attempts."),
    SettingSpec(
        "MAX_SNOOZES",
        100,
        "Snoozes a job may ask for when its task sets no max_snoozes; one more "
        "dead-letters it (SnoozeLimitReached).",
    ),
    SettingSpec(
        "MAX_PAYLOAD_BYTES", 1_000_000, "Largest JSON-encoded args + kwargs accepted at enqueue."
    ),
    SettingSpec("RETRY_BASE_SECONDS", 2.0, "Backoff after the first failed attempt."),
    SettingSpec("RETRY_MAX_SECONDS", 3600.0, "Upper bound of the retry backoff."),
    SettingSpec(
        "RETRY_JITTER", 0.2, "Random spread of each backoff, as a fraction (0.2 = +/-20%)."
    ),
    SettingSpec("LEASE_SECONDS", 30.0, "Length of a job lease; workers extend it while running."),
    SettingSpec(
        "HEARTBEAT_SECONDS", 5.0, "How often workers extend leases and refresh the registry."
    ),
    SettingSpec("WORKER_TIMEOUT_SECONDS", 30.0, "Silence after which a worker is considered dead."),
    SettingSpec("POLL_INTERVAL_SECONDS", 1.0, "Fallback poll when no notification arrives."),
    SettingSpec("CONCURRENCY", 10, "Jobs one worker process runs at the same time."),
    SettingSpec("BATCH_SIZE", 500, "Most jobs claimed in one round trip."),
    SettingSpec("PREFETCH", 0, "Extra jobs a worker may hold beyond its free slots."),
    SettingSpec(
        "PREFETCH_WINDOW_SECONDS",
        0.05,
        "Adaptive prefetch: a worker also holds as many jobs as it finishes in this time "
        "(at its measured rate, at most BATCH_SIZE); 0 turns it off.",
    ),
    SettingSpec("GRACE_SECONDS", 30.0, "Time running jobs get to finish on shutdown."),
    SettingSpec(
        "LOG_SUMMARY_SECONDS",
        10.0,
        "How often a worker logs, at INFO, how many jobs it finished by outcome (only when "
        "it finished any); 0 turns the summary off.",
    ),
    SettingSpec(
        "HOUSEKEEPING_INTERVAL_SECONDS",
        10.0,
        "How often one worker reaps expired leases, marks silent workers dead and prunes.",
    ),
    SettingSpec(
        "CLAIM_FLOOR_AFTER_SECONDS",
        0.05,
        "A claim from the head of a queue slower than this (a long transaction keeps the "
        "index entries of claimed jobs) makes the worker claim after its last job for 20 "
        "times as long, then from the head again (None: always from the head).",
    ),
    SettingSpec(
        "RETENTION_SECONDS",
        7 * 24 * 3600.0,
        "Age after which succeeded and cancelled jobs are deleted (None keeps them).",
    ),
    SettingSpec(
        "DEAD_LETTER_RETENTION_SECONDS",
        None,
        "Age after which dead letters are deleted (None keeps them for an operator).",
    ),
    SettingSpec(
        "PRUNE_BATCH_SIZE",
        5000,
        "Rows per housekeeping batch: deleted, keys freed, or finished rows moved to"
        " the history (at most 10,000 of those).",
    ),
    SettingSpec(
        "RETENTION",
        {},
        "How long finished jobs are kept, per final status and per queue: "
        '{"succeeded": 86400, "dead_letter": timedelta(days=30), "queues": {"emails": '
        '{"succeeded": 0}}}; a status left out keeps RETENTION_SECONDS (succeeded, '
        "cancelled) or DEAD_LETTER_RETENTION_SECONDS.",
    ),
    SettingSpec(
        "HISTORY_PERIOD",
        "day",
        "Time one partition of the job history covers: hour, day or week (retention drops "
        "whole partitions, so a job is kept up to one period past its retention).",
    ),
    SettingSpec(
        "HISTORY_PREMAKE",
        2,
        "History partitions housekeeping keeps made ahead of the current one.",
    ),
    SettingSpec(
        "SEGMENT_JOBS",
        100_000,
        "With the job table in segments (manage.py pgqueuesegments): job ids given to a "
        "segment before housekeeping attaches the next one and points new jobs at it.",
    ),
    SettingSpec(
        "SEGMENT_LIMIT",
        8,
        "With the job table in segments: older segments still holding jobs at most; at "
        "the limit no new segment is attached until one empties.",
    ),
    SettingSpec(
        "UNKNOWN_TASK_TIMEOUT_SECONDS",
        3600.0,
        "How long a job whose task no worker can import waits before it is dead-lettered.",
    ),
    SettingSpec("NOTIFY_CHANNEL", "django_pgqueue", "LISTEN/NOTIFY channel for wake-ups."),
    SettingSpec(
        "CONCURRENCY_LIMITS",
        {},
        'Jobs in flight at most, across all workers: {"task:<path>": n, "queue:<name>": n}.',
    ),
    SettingSpec(
        "RATE_LIMITS",
        {},
        'Starts per period at most, across all workers: {"task:<path>": "20/s", ...}.',
    ),
    SettingSpec("PARTITION_VNODES", 32, "Points per worker on the partition hash ring."),
    SettingSpec(
        "METRICS_TOKEN",
        None,
        "Bearer token a scraper sends to the metrics view (None: staff users only).",
    ),
    SettingSpec(
        "STUCK_HANDLER_GRACE_SECONDS",
        300.0,
        "How long a handler may keep running after its timeout or an operator's cancel "
        "before its worker process is replaced (None: never).",
    ),
    SettingSpec(
        "MIDDLEWARE",
        [],
        "Dotted paths of middleware around every attempt (in workers) and every enqueue, "
        "outermost first, in the shape of Django's MIDDLEWARE.",
    ),
)


_DEFAULTS = {spec.name: spec.default for spec in SETTINGS}


class Settings:
    """Typed, validated access to the ``PGQUEUE_*`` settings."""

    def _raw(self, name: str) -> object:
        return getattr(settings, f"PGQUEUE_{name}", _DEFAULTS[name])

    def _int(self, name: str, *, minimum: int, maximum: int | None = None) -> int:
        value = self._raw(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigurationError(f"PGQUEUE_{name} must be an integer, not {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise ConfigurationError(f"PGQUEUE_{name} must be {bound}, not {value!r}")
        return value

    def _seconds(self, name: str, *, minimum: float = 0.0, strict: bool = True) -> float:
        value = self._raw(name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ConfigurationError(f"PGQUEUE_{name} must be a number of seconds, not {value!r}")
        if value < minimum or (strict and value <= minimum):
            relation = ">" if strict else ">="
            raise ConfigurationError(f"PGQUEUE_{name} must be {relation} {minimum}, not {value!r}")
        return float(value)

    def _optional_seconds(self, name: str) -> float | None:
        if self._raw(name) is None:
            return None
        return self._seconds(name)

    @property
    def MAX_ATTEMPTS(self) -> int:  # noqa: N802 - settings are upper case
        """Attempts a job gets when its task sets none."""
        return self._int("MAX_ATTEMPTS", minimum=1, maximum=1000)

    @property
    def MAX_SNOOZES(self) -> int:  # noqa: N802
        """Snoozes a job may ask for when its task sets none."""
        return self._int("MAX_SNOOZES", minimum=0, maximum=MAX_SNOOZES_LIMIT)

    @property
    def MAX_PAYLOAD_BYTES(self) -> int:  # noqa: N802
        """Largest accepted JSON-encoded payload, in bytes."""
        return self._int("MAX_PAYLOAD_BYTES", minimum=1)

    @property
    def RETRY_BASE_SECONDS(self) -> float:  # noqa: N802
        """Backoff after the first failure; it doubles with each further attempt."""
        return self._seconds("RETRY_BASE_SECONDS", strict=False)

    @property
    def RETRY_MAX_SECONDS(self) -> float:  # noqa: N802
        """Cap of the exponential backoff."""
        return self._seconds("RETRY_MAX_SECONDS", strict=False)

    @property
    def RETRY_JITTER(self) -> float:  # noqa: N802
        """Random spread of the backoff, as a fraction in [0, 1]."""
        value = self._seconds("RETRY_JITTER", strict=False)
        if value > 1:
            raise ConfigurationError(f"PGQUEUE_RETRY_JITTER must be between 0 and 1, not {value}")
        return value

    @property
    def LEASE_SECONDS(self) -> float:  # noqa: N802
        """Length of a job lease."""
        return self._seconds("LEASE_SECONDS", minimum=0.1, strict=False)

    @property
    def HEARTBEAT_SECONDS(self) -> float:  # noqa: N802
        """Interval of lease extensions and registry heartbeats."""
        return self._seconds("HEARTBEAT_SECONDS", minimum=0.05, strict=False)

    @property
    def WORKER_TIMEOUT_SECONDS(self) -> float:  # noqa: N802
        """Silence after which a worker is marked dead."""
        return self._seconds("WORKER_TIMEOUT_SECONDS")

    @property
    def POLL_INTERVAL_SECONDS(self) -> float:  # noqa: N802
        """Fallback poll interval."""
        return self._seconds("POLL_INTERVAL_SECONDS", minimum=0.01, strict=False)

    @property
    def CONCURRENCY(self) -> int:  # noqa: N802
        """Jobs one worker process runs at once."""
        return self._int("CONCURRENCY", minimum=1, maximum=10_000)

    @property
    def BATCH_SIZE(self) -> int:  # noqa: N802
        """Most jobs claimed per round trip."""
        return self._int("BATCH_SIZE", minimum=1, maximum=10_000)

    @property
    def PREFETCH(self) -> int:  # noqa: N802
        """Extra jobs held beyond free slots."""
        return self._int("PREFETCH", minimum=0, maximum=100_000)

    @property
    def PREFETCH_WINDOW_SECONDS(self) -> float:  # noqa: N802
        """Adaptive prefetch window (0 turns adaptive prefetch off)."""
        value = self._seconds("PREFETCH_WINDOW_SECONDS", strict=False)
        if value > 60:
            raise ConfigurationError(
                f"PGQUEUE_PREFETCH_WINDOW_SECONDS must be <= 60, not {value!r}"
            )
        return value

    @property
    def LOG_SUMMARY_SECONDS(self) -> float:  # noqa: N802
        """Interval of the worker's summary line (0: no summary)."""
        return self._seconds("LOG_SUMMARY_SECONDS", strict=False)

    @property
    def GRACE_SECONDS(self) -> float:  # noqa: N802
        """Time running jobs get to finish on shutdown."""
        return self._seconds("GRACE_SECONDS", strict=False)

    @property
    def HOUSEKEEPING_INTERVAL_SECONDS(self) -> float:  # noqa: N802
        """Interval between housekeeping passes."""
        return self._seconds("HOUSEKEEPING_INTERVAL_SECONDS")

    @property
    def CLAIM_FLOOR_AFTER_SECONDS(self) -> float | None:  # noqa: N802
        """Claims from the head slower than this start claim floors; None: never."""
        if self._raw("CLAIM_FLOOR_AFTER_SECONDS") is None:
            return None
        return self._seconds("CLAIM_FLOOR_AFTER_SECONDS", strict=False)

    @property
    def RETENTION_SECONDS(self) -> float | None:  # noqa: N802
        """Age after which succeeded and cancelled jobs are pruned; None keeps them."""
        return self._optional_seconds("RETENTION_SECONDS")

    @property
    def DEAD_LETTER_RETENTION_SECONDS(self) -> float | None:  # noqa: N802
        """Age after which dead letters are pruned; None keeps them."""
        return self._optional_seconds("DEAD_LETTER_RETENTION_SECONDS")

    @property
    def PRUNE_BATCH_SIZE(self) -> int:  # noqa: N802
        """Rows per housekeeping batch (deleted, freed or moved)."""
        return self._int("PRUNE_BATCH_SIZE", minimum=1, maximum=1_000_000)

    @property
    def RETENTION(self) -> dict[str, object]:  # noqa: N802
        """PGQUEUE_RETENTION as given, once checked (see :meth:`resolved_retention`)."""
        value = self._raw("RETENTION")
        try:
            parse_retention(value, {})
        except ValueError as error:
            raise ConfigurationError(str(error)) from None
        assert isinstance(value, dict)  # parse_retention refuses anything else
        return dict(value)

    def resolved_retention(self) -> dict[str | None, dict[str, float | None]]:
        """Seconds finished jobs are kept, by queue (None: every other) and final status:
        PGQUEUE_RETENTION over RETENTION_SECONDS (succeeded and cancelled) and
        DEAD_LETTER_RETENTION_SECONDS."""
        finished = self.RETENTION_SECONDS
        defaults = {
            "succeeded": finished,
            "cancelled": finished,
            "dead_letter": self.DEAD_LETTER_RETENTION_SECONDS,
        }
        return parse_retention(self.RETENTION, defaults)

    @property
    def HISTORY_PERIOD(self) -> str:  # noqa: N802
        """Time one history partition covers: ``"hour"``, ``"day"`` or ``"week"``."""
        value = self._raw("HISTORY_PERIOD")
        if value not in HISTORY_PERIODS:
            choices = ", ".join(repr(period) for period in HISTORY_PERIODS)
            raise ConfigurationError(
                f"PGQUEUE_HISTORY_PERIOD must be one of {choices}, not {value!r}"
            )
        return str(value)

    @property
    def HISTORY_PREMAKE(self) -> int:  # noqa: N802
        """History partitions kept made ahead of the current one."""
        return self._int("HISTORY_PREMAKE", minimum=1, maximum=366)

    @property
    def SEGMENT_JOBS(self) -> int:  # noqa: N802
        """Job ids a segment is given before the next one is attached and switched to."""
        return self._int("SEGMENT_JOBS", minimum=1, maximum=1_000_000_000)

    @property
    def SEGMENT_LIMIT(self) -> int:  # noqa: N802
        """Older segments still holding jobs at most."""
        return self._int("SEGMENT_LIMIT", minimum=1, maximum=64)

    @property
    def UNKNOWN_TASK_TIMEOUT_SECONDS(self) -> float:  # noqa: N802
        """How long a job with an unimportable task waits before it is dead-lettered."""
        return self._seconds("UNKNOWN_TASK_TIMEOUT_SECONDS", strict=False)

    @property
    def NOTIFY_CHANNEL(self) -> str:  # noqa: N802
        """LISTEN/NOTIFY channel name."""
        value = self._raw("NOTIFY_CHANNEL")
        if not isinstance(value, str) or not _IDENTIFIER.match(value):
            raise ConfigurationError(
                f"PGQUEUE_NOTIFY_CHANNEL must be a plain SQL identifier, not {value!r}"
            )
        return value

    @property
    def PARTITION_VNODES(self) -> int:  # noqa: N802
        """Points per worker on the partition hash ring."""
        return self._int("PARTITION_VNODES", minimum=1, maximum=1024)

    @property
    def CONCURRENCY_LIMITS(self) -> dict[str, int]:  # noqa: N802
        """Concurrency limits declared in settings, by ``task:<path>`` or ``queue:<name>``."""
        value = self._raw("CONCURRENCY_LIMITS")
        if not isinstance(value, dict):
            raise ConfigurationError(
                f"PGQUEUE_CONCURRENCY_LIMITS must be a dict, not {type(value).__name__}"
            )
        for name, limit in value.items():
            if not isinstance(name, str) or not name.startswith(("task:", "queue:")):
                raise ConfigurationError(
                    f"PGQUEUE_CONCURRENCY_LIMITS: {name!r} must be 'task:<dotted path>' or "
                    "'queue:<name>'"
                )
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ConfigurationError(
                    f"PGQUEUE_CONCURRENCY_LIMITS[{name!r}] must be an integer >= 1, not {limit!r}"
                )
        return dict(value)

    @property
    def RATE_LIMITS(self) -> dict[str, str]:  # noqa: N802
        """Rate limits declared in settings, by ``task:<path>`` or ``queue:<name>``."""
        value = self._raw("RATE_LIMITS")
        if not isinstance(value, dict):
            raise ConfigurationError(
                f"PGQUEUE_RATE_LIMITS must be a dict, not {type(value).__name__}"
            )
        for name, rate in value.items():
            if not isinstance(name, str) or not name.startswith(("task:", "queue:")):
                raise ConfigurationError(
                    f"PGQUEUE_RATE_LIMITS: {name!r} must be 'task:<dotted path>' or 'queue:<name>'"
                )
            try:
                parse_rate(name, rate)
            except InvalidOption as error:
                raise ConfigurationError(f"PGQUEUE_RATE_LIMITS[{name!r}]: {error.reason}") from None
        return dict(value)

    @property
    def METRICS_TOKEN(self) -> str | None:  # noqa: N802
        """Bearer token of the metrics view; None lets only staff users in."""
        value = self._raw("METRICS_TOKEN")
        if value is None:
            return None
        if not isinstance(value, str) or len(value) < 16 or value != value.strip():
            raise ConfigurationError(
                "PGQUEUE_METRICS_TOKEN must be None or a string of 16 characters or more "
                "without surrounding spaces"
            )
        return value

    @property
    def STUCK_HANDLER_GRACE_SECONDS(self) -> float | None:  # noqa: N802
        """Seconds a stuck handler is given before its process is replaced (None: never)."""
        return self._optional_seconds("STUCK_HANDLER_GRACE_SECONDS")

    @property
    def MIDDLEWARE(self) -> list[str]:  # noqa: N802
        """Dotted paths of the middleware around attempts and enqueues, outermost first."""
        value = self._raw("MIDDLEWARE")
        if not isinstance(value, list | tuple) or not all(
            isinstance(path, str) and path for path in value
        ):
            raise ConfigurationError(
                f"PGQUEUE_MIDDLEWARE must be a list of dotted paths, not {value!r}"
            )
        return list(value)

    def problems(self) -> list[tuple[str, str]]:
        """Return ``(setting, message)`` for every invalid setting (used by the checks)."""
        found = []
        for spec in SETTINGS:
            try:
                getattr(self, spec.name)
            except ConfigurationError as error:
                found.append((spec.name, str(error)))
        if not found and self.HEARTBEAT_SECONDS * 2 > self.LEASE_SECONDS:
            found.append(
                (
                    "HEARTBEAT_SECONDS",
                    "PGQUEUE_HEARTBEAT_SECONDS must be at most half of PGQUEUE_LEASE_SECONDS, "
                    "or leases expire between two extensions",
                )
            )
        return found


conf = Settings()
