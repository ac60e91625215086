"""The context a ``takes_context=True`` task receives while a worker runs it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django_pgqueue.compat import TaskContext, task_backends
from django_pgqueue.states import JobStatus

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
    confirmed it), else None. ``dependency_results`` are the return values of the jobs
    this one was enqueued ``after=`` (in that order), ``previous_result`` the first of
    them (a chain step's predecessor); both read the database on first use (from an
    async task, use ``await context.adependency_results()``).
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
    _dependency_cache: list[list[Any]] = field(default_factory=list, repr=False)

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

    @property
    def dependency_results(self) -> list[Any]:
        """Return the results of the jobs this one runs after, in ``after=`` order.

        A blocker that did not succeed (policy "run") contributes None; one deleted
        since (pruned) is missing.
        """
        if not self._dependency_cache:
            self._dependency_cache.append(_load_dependency_results(self))
        return self._dependency_cache[0]

    @property
    def previous_result(self) -> Any:
        """Return the first of :attr:`dependency_results` (None if there is none)."""
        results = self.dependency_results
        return results[0] if results else None

    async def adependency_results(self) -> list[Any]:
        """Return :attr:`dependency_results`, from an async task."""
        from asgiref.sync import sync_to_async

        return await sync_to_async(lambda: self.dependency_results)()

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


def _load_dependency_results(context: JobContext) -> list[Any]:
    from django_pgqueue.models import Dependency

    alias = getattr(task_backends[context.task_result.backend], "database", "default")
    rows = (
        Dependency.objects.using(alias)
        .filter(job_id=context.job_id)
        .order_by("position")
        .values_list("blocker__status", "blocker__result")
    )
    return [result if status == JobStatus.SUCCEEDED else None for status, result in rows]
