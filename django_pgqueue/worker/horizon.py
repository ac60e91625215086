"""Saying why claims from the head became slow: what holds VACUUM back.

A claim from the head of a queue slows down when the index entries of claimed jobs can
be neither marked dead nor vacuumed, which is what an old snapshot elsewhere does. The
worker then claims from floors (:mod:`.cursor`) and keeps its pace, so nothing else
would tell an operator that the job table is growing: this logs a warning naming the
oldest holder (``vacuum_horizon``), at most once per :data:`WARN_EVERY` seconds.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from django_pgqueue.store.reports import SnapshotHolder
from django_pgqueue.worker.logfields import CLAIM_SECONDS, HORIZON_AGE, HORIZON_PID, WORKER

__all__ = ["MIN_HOLD_SECONDS", "WARN_EVERY", "SlowClaimWarning", "describe"]

logger = logging.getLogger("django_pgqueue.worker")

#: Seconds between two warnings of one worker: enough to say it, not to flood the logs.
WARN_EVERY = 300.0
#: A holder open for less than this is named as the cause of nothing: in a busy database
#: the oldest snapshot is most of the time a statement of a few milliseconds.
MIN_HOLD_SECONDS = 10.0


def describe(holder: SnapshotHolder) -> str:
    """Return a holder in a few words: what it is, since when, and where it runs."""
    parts = [holder.kind]
    if holder.pid is not None:
        parts.append(str(holder.pid))
    if holder.name:
        parts.append(f"({holder.name!r})")
    details = [
        detail
        for detail in (
            holder.state,
            f"role {holder.role}" if holder.role else None,
            holder.client,
            f"open {holder.age_seconds:.0f}s" if holder.age_seconds is not None else None,
            f"{holder.xid_age} transactions behind",
        )
        if detail
    ]
    return " ".join(parts) + ", " + ", ".join(details)


class SlowClaimWarning:
    """One worker's warnings about slow claims from the head, rate-limited."""

    def __init__(
        self,
        every: float = WARN_EVERY,
        clock: Callable[[], float] = time.monotonic,
        min_hold: float = MIN_HOLD_SECONDS,
    ):
        self._every = every
        self._clock = clock
        self._min_hold = min_hold
        self._warned_at = -math.inf

    def due(self, seconds: float, slow_after: float | None) -> bool:
        """Return whether a claim from the head that took ``seconds`` calls for a warning."""
        if slow_after is None or seconds < slow_after:
            return False
        return self._clock() - self._warned_at >= self._every

    def warn(self, worker_id: str, seconds: float, holder: SnapshotHolder | None) -> None:
        """Log the warning for a slow claim, naming ``holder`` (None: none is visible)."""
        self._warned_at = self._clock()
        if (
            holder is not None
            and holder.age_seconds is not None
            and holder.age_seconds < self._min_hold
        ):
            holder = None
        if holder is None:
            cause = (
                f"no transaction open for {self._min_hold:g}s or more holds back VACUUM (of "
                "those this database role can see: a role in pg_read_all_stats sees every "
                "session); the claim may have walked dead entries VACUUM has not reached "
                "yet, or the database is busy"
            )
        else:
            cause = f"VACUUM is held back by {describe(holder)}"
            if holder.query:
                cause += f", last statement: {holder.query[:120]!r}"
        consequence = (
            "the job table's dead tuples cannot be removed until that transaction ends"
            if holder is not None
            else "the job table's next VACUUM removes them"
        )
        logger.warning(
            "worker %s: a claim from the head of the queue took %.3fs; %s. Claims continue "
            "from this worker's last jobs (claim floors), and %s.",
            worker_id,
            seconds,
            cause,
            consequence,
            extra={
                WORKER: worker_id,
                CLAIM_SECONDS: seconds,
                HORIZON_PID: holder.pid if holder else None,
                HORIZON_AGE: holder.age_seconds if holder else None,
            },
        )
