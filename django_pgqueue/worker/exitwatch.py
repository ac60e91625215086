"""Keep a stuck outcome write from holding a worker's shutdown past its grace period.

An outcome write can wait as long as a row lock it needs is held: another session's
open transaction on the job's row (an operator's ``SELECT ... FOR UPDATE`` in a shell,
a long admin action) holds it for as long as that transaction lasts. While a stopping
worker waits on such a write it cannot release its running jobs nor exit, and the
orchestrator's SIGKILL ends it at the end of its own timeout.

So while a worker shuts down, this watchdog cancels (``pg_cancel_backend`` through
libpq's cancel request) the write on the recorder's connection once the grace period is
over (or a second signal said "stop now") and the write has run for at least
:data:`WRITE_ALLOWANCE_SECONDS`. A write that merely started late gets that long; a
stuck one is cancelled. A cancelled write records nothing: its jobs keep their leases
and come back when those expire, as after SIGKILL, with their attempts counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["WRITE_ALLOWANCE_SECONDS", "OverdueWriteWatchdog"]

logger = logging.getLogger("django_pgqueue.worker")

#: The least time a write gets before the watchdog may cancel it.
WRITE_ALLOWANCE_SECONDS = 2.0

#: How often the watchdog looks.
_POLL_SECONDS = 0.1


class OverdueWriteWatchdog:
    """While entered, cancel an outcome write that outlives the grace period.

    ``write_started`` returns the monotonic time the current write began, or None when
    none runs; ``cancel`` cancels the statement running on the writer's connection (and
    returns whether one was running); ``stop_now`` says the grace period was cut short.
    """

    def __init__(
        self,
        *,
        grace_ends: float,
        write_started: Callable[[], float | None],
        cancel: Callable[[], bool],
        stop_now: Callable[[], bool],
        name: str = "pgqueue-exit-watchdog",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._grace_ends = grace_ends
        self._write_started = write_started
        self._cancel = cancel
        self._stop_now = stop_now
        self._clock = clock
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self.cancelled = 0

    def overdue(self) -> bool:
        """Return whether the write running now (if any) should be cancelled."""
        started = self._write_started()
        if started is None:
            return False
        now = self._clock()
        if now < started + WRITE_ALLOWANCE_SECONDS:
            return False
        return now >= self._grace_ends or self._stop_now()

    def __enter__(self) -> OverdueWriteWatchdog:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._done.wait(_POLL_SECONDS):
            if not self.overdue():
                continue
            try:
                cancelled = self._cancel()
            except Exception:
                logger.exception("cancelling an overdue outcome write failed")
                continue
            if cancelled:
                self.cancelled += 1
                logger.warning(
                    "an outcome write still waited after the grace period: cancelled it; "
                    "its jobs come back when their leases expire"
                )
