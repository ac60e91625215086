"""What the SQL enqueue function needs from the settings, kept in the database.

``django_pgqueue_enqueue()`` (migration 0017) runs inside PostgreSQL, where Django's
settings cannot be read: the queues of the backends on this database, the defaults and
limits an enqueue applies, and the wake-up channels. ``migrate`` writes the row and every
worker writes it again when it starts, so it follows the deployed settings.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.models.base import no_comment_warnings


@no_comment_warnings
class SqlSettings(models.Model):
    """The one row of settings the SQL enqueue function reads (``id`` is always 1)."""

    id = models.SmallIntegerField(primary_key=True, default=1)
    queues = models.JSONField(
        _("queues"),
        null=True,
        blank=True,
        db_comment="Queue names a SQL enqueue accepts (NULL: any, as a backend whose "
        "QUEUES is empty).",
    )
    max_attempts = models.IntegerField(
        _("max attempts"), db_comment="PGQUEUE_MAX_ATTEMPTS: the default of max_attempts."
    )
    max_payload_bytes = models.IntegerField(
        _("max payload bytes"), db_comment="PGQUEUE_MAX_PAYLOAD_BYTES."
    )
    notify_channel = models.CharField(
        _("notify channel"), max_length=63, db_comment="PGQUEUE_NOTIFY_CHANNEL (wake-ups)."
    )
    flow_channel = models.CharField(
        _("flow channel"),
        max_length=63,
        db_comment="The channel that says a partition or key can start a job.",
    )
    concurrency_limits = models.JSONField(
        _("concurrency limits"), default=dict, db_comment="PGQUEUE_CONCURRENCY_LIMITS."
    )
    rate_limits = models.JSONField(
        _("rate limits"),
        default=dict,
        db_comment="PGQUEUE_RATE_LIMITS, parsed: {name: [limit, period seconds]}.",
    )
    synced_at = models.DateTimeField(_("synced at"), db_default=Now())
    synced_by = models.CharField(
        _("synced by"), max_length=200, db_comment="migrate, or the worker that wrote it."
    )

    class Meta:
        db_table = "django_pgqueue_sql_settings"
        db_table_comment = (
            "django-pgqueue: the settings django_pgqueue_enqueue() applies (one row), "
            "written by migrate and by each worker at start."
        )
        verbose_name = _("SQL enqueue settings")
        verbose_name_plural = _("SQL enqueue settings")
        constraints = (
            models.CheckConstraint(condition=models.Q(id=1), name="pgq_sql_settings_one_row"),
        )

    def __str__(self) -> str:
        return "SQL enqueue settings"
