"""The job inbox: jobs, the links of ``after=``, and the dead-letter and lag views of them.

Every index here is partial and exists for one named query (see ``store/sql/*.sql``); the
comments say which. The status literals in index predicates must match the SQL exactly,
because PostgreSQL only uses a partial index when the query's WHERE clause implies the
index predicate. ``tests/test_indexes.py`` holds the claim to its index with EXPLAIN.

Rows are written only by the queue store (``Job.objects``), never through the ORM. The
model reads both tiers: jobs that can still run (the table ``django_pgqueue_job``) and
finished ones (``django_pgqueue_job_history``), through the view ``django_pgqueue_job_all``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from django_pgqueue.limits import (
    KEY_MAX_LENGTH,
    QUEUE_MAX_LENGTH,
    TASK_PATH_MAX_LENGTH,
    WORKER_ID_MAX_LENGTH,
)
from django_pgqueue.models.base import BrinIndex, no_comment_warnings
from django_pgqueue.models.manager import JobManager
from django_pgqueue.states import TERMINAL_STATUSES, BlockerFailure, JobStatus
from django_pgqueue.store.partition import BUCKET_COUNT

_PENDING = Q(status=JobStatus.PENDING)
_PROCESSING = Q(status=JobStatus.PROCESSING)
_PARTITIONED = Q(partition_key__isnull=False)
_UNPARTITIONED = Q(partition_key__isnull=True)
# Predicates are chosen so that each query can use exactly one of these indexes. The
# worker's prepared statements run with generic plans, made once from the statistics of
# the moment; an index that "also matches" would be picked while a table is empty and
# then walk a deep partition on every probe. pgq_job_lease and pgq_job_pending name the
# column they are searched by. (Partitioned jobs are claimed through the partition
# table, by primary key: the index that listed them in claim order went in 0014.)
# Jobs under a concurrency limit are claimed through their key's row
# (django_pgqueue_concurrency), never from pgq_job_claim: thousands of them waiting on
# keys at their limit must cost a plain claim nothing.
_LIMITED = Q(concurrency_key__isnull=False)
_UNLIMITED = Q(concurrency_key__isnull=True)


class JobColumns(models.Model):
    """The columns of a job, shared by the job table, the history and the view of both."""

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(_("queue"), max_length=QUEUE_MAX_LENGTH)
    task_path = models.CharField(_("task"), max_length=TASK_PATH_MAX_LENGTH)
    args = models.JSONField(_("positional arguments"), default=list)
    kwargs = models.JSONField(_("keyword arguments"), default=dict)
    priority = models.SmallIntegerField(
        _("priority"), default=0, db_comment="Higher runs first, -100..100 as in django.tasks."
    )
    status = models.CharField(
        _("status"), max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING
    )
    attempts = models.IntegerField(
        _("attempts"), default=0, db_comment="Attempts started; counted at claim time."
    )
    max_attempts = models.IntegerField(_("max attempts"), default=5)
    lease_generation = models.BigIntegerField(
        _("lease generation"),
        default=0,
        db_comment="Fencing token: bumped at every claim and release.",
    )
    claimed_by = models.CharField(  # noqa: DJ001 - NULL means "no holder", not empty text
        _("claimed by"), max_length=WORKER_ID_MAX_LENGTH, null=True, blank=True
    )
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    available_at = models.DateTimeField(_("available at"), db_default=Now())
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    started_at = models.DateTimeField(_("first started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    last_error = models.TextField(_("last error"), null=True, blank=True)  # noqa: DJ001
    last_error_class = models.CharField(  # noqa: DJ001
        _("last error class"), max_length=255, null=True, blank=True
    )
    errors = models.JSONField(
        _("error history"),
        default=list,
        db_comment="One object per failed attempt (class, message, traceback, worker, at) "
        "or snoozed one (snoozed: seconds, worker, at).",
    )
    snoozes = models.IntegerField(
        _("snoozes"),
        db_default=0,
        db_comment="Times the job's handler asked to run again later (Snooze) without "
        "using an attempt; capped by the task's max_snoozes.",
    )
    result = models.JSONField(_("result"), null=True, blank=True)
    idempotency_key = models.CharField(  # noqa: DJ001
        _("idempotency key"), max_length=KEY_MAX_LENGTH, null=True, blank=True
    )
    partition_key = models.CharField(  # noqa: DJ001
        _("partition key"), max_length=KEY_MAX_LENGTH, null=True, blank=True
    )
    partition_bucket = models.SmallIntegerField(
        _("partition bucket"),
        null=True,
        blank=True,
        db_comment="Stable hash of partition_key, 0..1023; spreads partitions over workers.",
    )
    step = models.TextField(  # noqa: DJ001
        _("step"), null=True, blank=True, db_comment="Progress marker of a multi-step job."
    )
    unknown_task_since = models.DateTimeField(
        _("waiting for its task since"),
        null=True,
        blank=True,
        db_comment="When a worker first could not import the task: the start of the "
        "unknown-task window (the time the job was ready). NULL once a worker knows it.",
    )
    coalesce_key = models.CharField(  # noqa: DJ001
        _("coalesce key"),
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        db_comment="While the job is pending, enqueueing with this key returns it instead "
        "of inserting another (pgq_job_coalesce_key).",
    )
    concurrency_key = models.CharField(  # noqa: DJ001
        _("concurrency key"),
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        db_comment="Jobs sharing it run at most concurrency_limit at a time, in any order.",
    )
    concurrency_limit = models.IntegerField(
        _("concurrency limit"),
        null=True,
        blank=True,
        db_comment="Jobs of concurrency_key in flight at most (from the task or settings).",
    )
    rate_limit = models.IntegerField(
        _("rate limit"),
        null=True,
        blank=True,
        db_comment="Starts of concurrency_key per rate_period at most.",
    )
    rate_period = models.FloatField(
        _("rate period"), null=True, blank=True, db_comment="Seconds of the rate limit's period."
    )
    traceparent = models.TextField(  # noqa: DJ001
        _("trace parent"),
        null=True,
        blank=True,
        db_comment="W3C traceparent of the span that enqueued the job (OpenTelemetry); "
        "each attempt's span links to it.",
    )

    cancel_requested_at = models.DateTimeField(
        _("cancel requested at"),
        null=True,
        blank=True,
        db_comment="An operator cancelled the job while it ran: it stays processing "
        "(lease, slot and partition turn held) until its handler returns or its "
        "lease expires, and then ends cancelled.",
    )

    has_dependents = models.BooleanField(
        _("has dependents"),
        db_default=False,
        db_comment="Some job was enqueued after= this one: its status changes settle them "
        "(the trigger django_pgqueue_job_settle runs only for such rows and awaited ones).",
    )
    awaited = models.BooleanField(
        _("awaited"),
        db_default=False,
        db_comment="A wait() is (or was) waiting for this job: its end is NOTIFYed.",
    )

    class Meta:
        abstract = True


@no_comment_warnings
class Job(JobColumns):
    """One unit of work: a task call waiting, running or finished (in either tier)."""

    objects: ClassVar[JobManager] = JobManager()

    class Meta:
        # Both tiers (migration 0020): the live table django_pgqueue_job and the
        # partitioned history. The indexes and constraints below are the live table's,
        # declared here since 0001; a migration changing them addresses LiveJob (the
        # job table), never this view. Not managed: Django creates, flushes and checks
        # the two tables (LiveJob, HistoryJob), never the view.
        managed = False
        db_table = "django_pgqueue_job_all"
        db_table_comment = "django-pgqueue: every job, live and finished (a view)."
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering = ("-id",)
        indexes = (
            # claim_batch, unpartitioned branch: the ready rows of one queue in claim
            # order (priority, then available_at, then id), read with LIMIT.
            models.Index(
                fields=["queue", "-priority", "available_at", "id"],
                name="pgq_job_claim",
                condition=_PENDING & _UNPARTITIONED & _UNLIMITED,
            ),
            # claim_batch, limited branch: a key's pending jobs in claim order; and
            # django_pgqueue_refresh_concurrency's next-job probe.
            models.Index(
                fields=["concurrency_key", "-priority", "available_at", "id"],
                name="pgq_job_conc_pending",
                condition=_PENDING & _LIMITED,
            ),
            # django_pgqueue_refresh_concurrency: a key's jobs in flight (counted).
            models.Index(
                fields=["concurrency_key"],
                name="pgq_job_conc_processing",
                condition=_PROCESSING & _LIMITED,
            ),
            # claim_batch head check: "is there an older job not started yet in this
            # partition?", and django_pgqueue_refresh_partitions' next job. Blocked jobs
            # too: one waiting for its dependencies keeps its turn (migration 0015).
            models.Index(
                fields=["partition_key", "id"],
                name="pgq_job_part_pending",
                condition=Q(status__in=[JobStatus.BLOCKED, JobStatus.PENDING]) & _PARTITIONED,
            ),
            # claim_batch head check: "is any row of this partition processing?"
            models.Index(
                fields=["partition_key"],
                name="pgq_job_part_processing",
                condition=_PROCESSING & _PARTITIONED,
            ),
            # reap_expired and the admin's stuck count: leases that ran out.
            models.Index(
                fields=["lease_expires_at"],
                name="pgq_job_lease",
                condition=_PROCESSING & Q(lease_expires_at__isnull=False),
            ),
            # queue_lag, scheduled listing and run_now: pending rows by availability.
            models.Index(
                fields=["queue", "available_at"],
                name="pgq_job_pending",
                condition=_PENDING & Q(available_at__isnull=False),
            ),
            # Admin lag page and inbox: pending jobs waiting for a worker that can import
            # their task (rare rows, so a tiny index). Migration 0005 builds it.
            models.Index(
                fields=["queue"],
                name="pgq_job_unknown_task",
                condition=_PENDING & Q(unknown_task_since__isnull=False),
            ),
            # The previous release's coalesced enqueue: ON CONFLICT (coalesce_key) WHERE
            # status = 'pending' AND coalesce_key IS NOT NULL (this release's holds the
            # key in django_pgqueue_coalesce_key, migration 0026, and keeps the clause
            # only as a backstop against those producers). UNIQUE in the database
            # (migration 0011 builds it concurrently with its own statement); a plain
            # Index here because UniqueConstraint cannot be built CONCURRENTLY.
            models.Index(
                fields=["coalesce_key"],
                name="pgq_job_coalesce_key",
                condition=_PENDING & Q(coalesce_key__isnull=False),
            ),
            # Admin lag page and metrics: blocked jobs per queue (migration 0009).
            models.Index(
                fields=["queue"],
                name="pgq_job_blocked",
                condition=Q(status=JobStatus.BLOCKED),
            ),
            # prune_finished and finished-at filters in the admin.
            models.Index(
                fields=["finished_at"],
                name="pgq_job_finished",
                condition=Q(status__in=sorted(TERMINAL_STATUSES)),
            ),
            # Dead-letter page: grouped by task and error class, newest first.
            models.Index(
                fields=["task_path", "last_error_class", "id"],
                name="pgq_job_dead",
                condition=Q(status=JobStatus.DEAD_LETTER),
            ),
            # Admin created-at range filters: rows arrive in created_at order, so a BRIN
            # index is a few pages, and created_at never changes after the insert.
            BrinIndex(fields=["created_at"], name="pgq_job_created_brin"),
            # Admin inbox and dead-letter page, status filter and the retry action: dead
            # letters or cancelled jobs, newest first, wherever they sit in the table.
            # Only rows entering or leaving those rare states write to it.
            models.Index(
                fields=["status", "id"],
                name="pgq_job_revivable",
                condition=Q(status__in=[JobStatus.DEAD_LETTER, JobStatus.CANCELLED]),
            ),
            # Admin lag page (queue_lag's dead-letter count, known_queues) and the
            # dead-letter page filtered by queue: dead letters per queue.
            models.Index(
                fields=["queue", "id"],
                name="pgq_job_dead_queue",
                condition=Q(status=JobStatus.DEAD_LETTER),
            ),
            # Admin inbox filters by queue, task and partition key (bloom summaries: a
            # rare value reads only the block ranges holding it) and available-at ranges
            # (multi-minmax, so far-future scheduled jobs do not widen every range).
            # Every new row version reads its range's summary, so the blooms are sized
            # for the few values a range of a few hundred jobs holds, not PostgreSQL's
            # default of hundreds (migration 0013; pages_per_range = 16 since 0003).
            BrinIndex(
                fields=["queue", "task_path", "partition_key", "available_at"],
                name="pgq_job_filter_brin",
                opclasses=[
                    "text_bloom_ops(n_distinct_per_range = 16)",
                    "text_bloom_ops(n_distinct_per_range = 32)",
                    "text_bloom_ops(n_distinct_per_range = 32)",
                    "timestamptz_minmax_multi_ops",
                ],
            ),
        )
        constraints = (
            # The previous release's ON CONFLICT (idempotency_key) WHERE idempotency_key
            # IS NOT NULL; this release's statements rely on django_pgqueue_job_key alone
            # (migration 0026). Also the live tier's lookup of a key's job.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                name="pgq_job_idempotency_key",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="pgq_job_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=TASK_MIN_PRIORITY, priority__lte=TASK_MAX_PRIORITY),
                name="pgq_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(partition_bucket__gte=0, partition_bucket__lt=BUCKET_COUNT)
                | Q(partition_bucket__isnull=True),
                name="pgq_job_bucket_range",
            ),
            models.CheckConstraint(
                condition=Q(partition_key__isnull=True, partition_bucket__isnull=True)
                | Q(partition_key__isnull=False, partition_bucket__isnull=False),
                name="pgq_job_bucket_with_key",
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0, max_attempts__gte=1, attempts__lte=F("max_attempts")),
                name="pgq_job_attempts_range",
            ),
            models.CheckConstraint(
                condition=~_PROCESSING
                | Q(claimed_by__isnull=False, lease_expires_at__isnull=False),
                name="pgq_job_processing_leased",
            ),
        )

    def __str__(self) -> str:
        return f"#{self.pk} {self.task_path} [{self.status}]"

    @property
    def status_enum(self) -> JobStatus:
        """Return the status as a :class:`JobStatus` member."""
        return JobStatus(self.status)

    @property
    def is_terminal(self) -> bool:
        """Return whether the job has finished (succeeded, dead-lettered or cancelled)."""
        return self.status_enum.is_terminal

    @property
    def task_name(self) -> str:
        """Return the task's function name, the last part of its path."""
        return self.task_path.rpartition(".")[2]

    def error_history(self) -> list[dict[str, Any]]:
        """Return the recorded attempts' errors and snoozes, oldest first.

        A snooze's entry has a ``snoozed`` key (the seconds asked for) and no exception.
        """
        return list(self.errors or [])


@no_comment_warnings
class LiveJob(JobColumns):
    """The live tier's table, ``django_pgqueue_job``: the jobs that can still run.

    Its indexes, constraints and triggers are defined by the migrations' SQL (see
    :class:`~django_pgqueue.models.Job`, which reads both tiers and declares them).
    Rows are written only by the queue store; tests and scripts that must set up a
    state by hand write here, never to ``Job`` (a view).
    """

    class Meta:
        db_table = "django_pgqueue_job"
        db_table_comment = "django-pgqueue inbox; written only by the queue manager."
        verbose_name = _("live job")
        verbose_name_plural = _("live jobs")

    def __str__(self) -> str:
        return f"#{self.pk} {self.task_path} [{self.status}]"


@no_comment_warnings
class Dependency(models.Model):
    """One edge "``job`` runs after ``blocker``": written only by the queue's SQL.

    Rows are kept after they are satisfied (the dependent reads its blockers' results
    through them, the admin shows them); deleting either job deletes the edge (foreign
    keys ON DELETE CASCADE, added by migration 0009).
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # pgq_dep_job leads with it
        related_name="dependencies",
        verbose_name=_("dependent job"),
    )
    blocker = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # pgq_dep_blocker leads with it
        related_name="dependents",
        verbose_name=_("runs after"),
    )
    position = models.IntegerField(
        _("position"), db_comment="Index of the blocker in the after= list."
    )
    on_failure = models.CharField(
        _("if it fails"),
        max_length=8,
        choices=BlockerFailure.choices,
        default=BlockerFailure.CANCEL,
    )
    wake_channel = models.CharField(
        _("wake-up channel"),
        max_length=63,
        db_comment="NOTIFY channel of the dependent's workers (PGQUEUE_NOTIFY_CHANNEL at "
        "enqueue): the settling trigger wakes them when the dependent becomes pending.",
    )
    cancelled_job = models.BooleanField(
        _("cancelled the job"),
        db_default=False,
        db_comment="The blocker's failure cancelled the dependent: retrying it may revive it.",
    )

    class Meta:
        db_table = "django_pgqueue_dependency"
        db_table_comment = "django-pgqueue: job runs after blocker; written only by queue SQL."
        verbose_name = _("dependency")
        verbose_name_plural = _("dependencies")
        constraints = (
            # What a job waits for (job page, dependency_results, the unblock check).
            models.UniqueConstraint(fields=["job", "blocker"], name="pgq_dep_job"),
            models.CheckConstraint(
                condition=Q(on_failure__in=BlockerFailure.values), name="pgq_dep_on_failure"
            ),
        )
        indexes = (
            # What waits for a job (the settling trigger, the job page, revive).
            models.Index(fields=["blocker", "job"], name="pgq_dep_blocker"),
        )

    def __str__(self) -> str:
        return f"#{self.job_id} after #{self.blocker_id}"


class DeadLetter(Job):
    """Dead-lettered jobs: a proxy that gives the admin its own page."""

    class Meta:
        proxy = True
        verbose_name = _("dead letter")
        verbose_name_plural = _("dead letters")


class Lag(Job):
    """The lag page's entry in the admin index and sidebar (a proxy: no table of its own)."""

    class Meta:
        proxy = True
        verbose_name = _("queue lag")
        verbose_name_plural = _("queue lag")
