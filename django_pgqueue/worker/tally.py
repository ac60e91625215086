"""The worker's summary line: how many attempts finished, by outcome, since the last one.

At the default verbosity a worker does not write a line per job: at tens of thousands of
jobs a second, formatting and writing two lines per job cost the drain half its speed.
It writes every failure, retry and dead letter as it happens, and this summary every
``LOG_SUMMARY_SECONDS`` instead of the successes. ``-v 2`` (or ``django_pgqueue.jobs``
at DEBUG) adds a line per job start and finish.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django_pgqueue.worker.logfields import INTERVAL, OUTCOMES, WORKER

__all__ = ["OutcomeTally"]

logger = logging.getLogger("django_pgqueue.worker")


class OutcomeTally:
    """Counts of finished attempts by outcome label, logged and reset every ``interval``.

    The recorder counts (:meth:`add`); the dispatcher logs (:meth:`log_if_due`), so the
    line never waits on a database write and a write never waits on the log's handler.
    """

    def __init__(self, worker_id: str, interval: float) -> None:
        self.worker_id = worker_id
        self.interval = interval
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._due = self._since + interval if interval > 0 else float("inf")

    def add(self, label: str, count: int = 1) -> None:
        """Count ``count`` attempts that ended with ``label`` ("succeeded", ...)."""
        with self._lock:
            self._counts[label] = self._counts.get(label, 0) + count

    def log_if_due(self, now: float | None = None) -> None:
        """Log the summary if its interval is over (and anything finished in it)."""
        now = time.monotonic() if now is None else now
        if now >= self._due:
            self.log(now)

    def log(self, now: float | None = None) -> None:
        """Log the summary now (if it is on and anything finished since), and reset it."""
        now = time.monotonic() if now is None else now
        with self._lock:
            counts, self._counts = self._counts, {}
        seconds = now - self._since
        self._since = now
        if self.interval > 0:
            self._due = now + self.interval
        total = sum(counts.values())
        if not total or self.interval <= 0 or not logger.isEnabledFor(logging.INFO):
            return
        outcomes = "; ".join(
            f"{count:,} {label}"
            for label, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        )
        extra: dict[str, Any] = {WORKER: self.worker_id, OUTCOMES: counts, INTERVAL: seconds}
        logger.info(
            "worker %s: %s finished in the last %.1fs (%s/s): %s",
            self.worker_id,
            f"{total:,} job" if total == 1 else f"{total:,} jobs",
            seconds,
            _rate(total, seconds),
            outcomes,
            extra=extra,
        )


def _rate(count: int, seconds: float) -> str:
    rate = count / max(seconds, 1e-9)
    return f"{rate:,.1f}" if rate < 10 else f"{rate:,.0f}"
