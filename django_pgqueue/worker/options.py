"""A worker's options: validated once, before anything starts."""

from __future__ import annotations

import math
import os
import secrets
import socket
from dataclasses import dataclass, field, replace
from typing import Any

from django_pgqueue.compat import task_backends
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.tasks.backend import PgQueueBackend

__all__ = ["WorkerOptions", "default_worker_id"]


def default_worker_id() -> str:
    """Return a fresh worker id: host, pid and a random suffix (unique across restarts)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """Everything a :class:`~django_pgqueue.worker.Worker` needs to know.

    Build it with :meth:`from_settings`, which fills unset values from the ``TASKS``
    backend and the ``PGQUEUE_*`` settings and raises :class:`ConfigurationError` for
    anything invalid.
    """

    backend: str
    database: str
    queues: tuple[str, ...]
    concurrency: int
    prefetch: int
    batch_size: int
    lease_seconds: float
    heartbeat_seconds: float
    poll_interval: float
    grace_seconds: float
    worker_timeout: float
    housekeeping_interval: float
    #: Adaptive prefetch: besides ``prefetch``, hold as many jobs as this worker finishes
    #: in this many seconds at its measured rate (at most ``batch_size``); 0 turns it off.
    prefetch_window: float = 0.0
    burst: bool = False
    max_jobs: int | None = None
    worker_id: str = field(default_factory=default_worker_id)
    #: Install SIGTERM/SIGINT handlers (only possible in the main thread).
    handle_signals: bool = True
    #: Run housekeeping passes (reaping, pruning) when this worker wins the lock.
    housekeeping: bool = True
    #: Sync the periodic schedules at start and fire them when due (every worker may:
    #: the database lets one job per fire time through).
    schedules: bool = True
    #: Log how many jobs finished, by outcome, this often (seconds, at INFO); 0: never.
    log_summary_seconds: float = 0.0

    @classmethod
    def from_settings(cls, *, backend: str = "default", **overrides: Any) -> WorkerOptions:
        """Return validated options; ``overrides`` set to None fall back to settings."""

        if backend not in task_backends.settings:
            raise ConfigurationError(f"--backend {backend!r} is not a key of TASKS")
        queue_backend = task_backends[backend]
        if not isinstance(queue_backend, PgQueueBackend):
            raise ConfigurationError(
                f"TASKS[{backend!r}] uses {type(queue_backend).__name__}, not PgQueueBackend"
            )
        values: dict[str, Any] = {
            "backend": backend,
            "database": queue_backend.database,
            "queues": tuple(sorted(queue_backend.queues)),
            "concurrency": conf.CONCURRENCY,
            "prefetch": conf.PREFETCH,
            "prefetch_window": conf.PREFETCH_WINDOW_SECONDS,
            "batch_size": conf.BATCH_SIZE,
            "lease_seconds": conf.LEASE_SECONDS,
            "heartbeat_seconds": conf.HEARTBEAT_SECONDS,
            "poll_interval": conf.POLL_INTERVAL_SECONDS,
            "grace_seconds": conf.GRACE_SECONDS,
            "worker_timeout": conf.WORKER_TIMEOUT_SECONDS,
            "housekeeping_interval": conf.HOUSEKEEPING_INTERVAL_SECONDS,
            "log_summary_seconds": conf.LOG_SUMMARY_SECONDS,
        }
        values.update({key: value for key, value in overrides.items() if value is not None})
        if "lease_seconds" in overrides and "heartbeat_seconds" not in overrides:
            # A shorter lease needs more frequent extensions.
            values["heartbeat_seconds"] = min(
                values["heartbeat_seconds"], values["lease_seconds"] / 3
            )
        values["queues"] = tuple(dict.fromkeys(values["queues"]))
        options = cls(**values)
        options.validate(allowed_queues=queue_backend.queues)
        return options

    def validate(self, *, allowed_queues: set[str] | frozenset[str] | None = None) -> None:
        """Raise :class:`ConfigurationError` naming the first invalid option."""
        if not self.queues:
            raise ConfigurationError("at least one --queue is needed")
        if allowed_queues:
            unknown = [queue for queue in self.queues if queue not in allowed_queues]
            if unknown:
                raise ConfigurationError(
                    f"--queue {unknown[0]!r} is not in TASKS[{self.backend!r}]['QUEUES'] "
                    f"({', '.join(sorted(allowed_queues))})"
                )
        _positive_int("--concurrency", self.concurrency, maximum=10_000)
        _positive_int("--batch-size", self.batch_size, maximum=10_000)
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ConfigurationError(f"--prefetch must be 0 or more, not {self.prefetch!r}")
        if (
            isinstance(self.prefetch_window, bool)
            or not isinstance(self.prefetch_window, int | float)
            or not math.isfinite(self.prefetch_window)
            or not 0 <= self.prefetch_window <= 60
        ):
            raise ConfigurationError(
                f"--prefetch-window must be 0 to 60 seconds, not {self.prefetch_window!r}"
            )
        if self.max_jobs is not None:
            _positive_int("--max-jobs", self.max_jobs)
        _positive_seconds("--lease-seconds", self.lease_seconds)
        _positive_seconds("--poll-interval", self.poll_interval)
        _positive_seconds("heartbeat interval", self.heartbeat_seconds)
        _positive_seconds("worker timeout", self.worker_timeout)
        _positive_seconds("housekeeping interval", self.housekeeping_interval)
        if (
            not isinstance(self.grace_seconds, int | float)
            or not math.isfinite(self.grace_seconds)
            or self.grace_seconds < 0
        ):
            raise ConfigurationError(
                f"--grace-seconds must be 0 or more, not {self.grace_seconds!r}"
            )
        if (
            isinstance(self.log_summary_seconds, bool)
            or not isinstance(self.log_summary_seconds, int | float)
            or not math.isfinite(self.log_summary_seconds)
            or self.log_summary_seconds < 0
        ):
            raise ConfigurationError(
                f"the log summary interval must be 0 or more seconds, not "
                f"{self.log_summary_seconds!r}"
            )
        if self.heartbeat_seconds * 2 > self.lease_seconds:
            raise ConfigurationError(
                f"the heartbeat ({self.heartbeat_seconds}s) must be at most half the lease "
                f"({self.lease_seconds}s), or leases expire between extensions"
            )
        if not self.worker_id or len(self.worker_id) > 200 or "\x00" in self.worker_id:
            raise ConfigurationError("--worker-id must be 1 to 200 characters")

    def with_changes(self, **changes: Any) -> WorkerOptions:
        """Return a validated copy with some options changed."""
        options = replace(self, **changes)
        options.validate()
        return options


def _positive_int(flag: str, value: object, *, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{flag} must be a whole number of at least 1, not {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigurationError(f"{flag} must be at most {maximum}, not {value!r}")


def _positive_seconds(flag: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{flag} must be a positive number of seconds, not {value!r}")
