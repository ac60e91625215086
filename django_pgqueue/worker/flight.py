"""One attempt a worker holds, from claim until its outcome is recorded, and who runs it.

The dispatcher, the thread pool, the event loop, a batch gathering mates, the heartbeat
and the shutdown all act on the same :class:`InFlight`; the start lock decides, once,
whether an attempt runs on its own, runs in a batch, or is handed back.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field

from django_pgqueue.store.values import ClaimedJob
from django_pgqueue.worker.resolver import TaskEntry

__all__ = ["InFlight", "Start"]


#: Guards the one moment an attempt either starts or is withdrawn (see InFlight.begin):
#: shared by all attempts, held for two attribute reads and a write.
_START_LOCK = threading.Lock()


@dataclass(slots=True, eq=False)
class InFlight:
    """One attempt this worker holds a lease on, from claim until its outcome is recorded.

    Keyed by :attr:`key` (job id and lease generation), never by job id alone: the same
    process may hold a new attempt of a job while an older attempt's handler still runs
    (the process was paused past its lease, say), and the two must not touch each
    other's bookkeeping.
    """

    job: ClaimedJob
    entry: TaskEntry | None
    claimed_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    deadline: float | None = None
    #: The worker gave up on the attempt (lease lost, released at shutdown): whatever
    #: its handler returns later is dropped, never written.
    abandoned: bool = False
    #: The handler ran past its timeout and has been asked to stop; it keeps its lease,
    #: slot and partition until it returns, and then the attempt fails with JobTimeout.
    overdue: bool = False
    #: Its handler is still running (or queued to run) in this process.
    busy: bool = True
    #: An atomic task's completion is written and its transaction is committing. From
    #: then on the row may read finished before :attr:`committed` is set: a heartbeat
    #: that finds it so has not lost the lease.
    committing: bool = False
    #: An atomic task's transaction committed its completion: the attempt is over.
    committed: bool = False
    #: An operator asked to cancel the job while this attempt held it: its handler is
    #: asked to stop, it keeps its lease (and its slot and partition turn) until the
    #: handler returns, and its outcome is recorded as cancelled.
    cancel_requested: bool = False
    #: Since when (time.monotonic) the handler runs although asked to stop (past its
    #: timeout, or cancelled by an operator): a stuck handler, reported and, after
    #: PGQUEUE_STUCK_HANDLER_GRACE_SECONDS, the reason its process is replaced.
    stuck_since: float | None = None
    #: Until when (time.monotonic) the lease is surely held: a moment taken before the
    #: claim (or the last extension) was sent, plus the lease length. Local clock only.
    lease_valid_until: float = float("inf")
    #: Run inside another attempt's handler call (a batched task's batch), not on its
    #: own: takes no slot of its own, and the thread that dequeues it skips it.
    mate: bool = False
    #: Its lease may have run out before a thread could start it: it is given back.
    expired_unstarted: bool = False
    #: Made on first use (see :attr:`cancel`): most attempts never need one.
    _cancel: threading.Event | None = None

    @property
    def cancel(self) -> threading.Event:
        """Return the event that asks this attempt's handler to stop.

        Made when first asked for (by a task that takes a context, or by the worker
        cancelling the attempt), under the start lock so both get the same event. An
        event per job cost a twentieth of a worker's time running no-op jobs.
        """
        event = self._cancel
        if event is None:
            with _START_LOCK:
                if self._cancel is None:
                    self._cancel = threading.Event()
                event = self._cancel
        return event

    def begin(self) -> bool:
        """Mark the handler as starting, unless the attempt was withdrawn or abandoned.

        A thread about to run the job and the dispatcher handing the job back (a stale
        prefetch, a shutdown) race for the same attempt: exactly one of :meth:`begin` and
        :meth:`withdraw` wins, so a job handed back never also runs here.
        """
        return self.start() is Start.RUN

    def start(self) -> Start:
        """Decide, under the start lock, what the thread that dequeued this attempt does.

        Run it; drop it (withdrawn or abandoned); skip it (it runs in another job's
        batch); or give it back unstarted, its lease having possibly run out while it
        waited (then no batch may take it either).
        """
        with _START_LOCK:
            if self.mate:
                return Start.BATCHED
            if self.abandoned or self.started_at is not None:
                return Start.GONE
            now = time.monotonic()
            if now >= self.lease_valid_until:
                self.expired_unstarted = True
                return Start.EXPIRED
            self.started_at = now
            return Start.RUN

    def join_batch(self, started_at: float) -> bool:
        """Take this waiting attempt into a batch starting at ``started_at``.

        Wins or loses against :meth:`start` and :meth:`withdraw` under the same lock:
        an attempt either runs on its own, runs in one batch, or is handed back.
        """
        with _START_LOCK:
            if self.abandoned or self.started_at is not None or self.expired_unstarted:
                return False
            if time.monotonic() >= self.lease_valid_until:
                return False
            self.mate = True
            self.started_at = started_at
            return True

    def withdraw(self) -> bool:
        """Abandon the attempt if its handler has not started; return whether it had not."""
        with _START_LOCK:
            if self.started_at is not None or self.abandoned:
                return False
            self.abandoned = True
            return True

    def lease_may_have_expired(self) -> bool:
        """Return whether the lease may have run out (the process was paused, say).

        A handler is not started then: the job may already run elsewhere.
        """
        return time.monotonic() >= self.lease_valid_until

    @property
    def key(self) -> tuple[int, int]:
        """Return (job id, lease generation): this attempt's identity."""
        return (self.job.id, self.job.lease_generation)


class Start(enum.Enum):
    """What the thread that dequeued an attempt does with it (see :meth:`InFlight.start`)."""

    RUN = "run"
    GONE = "gone"  # withdrawn or abandoned: its outcome is "lost"
    BATCHED = "batched"  # another job's batch runs it: nothing to do
    EXPIRED = "expired"  # its lease may have run out: give it back unstarted
