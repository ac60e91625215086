"""Adaptive prefetch: hold as many waiting jobs as the worker finishes in a short window.

A fixed prefetch is a bet on how long jobs take. Too small, and a worker running
millisecond jobs spends its time on claim round trips for a handful of jobs each; too
large, and a worker whose jobs turn slow sits on jobs that another worker could run.
Sizing the extra from the measured finishing rate wins both ways: at thousands of jobs a
second it reaches ``cap`` (one full batch per claim), and with jobs of a second or more it
is zero, as if there were no prefetch at all.

A measured rate only sees the past, so :attr:`hold_seconds` bounds the bet: a job that
has waited that long for a thread is handed back to the queue (see ``Worker``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

__all__ = ["AdaptivePrefetch"]

#: The rate is measured over the last second: long enough to smooth single batches,
#: short enough that a worker whose jobs stall stops prefetching within a second.
_HORIZON = 1.0
#: The shortest span a rate is read over: a fifth of the horizon, long enough that jobs
#: finishing in bursts (a slow batch ending together) are not read as a steady flood.
_MIN_SPAN = 0.2
#: The shortest span of the quick reading, which the handlers' measured run time bounds
#: (see :meth:`AdaptivePrefetch._rate`): only a guard against dividing by a moment.
_QUICK_SPAN = 0.01


class AdaptivePrefetch:
    """The extra jobs a worker may hold, from its finishing rate over the last second."""

    def __init__(self, window: float, cap: int, concurrency: int = 1) -> None:
        self.window = window
        self.cap = cap
        self.concurrency = concurrency
        # (when, jobs finished, jobs of those that ran, their handlers' total run time)
        self._finished: deque[tuple[float, int, int, float]] = deque()
        self._total = 0
        self._ran = 0
        self._busy = 0.0
        # The recorder thread reports finished jobs while the dispatcher asks for extra.
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Return whether adaptive prefetch is on (a window above zero)."""
        return self.window > 0

    @property
    def hold_seconds(self) -> float:
        """Return how long a job may wait for a thread before it is handed back.

        Twenty windows (one second at the default): far beyond the wait the measured rate
        predicts, so only a worker whose jobs stalled since the claim reaches it.
        """
        return max(1.0, 20 * self.window)

    def finished(
        self, count: int, now: float | None = None, *, run_times: Sequence[float] = ()
    ) -> None:
        """Note that ``count`` jobs finished (their outcomes were recorded).

        ``run_times`` are the handler run times (seconds) of those that ran; jobs given
        back before they started have none.
        """
        if count <= 0 or not self.enabled:
            return
        now = time.monotonic() if now is None else now
        ran = [seconds for seconds in run_times if seconds > 0]
        busy = sum(ran)
        with self._lock:
            self._finished.append((now, count, len(ran), busy))
            self._total += count
            self._ran += len(ran)
            self._busy += busy
            self._expire(now)

    def extra(self, now: float | None = None) -> int:
        """Return how many jobs to hold beyond the free threads and the fixed prefetch."""
        if not self.enabled:
            return 0
        now = time.monotonic() if now is None else now
        with self._lock:
            self._expire(now)
            rate = self._rate(now)
        return min(self.cap, int(rate * self.window))

    def _rate(self, now: float) -> float:
        """Return jobs finished per second, over the time the samples actually cover.

        Dividing by the whole horizon would read a worker that started a burst a tenth of
        a second ago as ten times slower than it is, and a burst of a few seconds would be
        over before prefetch caught up. The first sample's jobs finished before the span
        began, so they are left out of it. With one sample there is no span: the whole
        horizon is the cautious reading.

        Two readings of the span. The cautious one divides by at least ``_MIN_SPAN``, so
        that two outcome batches recorded a moment apart cannot pass for a flood. The quick
        one divides by the span as it is, but never exceeds what ``concurrency`` handlers
        finish at the mean run time measured over the same second: slow jobs ending
        together cannot pass for a flood that way either, since their run times say how
        slow they are. Only short jobs read high quickly, and for them the cautious
        reading would take a fifth of a second to catch up, most of a short burst. The
        rate is the higher of the two.
        """
        if len(self._finished) < 2:
            return self._total / _HORIZON
        first_at, first_count, _, _ = self._finished[0]
        finished = self._total - first_count
        elapsed = now - first_at
        cautious = finished / max(elapsed, _MIN_SPAN)
        if self._ran == 0 or self._busy <= 0:
            return cautious
        handlers = self.concurrency * self._ran / self._busy
        quick = min(finished / max(elapsed, _QUICK_SPAN), handlers)
        return max(cautious, quick)

    def _expire(self, now: float) -> None:
        while self._finished and self._finished[0][0] <= now - _HORIZON:
            _, count, ran, busy = self._finished.popleft()
            self._total -= count
            self._ran -= ran
            self._busy -= busy
        if not self._finished:
            self._busy = 0.0  # no float residue from the subtractions
