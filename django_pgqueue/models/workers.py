"""The worker registry and the queues' statistics."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.limits import (
    QUEUE_MAX_LENGTH,
    WORKER_ID_MAX_LENGTH,
)
from django_pgqueue.models.base import no_comment_warnings
from django_pgqueue.states import WorkerStatus


@no_comment_warnings
class Worker(models.Model):
    """A worker process, as it reports itself: the registry behind the ring and the admin."""

    id = models.CharField(primary_key=True, max_length=WORKER_ID_MAX_LENGTH)
    status = models.CharField(
        _("status"), max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.ALIVE
    )
    hostname = models.CharField(_("hostname"), max_length=255)
    pid = models.IntegerField(_("pid"))
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.IntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started at"), db_default=Now())
    last_seen_at = models.DateTimeField(_("last seen at"), db_default=Now())
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)

    class Meta:
        db_table = "django_pgqueue_worker"
        db_table_comment = "django-pgqueue worker registry; advisory, never trusted for safety."
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ("-started_at",)
        # No index besides the primary key: the table holds one row per worker process,
        # and an index on last_seen_at would make every heartbeat a non-HOT update.
        constraints = (
            models.CheckConstraint(
                condition=Q(status__in=WorkerStatus.values), name="pgq_worker_status_valid"
            ),
        )

    def __str__(self) -> str:
        return self.id


@no_comment_warnings
class QueueStat(models.Model):
    """Per-minute counters of finished jobs per queue, written by workers.

    Counting finished rows for a throughput figure would scan millions of rows; workers
    instead add their counts here (one small upsert per heartbeat), and the lag page reads
    an hour of minutes.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(_("queue"), max_length=QUEUE_MAX_LENGTH)
    minute = models.DateTimeField(_("minute"))
    succeeded = models.BigIntegerField(_("succeeded"), default=0)
    failed = models.BigIntegerField(_("failed"), default=0)
    dead_lettered = models.BigIntegerField(_("dead-lettered"), default=0)
    wait_ms_max = models.BigIntegerField(
        _("longest wait (ms)"),
        default=0,
        db_comment="Longest time a job claimed in this minute had been ready.",
    )

    class Meta:
        db_table = "django_pgqueue_queuestat"
        verbose_name = _("queue statistic")
        verbose_name_plural = _("queue statistics")
        constraints = (
            # record_stats' ON CONFLICT (queue, minute).
            models.UniqueConstraint(fields=["queue", "minute"], name="pgq_stat_queue_minute"),
        )

    def __str__(self) -> str:
        return f"{self.queue} @ {self.minute:%Y-%m-%d %H:%M}"
