"""The context a ``takes_context=True`` task receives while a worker runs it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .compat import TaskContext

__all__ = ["JobContext"]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):  # type: ignore[type-arg, misc]  # stubs: not frozen
    """Django's ``TaskContext`` plus what a durable job needs.

    ``attempt`` is the attempt being run (1 on the first run), counted by the database at
    claim time. ``step`` is the progress marker the job recorded last (None at first): a
    multi-step task resumes after it. ``cancelled`` turns true when the worker gave up on
    the job: an operator cancelled it while it ran, its lease was lost (expired and
    recovered, or taken over), its timeout passed, or the worker is shutting down past its
    grace period. A long sync task should check it and stop early (an async task gets
    ``asyncio.CancelledError`` as well); whatever it returns after a cancel or a lost
    lease is not recorded. ``schedule`` and
    ``fire_time`` are set for a job a periodic schedule enqueued: the schedule's name and
    the fire time the job is for (aware UTC; for a "run now" job, when the operator
    confirmed it), else None.
    """

    job_id: int
    attempts: int
    lease_generation: int
    worker_id: str
    initial_step: str | None = None
    schedule: str | None = None
    fire_time: datetime | None = None
    _cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)
    _record_step: Callable[[str | None], None] | None = field(default=None, repr=False)
    _step_holder: list[str | None] = field(default_factory=list, repr=False)

    @property
    def attempt(self) -> int:
        """Return the number of the attempt being run (1 for the first)."""
        return self.attempts

    @property
    def step(self) -> str | None:
        """Return the progress marker recorded last (by this run or an earlier one)."""
        return self._step_holder[-1] if self._step_holder else self.initial_step

    @property
    def cancelled(self) -> bool:
        """Return whether the worker gave up on this job; stop as soon as you can."""
        return self._cancel_event.is_set()

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Sleep until cancelled or ``timeout`` passes; return whether it was cancelled."""
        return self._cancel_event.wait(timeout)

    def set_step(self, step: str | None) -> None:
        """Record progress durably, so a retry can resume after ``step``.

        The write is fenced by this attempt's lease: it raises
        :class:`~django_pgqueue.exceptions.LeaseLost` if another worker owns the job now.
        """
        if self._record_step is not None:
            self._record_step(step)
        self._step_holder.append(step)

    def cancel(self) -> None:
        """Signal the task to stop (called by the worker)."""
        self._cancel_event.set()

    def __reduce__(self) -> Any:  # pragma: no cover - contexts never leave the process
        raise TypeError("JobContext cannot be pickled")
