"""A Prometheus collector that reads the queue's state from the database at scrape time.

Only the queue manager runs SQL: every figure comes from a read-only statement of
``sql/admin.sql`` (``known_queues``, ``queue_lag``, ``job_table_health``,
``vacuum_horizon``) or
``sql/metrics.sql`` (``queue_finished_totals``, ``queue_workers``), or ``sql/flow.sql``
(``paused_queues``). None of them scans
the job table: depths go through partial indexes and stop counting at ``count_limit``.

Jobs in a terminal status other than dead letters (succeeded, cancelled) are not counted
per queue: that would read every finished row. The finished-job figures come from the
workers' per-minute counters instead, as totals over recent windows (gauges, not
counters: the database prunes old minutes, so a monotonic total cannot be rebuilt from it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from django_pgqueue.compat import task_backends
from django_pgqueue.conf import conf
from django_pgqueue.metrics._client import Collector, GaugeMetricFamily, Metric
from django_pgqueue.tasks.backend import PgQueueBackend

__all__ = ["COUNT_LIMIT", "WINDOWS", "DatabaseQueues", "QueueCollector", "pgqueue_databases"]

#: Depth and dead-letter counts stop here (exported as ``pgqueue_count_limit``).
COUNT_LIMIT = 100_000
#: The windows of the finished-job totals: (metric suffix, minutes).
WINDOWS: tuple[tuple[str, int], ...] = (("5m", 5), ("1h", 60))


@dataclass(frozen=True, slots=True)
class DatabaseQueues:
    """A database that ``TASKS`` backends use, and the queues they configure on it."""

    alias: str
    configured: frozenset[str]


def pgqueue_databases() -> list[DatabaseQueues]:
    """Return every database a ``PgQueueBackend`` of ``TASKS`` uses, with its queues."""

    queues: dict[str, set[str]] = {}
    for alias in task_backends.settings:
        backend = task_backends[alias]
        if isinstance(backend, PgQueueBackend):
            queues.setdefault(backend.database, set()).update(backend.queues)
    return [DatabaseQueues(alias, frozenset(names)) for alias, names in sorted(queues.items())]


class QueueCollector(Collector):
    """Collect every queue's depth, lag, throughput and workers, and the job table's health.

    Each scrape runs five read-only statements per database (see the module docstring).
    Database errors propagate: a failed scrape is better than a silent gap of zeros.
    """

    def __init__(
        self,
        databases: Sequence[DatabaseQueues] | None = None,
        *,
        count_limit: int | None = None,
    ) -> None:
        self._databases = databases
        self.count_limit = COUNT_LIMIT if count_limit is None else count_limit

    def describe(self) -> Iterable[Metric]:
        """Return nothing: metrics are only known at scrape time (no query at registration)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Query each database and yield the metric families."""
        families = _Families()
        for database in self._databases if self._databases is not None else pgqueue_databases():
            self._collect_database(database, families)
        yield from families.all()

    def _collect_database(self, database: DatabaseQueues, families: _Families) -> None:
        from django_pgqueue.models import Job

        started = time.perf_counter()
        store = Job.objects.store(database.alias)
        alias = database.alias
        queues = store.known_queues(database.configured)
        for lag in store.queue_lag(queues, count_limit=self.count_limit):
            labels = [alias, lag.queue]
            pending = lag.ready + lag.scheduled + lag.unknown_task
            families.jobs.add_metric([*labels, "pending"], pending)
            families.jobs.add_metric([*labels, "blocked"], lag.blocked)
            families.jobs.add_metric([*labels, "processing"], lag.processing)
            families.jobs.add_metric([*labels, "dead_letter"], lag.dead_letters)
            families.ready.add_metric(labels, lag.ready)
            families.scheduled.add_metric(labels, lag.scheduled)
            families.unknown_task.add_metric(labels, lag.unknown_task)
            families.expired.add_metric(labels, lag.expired)
            families.lag.add_metric(labels, lag.lag_seconds)
        for suffix, minutes in WINDOWS:
            finished = families.finished[suffix]
            wait = families.wait[suffix]
            for totals in store.queue_finished_totals(queues, minutes=minutes):
                labels = [alias, totals.queue]
                finished.add_metric([*labels, "succeeded"], totals.succeeded)
                finished.add_metric([*labels, "failed"], totals.failed)
                finished.add_metric([*labels, "dead_lettered"], totals.dead_lettered)
                wait.add_metric(labels, totals.wait_ms_max / 1000)
        timeout = conf.WORKER_TIMEOUT_SECONDS
        for workers in store.queue_workers(queues, timeout_seconds=timeout):
            labels = [alias, workers.queue]
            families.workers.add_metric([*labels, "live"], workers.live)
            families.workers.add_metric([*labels, "draining"], workers.draining)
            families.workers.add_metric([*labels, "silent"], workers.silent)
        paused = store.paused_queues()
        for queue in queues:
            families.paused.add_metric([alias, queue], 1 if queue in paused else 0)
        health = store.job_table_health()
        if health is not None:
            families.table_bytes.add_metric([alias, "table"], health.table_bytes)
            families.table_bytes.add_metric([alias, "indexes"], health.index_bytes)
            families.table_bytes.add_metric([alias, "total"], health.total_bytes)
            families.tuples.add_metric([alias, "live"], health.live_tuples)
            families.tuples.add_metric([alias, "dead"], health.dead_tuples)
            vacuumed = max(
                (when for when in (health.last_vacuum, health.last_autovacuum) if when),
                default=None,
            )
            if vacuumed is not None:
                families.vacuumed.add_metric([alias], vacuumed.timestamp())
        # Zero when nothing holds a snapshot, so an alert's series does not vanish.
        horizon = store.vacuum_horizon()
        held_seconds = (horizon.age_seconds or 0.0) if horizon is not None else 0.0
        families.horizon_age.add_metric([alias], held_seconds)
        families.horizon_xids.add_metric([alias], horizon.xid_age if horizon is not None else 0)
        families.count_limit.add_metric([alias], self.count_limit)
        families.duration.add_metric([alias], time.perf_counter() - started)


class _Families:
    """The metric families of one scrape, filled database by database."""

    def __init__(self) -> None:
        queue = ["database", "queue"]
        self.jobs = GaugeMetricFamily(
            "pgqueue_jobs",
            "Jobs per queue and status (blocked, pending, processing, dead_letter); capped at "
            "pgqueue_count_limit. Succeeded and cancelled jobs are not counted.",
            labels=[*queue, "status"],
        )
        self.ready = GaugeMetricFamily(
            "pgqueue_ready_jobs", "Pending jobs whose time has come (the backlog).", labels=queue
        )
        self.scheduled = GaugeMetricFamily(
            "pgqueue_scheduled_jobs",
            "Pending jobs available later (deferred or backing off).",
            labels=queue,
        )
        self.unknown_task = GaugeMetricFamily(
            "pgqueue_unknown_task_jobs",
            "Pending jobs waiting for a worker that can import their task.",
            labels=queue,
        )
        self.expired = GaugeMetricFamily(
            "pgqueue_expired_leases",
            "Running jobs whose lease has run out (their worker died or is stuck).",
            labels=queue,
        )
        self.lag = GaugeMetricFamily(
            "pgqueue_oldest_ready_age_seconds",
            "How long the oldest ready job has waited (0 when none is ready).",
            labels=queue,
        )
        self.finished = {
            suffix: GaugeMetricFamily(
                f"pgqueue_finished_jobs_{suffix}",
                f"Attempts finished in the last {minutes} minutes, by outcome "
                "(the workers' per-minute counters).",
                labels=[*queue, "outcome"],
            )
            for suffix, minutes in WINDOWS
        }
        self.wait = {
            suffix: GaugeMetricFamily(
                f"pgqueue_longest_wait_{suffix}_seconds",
                f"Longest time a job claimed in the last {minutes} minutes had been ready.",
                labels=queue,
            )
            for suffix, minutes in WINDOWS
        }
        self.workers = GaugeMetricFamily(
            "pgqueue_workers",
            "Worker processes serving the queue: live, draining, or silent (not heard "
            "from within PGQUEUE_WORKER_TIMEOUT_SECONDS).",
            labels=[*queue, "state"],
        )
        self.paused = GaugeMetricFamily(
            "pgqueue_queue_paused",
            "1 while the queue is paused (workers start none of its jobs), else 0.",
            labels=queue,
        )
        self.table_bytes = GaugeMetricFamily(
            "pgqueue_job_table_bytes",
            "Size of the job table: heap (table), its indexes, and both with TOAST (total).",
            labels=["database", "part"],
        )
        self.tuples = GaugeMetricFamily(
            "pgqueue_job_table_tuples",
            "Live and dead tuples of the job table (PostgreSQL's statistics).",
            labels=["database", "kind"],
        )
        self.vacuumed = GaugeMetricFamily(
            "pgqueue_job_table_last_vacuum_timestamp_seconds",
            "When the job table was last vacuumed (manually or by autovacuum).",
            labels=["database"],
        )
        self.horizon_age = GaugeMetricFamily(
            "pgqueue_vacuum_horizon_age_seconds",
            "How long the oldest transaction holding back VACUUM has been open (0: none, "
            "or a replication slot's, whose age in seconds is unknown).",
            labels=["database"],
        )
        self.horizon_xids = GaugeMetricFamily(
            "pgqueue_vacuum_horizon_xid_age",
            "Transactions begun since the snapshot that holds back VACUUM the longest.",
            labels=["database"],
        )
        self.count_limit = GaugeMetricFamily(
            "pgqueue_count_limit",
            "Job counts stop at this number (the true number may be larger).",
            labels=["database"],
        )
        self.duration = GaugeMetricFamily(
            "pgqueue_scrape_duration_seconds",
            "Time this scrape spent querying the database.",
            labels=["database"],
        )

    def all(self) -> Iterator[Metric]:
        yield from (self.jobs, self.ready, self.scheduled, self.unknown_task, self.expired)
        yield self.lag
        yield from self.finished.values()
        yield from self.wait.values()
        yield from (self.workers, self.paused, self.table_bytes, self.tuples, self.vacuumed)
        yield from (self.horizon_age, self.horizon_xids, self.count_limit, self.duration)
