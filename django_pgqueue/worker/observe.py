"""What a worker process reports as it works, for whoever listens (metrics, by default no one).

The worker calls :data:`current` at a handful of points: a job started, an attempt's
outcome recorded, a claim round trip, leases extended or lost, a child process gone.
Nothing listens unless ``runqueueworker --metrics-port`` installs
:class:`django_pgqueue.metrics.worker.WorkerMetrics`; the default does nothing, so a
worker without the metrics extra pays one no-op call per event.

It is process-wide, like ``prometheus_client``'s own registry: a ``--processes`` child
forked from the supervisor inherits it.
"""

from __future__ import annotations

from typing import Protocol

from django_pgqueue.store.values import ClaimedJob

__all__ = ["NullObserver", "WorkerObserver", "current", "install"]


class WorkerObserver(Protocol):
    """The events a worker process reports."""

    def job_started(self, job: ClaimedJob) -> None:
        """A claimed job's handler is about to run."""

    def job_finished(self, job: ClaimedJob, outcome: str, duration: float) -> None:
        """An attempt's outcome was recorded (``outcome`` as the worker logs it)."""

    def claimed(self, jobs: int, seconds: float) -> None:
        """A claim round trip returned ``jobs`` jobs after ``seconds``."""

    def leases_extended(self, count: int) -> None:
        """A heartbeat extended ``count`` leases."""

    def leases_lost(self, count: int) -> None:
        """``count`` leases were found taken over (the attempts are abandoned)."""

    def process_exited(self, pid: int) -> None:
        """A ``--processes`` child exited (the supervisor reports it)."""

    def stuck_handlers(self, count: int) -> None:
        """``count`` handlers run on although asked to stop (each heartbeat reports it)."""


class NullObserver:
    """Listens to nothing."""

    def job_started(self, job: ClaimedJob) -> None:
        """Do nothing."""

    def job_finished(self, job: ClaimedJob, outcome: str, duration: float) -> None:
        """Do nothing."""

    def claimed(self, jobs: int, seconds: float) -> None:
        """Do nothing."""

    def leases_extended(self, count: int) -> None:
        """Do nothing."""

    def leases_lost(self, count: int) -> None:
        """Do nothing."""

    def process_exited(self, pid: int) -> None:
        """Do nothing."""

    def stuck_handlers(self, count: int) -> None:
        """Do nothing."""


#: The observer of this process; replace it with :func:`install`.
current: WorkerObserver = NullObserver()


def install(observer: WorkerObserver) -> None:
    """Make ``observer`` receive this process's worker events (and its forked children's)."""
    global current  # noqa: PLW0603
    current = observer
