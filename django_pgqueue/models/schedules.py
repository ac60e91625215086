"""Periodic schedules: one row per declared schedule, fired exactly once per time."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.limits import (
    KEY_MAX_LENGTH,
    QUEUE_MAX_LENGTH,
    SCHEDULE_NAME_MAX_LENGTH,
    TASK_PATH_MAX_LENGTH,
)
from django_pgqueue.models.base import no_comment_warnings


class ScheduleSource(models.TextChoices):
    """Where a schedule is declared, which says who may write its row."""

    #: ``@periodic`` or ``PGQUEUE_SCHEDULES``: workers sync it at start; read-only in the admin.
    CODE = "code", _("Code")
    #: Created in the admin at run time: edited and deleted there, never by a sync.
    ADMIN = "admin", _("Admin")


@no_comment_warnings
class Schedule(models.Model):
    """A periodic schedule as the workers fire it: declared in code or in the admin.

    Workers sync the code's rows with the declarations (``@periodic``,
    ``PGQUEUE_SCHEDULES``) when they start; the admin pauses, resumes and runs every
    schedule, and creates, edits and deletes its own (``source`` says which). Firing
    reads the table on every pass and advances ``next_fire_at`` in the same statement
    that inserts the job (sql/schedules.sql).
    """

    name = models.CharField(_("name"), primary_key=True, max_length=SCHEDULE_NAME_MAX_LENGTH)
    task_path = models.CharField(_("task"), max_length=TASK_PATH_MAX_LENGTH)
    queue = models.CharField(_("queue"), max_length=QUEUE_MAX_LENGTH)
    priority = models.SmallIntegerField(_("priority"))
    max_attempts = models.IntegerField(_("max attempts"))
    args = models.JSONField(_("positional arguments"), default=list)
    kwargs = models.JSONField(_("keyword arguments"), default=dict)
    expression = models.CharField(_("expression"), max_length=200)
    description = models.CharField(_("when"), max_length=500)
    timezone = models.CharField(_("timezone"), max_length=64)
    downtime = models.CharField(_("after downtime"), max_length=16)
    catch_up = models.SmallIntegerField(_("catch up at most"))
    # The task's flow limits, resolved when the schedule is synced (as enqueue resolves
    # them), so every fire and "run now" carries them without importing the task.
    concurrency_key = models.CharField(  # noqa: DJ001
        _("concurrency key"),
        max_length=KEY_MAX_LENGTH,
        null=True,
        blank=True,
        db_comment="The fired jobs' concurrency key (from the task or settings).",
    )
    concurrency_limit = models.IntegerField(_("concurrency limit"), null=True, blank=True)
    rate_limit = models.IntegerField(_("rate limit"), null=True, blank=True)
    rate_period = models.FloatField(
        _("rate period"), null=True, blank=True, db_comment="Seconds of the rate limit's period."
    )
    # A trigger of migration 0018 keeps admin rows from any DELETE that does not set
    # django_pgqueue.delete_admin_schedule (a previous release's sync deletes every
    # undeclared name).
    source = models.CharField(
        _("source"),
        max_length=8,
        choices=ScheduleSource.choices,
        db_default=ScheduleSource.CODE,
        db_comment="Where the schedule is declared: code (synced by workers at start) or "
        "admin (created and edited in the admin; a sync never changes or deletes it).",
    )
    timing = models.CharField(
        max_length=32,
        db_comment="Fingerprint of expression and timezone: a change moves next_fire_at.",
    )
    next_fire_at = models.DateTimeField(_("next fire"))
    last_fire_at = models.DateTimeField(_("last fire"), null=True, blank=True)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now())
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())

    class Meta:
        db_table = "django_pgqueue_schedule"
        db_table_comment = (
            "django-pgqueue periodic schedules; synced from code by workers, or edited in "
            "the admin."
        )
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ("name",)
        indexes = (
            # due_schedules: the active schedules in fire order.
            models.Index(
                fields=["next_fire_at"],
                condition=Q(paused_at__isnull=True),
                name="pgq_schedule_due",
            ),
        )
        constraints = (
            models.CheckConstraint(
                condition=Q(downtime__in=["latest", "skip", "catch_up"]),
                name="pgq_schedule_downtime_valid",
            ),
            models.CheckConstraint(
                condition=Q(source__in=ScheduleSource.values),
                name="pgq_schedule_source_valid",
            ),
        )

    def __str__(self) -> str:
        return self.name
