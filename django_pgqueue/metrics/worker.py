"""Metrics of worker processes, served by ``runqueueworker --metrics-port``.

One process: its metrics live in memory and it serves them itself. With ``--processes``,
prometheus_client's multiprocess mode: each child writes its values to files under
``PROMETHEUS_MULTIPROC_DIR`` and the supervisor serves them summed over the children, on
one port (counters and histograms add up; in-flight adds the live children only). The
alternative, one port per child, would need Prometheus to know every port and lose a
child's counts when it is replaced; the summed view keeps them.
"""

from __future__ import annotations

import os
import threading
from typing import Final

from django_pgqueue.metrics._client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from django_pgqueue.store.values import ClaimedJob
from django_pgqueue.worker import observe

__all__ = ["OUTCOMES", "WorkerMetrics", "serve_worker_metrics"]

#: The worker's outcome labels (as logged) and their metric label.
OUTCOMES: Final = {
    "succeeded": "succeeded",
    "failed, will retry": "failed",
    "dead-lettered": "dead_lettered",
    "released": "released",
    "snoozed": "snoozed",
    "abandoned": "abandoned",
    "lease lost": "lease_lost",
    "release refused (lease lost)": "lease_lost",
    "failed (lease lost)": "lease_lost",
    "snooze refused (lease lost)": "lease_lost",
    "not recorded": "not_recorded",
}

#: Job durations: from a few milliseconds to the default lease's multiples.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
#: Claim round trips: a claim is a millisecond or two on a healthy database.
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class WorkerMetrics:
    """The Prometheus metrics of a worker process, fed by :mod:`..worker.observe` events."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        job = ["queue", "task"]
        self.started = Counter(
            "pgqueue_worker_jobs_started",
            "Attempts this worker started.",
            job,
            registry=self.registry,
        )
        self.finished = Counter(
            "pgqueue_worker_jobs_finished",
            "Attempts this worker finished, by outcome (succeeded, failed, dead_lettered, "
            "released, snoozed, cancelled, abandoned, lease_lost, not_recorded).",
            [*job, "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "pgqueue_worker_job_duration_seconds",
            "Run time of the attempts this worker finished.",
            job,
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.claim = Histogram(
            "pgqueue_worker_claim_seconds",
            "Round trip of one claim (the statement and its result).",
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )
        self.claimed_jobs = Counter(
            "pgqueue_worker_claimed_jobs", "Jobs this worker claimed.", registry=self.registry
        )
        self.in_flight = Gauge(
            "pgqueue_worker_jobs_in_flight",
            "Attempts started and not yet recorded.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.extended = Counter(
            "pgqueue_worker_lease_extensions",
            "Leases extended by the heartbeat.",
            registry=self.registry,
        )
        self.lost = Counter(
            "pgqueue_worker_leases_lost",
            "Leases found taken over by another worker (the attempt was abandoned).",
            registry=self.registry,
        )
        self.stuck = Gauge(
            "pgqueue_worker_stuck_handlers",
            "Handlers still running although asked to stop (past their timeout, or "
            "cancelled): Python cannot stop their threads; past "
            "PGQUEUE_STUCK_HANDLER_GRACE_SECONDS the process is replaced.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self._running: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def job_started(self, job: ClaimedJob) -> None:
        """Count the start and the attempt in flight."""
        self.started.labels(job.queue, job.task_path).inc()
        with self._lock:
            self._running.add((job.id, job.lease_generation))
        self.in_flight.inc()

    def job_finished(self, job: ClaimedJob, outcome: str, duration: float) -> None:
        """Count the outcome and the duration; the attempt leaves the in-flight gauge."""
        label = OUTCOMES.get(outcome, outcome.replace(" ", "_"))
        self.finished.labels(job.queue, job.task_path, label).inc()
        with self._lock:
            # Attempts that never started (a task no worker can import) were not counted.
            was_running = (job.id, job.lease_generation) in self._running
            self._running.discard((job.id, job.lease_generation))
        if was_running:
            self.in_flight.dec()
            self.duration.labels(job.queue, job.task_path).observe(duration)

    def claimed(self, jobs: int, seconds: float) -> None:
        """Record a claim's round trip and the jobs it returned."""
        self.claim.observe(seconds)
        if jobs:
            self.claimed_jobs.inc(jobs)

    def leases_extended(self, count: int) -> None:
        """Count lease extensions."""
        if count:
            self.extended.inc(count)

    def leases_lost(self, count: int) -> None:
        """Count leases lost."""
        if count:
            self.lost.inc(count)

    def stuck_handlers(self, count: int) -> None:
        """Set the number of stuck handlers (each heartbeat)."""
        self.stuck.set(count)

    def process_exited(self, pid: int) -> None:
        """Drop a dead child's live gauges (multiprocess mode only)."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def serve_worker_metrics(port: int, addr: str = "0.0.0.0") -> WorkerMetrics:  # noqa: S104
    """Install :class:`WorkerMetrics` for this process and serve them on ``addr:port``.

    In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set, see
    :func:`.multiproc.prepare_multiprocess_dir`), the served registry sums the files of
    every process. Forked children close the listening socket: only this process serves.
    Raises ``OSError`` when the port is taken.
    """
    metrics = WorkerMetrics()
    served = metrics.registry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        served = CollectorRegistry()
        multiprocess.MultiProcessCollector(served)  # type: ignore[no-untyped-call]
    server, _thread = start_http_server(port, addr=addr, registry=served)
    os.register_at_fork(after_in_child=server.socket.close)
    observe.install(metrics)
    return metrics
