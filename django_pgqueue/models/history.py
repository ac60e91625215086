"""The history tier: retention classes, taken idempotency keys, and the two tables' names.

A finished job leaves the job table for ``django_pgqueue_job_history`` (migration 0019),
partitioned by class and then by finish time. A class is a final status, for every
queue (``queue`` NULL) or for one queue given its own retention; housekeeping writes
the rows from PGQUEUE_RETENTION, and pruning drops a class's partitions once they are
older than ``keep_seconds``.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.limits import KEY_MAX_LENGTH, QUEUE_MAX_LENGTH
from django_pgqueue.models.base import no_comment_warnings
from django_pgqueue.states import TERMINAL_STATUSES, JobStatus

_FINAL_CHOICES = [
    (status.value, status.label) for status in JobStatus if status in TERMINAL_STATUSES
]


@no_comment_warnings
class HistoryClass(models.Model):
    """Where finished jobs of one final status (and maybe one queue) go, and for how long."""

    id = models.SmallAutoField(primary_key=True)
    status = models.CharField(_("final status"), max_length=16, choices=_FINAL_CHOICES)
    queue = models.CharField(  # noqa: DJ001 - NULL means "every other queue"
        _("queue"),
        max_length=QUEUE_MAX_LENGTH,
        null=True,
        blank=True,
        db_comment="NULL: every queue without a class of its own.",
    )
    keep_seconds = models.FloatField(
        _("kept for (seconds)"),
        null=True,
        blank=True,
        db_comment="How long the class's jobs are kept after they finish "
        "(whole partitions are dropped once past it); NULL keeps them.",
    )
    retired = models.BooleanField(
        _("retired"),
        default=False,
        db_comment="No longer in the settings: no new job goes to it, and "
        "its partitions are dropped as they expire.",
    )

    class Meta:
        # Made by migration 0019's SQL: a test database flush must not empty it.
        managed = False
        db_table = "django_pgqueue_history_class"
        db_table_comment = (
            "django-pgqueue: where finished jobs go and how long they are kept; "
            "written by housekeeping from the settings."
        )
        verbose_name = _("history class")
        verbose_name_plural = _("history classes")
        constraints = (
            models.UniqueConstraint(
                fields=["status", "queue"],
                name="pgq_history_class_unique",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=Q(status__in=sorted(TERMINAL_STATUSES)),
                name="pgq_history_class_status",
            ),
            models.CheckConstraint(
                condition=Q(keep_seconds__gte=0) | Q(keep_seconds__isnull=True),
                name="pgq_history_class_keep",
            ),
        )

    def __str__(self) -> str:
        return f"{self.status} ({self.queue or 'every queue'})"


@no_comment_warnings
class IdempotencyKey(models.Model):
    """An idempotency key taken by a job in either tier (migration 0020).

    Taken when the job is inserted and kept after it finishes (a unique index cannot
    span the two tiers); housekeeping frees a key once no job holds it any more.
    """

    idempotency_key = models.CharField(
        _("idempotency key"), max_length=KEY_MAX_LENGTH, primary_key=True
    )
    checked_at = models.DateTimeField(
        _("last checked at"),
        db_default=Now(),
        db_comment="When housekeeping last found a job holding the key "
        "(it frees a key no job holds any more).",
    )

    class Meta:
        db_table = "django_pgqueue_job_key"
        db_table_comment = (
            "django-pgqueue: idempotency keys taken, by a job in either tier; "
            "written only by the queue's SQL."
        )
        verbose_name = _("idempotency key")
        verbose_name_plural = _("idempotency keys")
        indexes = (models.Index(fields=["checked_at"], name="pgq_key_checked"),)

    def __str__(self) -> str:
        return self.idempotency_key


@no_comment_warnings
class HistoryJob(models.Model):
    """The history tier's partitioned table, ``django_pgqueue_job_history``, named for
    Django only (as :class:`LiveJob`)."""

    id = models.BigAutoField(primary_key=True)

    class Meta:
        db_table = "django_pgqueue_job_history"
        db_table_comment = (
            "django-pgqueue: finished jobs, partitioned by retention class and finish "
            "time; written only by the queue's SQL."
        )

    def __str__(self) -> str:
        return f"#{self.pk}"
