"""Paused queues: one row per queue an operator paused."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.limits import (
    QUEUE_MAX_LENGTH,
)
from django_pgqueue.models.base import no_comment_warnings


@no_comment_warnings
class QueuePause(models.Model):
    """A paused queue: while its row exists, no claim starts the queue's jobs.

    Written by :func:`django_pgqueue.pause_queue` (and the admin and ``pausequeue``);
    the claim statement reads it on every round (sql/lease.sql, claim_batch).
    """

    queue = models.CharField(_("queue"), primary_key=True, max_length=QUEUE_MAX_LENGTH)
    paused_at = models.DateTimeField(_("paused at"), db_default=Now())
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")

    class Meta:
        db_table = "django_pgqueue_queue_pause"
        db_table_comment = "django-pgqueue paused queues; the claim skips them."
        verbose_name = _("queue pause")
        verbose_name_plural = _("queue pauses")
        ordering = ("queue",)

    def __str__(self) -> str:
        return self.queue
