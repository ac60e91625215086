"""Coalesce keys: which pending job holds each key, outside the job table's indexes.

A coalesce key is held by the pending job enqueued with it until that job is claimed
(a retry, a snooze or an operator's retry clears the job's key). Until this release a
unique partial index of the job table (``pgq_job_coalesce_key``) kept two pending jobs
from holding one key; a job table split into segments cannot carry such an index (a
unique index of a partitioned table must include its partition key), so producers now
take the key's row here first, under a row lock held until their transaction ends, and
read its holder through it (``take_coalesce_key`` and ``enqueue_coalesced`` in
sql/enqueue.sql). Housekeeping deletes rows whose job no longer holds the key.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.limits import KEY_MAX_LENGTH
from django_pgqueue.models.base import no_comment_warnings


@no_comment_warnings
class CoalesceKey(models.Model):
    """A coalesce key and the job that took it last (migration 0026)."""

    coalesce_key = models.CharField(_("coalesce key"), max_length=KEY_MAX_LENGTH, primary_key=True)
    job_id = models.BigIntegerField(
        _("job"),
        null=True,
        db_comment="The job that took the key last: it holds it while it is pending with "
        "this coalesce_key (never claimed). NULL until the first producer's job is in.",
    )
    checked_at = models.DateTimeField(
        _("last checked at"),
        db_default=Now(),
        db_comment="When the row was made or housekeeping last found its job holding the key "
        "(housekeeping deletes a row whose job no longer holds it).",
    )

    class Meta:
        db_table = "django_pgqueue_coalesce_key"
        db_table_comment = (
            "django-pgqueue: the pending job holding each coalesce key; "
            "written only by the queue's SQL."
        )
        verbose_name = _("coalesce key")
        verbose_name_plural = _("coalesce keys")
        indexes = (models.Index(fields=["checked_at"], name="pgq_coalesce_checked"),)

    def __str__(self) -> str:
        return self.coalesce_key
