"""Flow control's tables: partitions and concurrency keys, with their signals."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgqueue.limits import (
    KEY_MAX_LENGTH,
    QUEUE_MAX_LENGTH,
)
from django_pgqueue.models.base import no_comment_warnings


@no_comment_warnings
class Partition(models.Model):
    """The claim state of one partition key: its next job, and the job running now.

    Kept by the queue's own statements, never by the ORM: each statement that moves a
    partitioned job (claim, complete, fail, release, reap) brings the row up to date in
    the same transaction, under the row's lock, from the job table itself (the function
    ``django_pgqueue_refresh_partitions`` of migration 0004; since 0024 read from the
    jobs that moved on, not from the partition's first job). Producers never lock it:
    they append a :class:`PartitionSignal` naming the job, folded in by the next claim. A
    row exists while its partition has a pending or processing job.
    """

    partition_key = models.CharField(
        _("partition key"), primary_key=True, max_length=KEY_MAX_LENGTH
    )
    queue = models.CharField(  # noqa: DJ001 - NULL only while the row is being created
        _("queue of the next job"), max_length=QUEUE_MAX_LENGTH, null=True, blank=True
    )
    partition_bucket = models.SmallIntegerField(_("partition bucket"), null=True, blank=True)
    head_id = models.BigIntegerField(
        _("next job"), null=True, blank=True, db_comment="Oldest pending job; NULL: none."
    )
    head_priority = models.SmallIntegerField(_("next job's priority"), null=True, blank=True)
    head_available_at = models.DateTimeField(_("next job available at"), null=True, blank=True)
    running_id = models.BigIntegerField(
        _("running job"), null=True, blank=True, db_comment="The processing job; NULL: idle."
    )
    head_blocked = models.BooleanField(
        _("next job blocked"),
        db_default=False,
        db_comment="The next job waits for its dependencies: the partition waits too.",
    )
    wake_at = models.DateTimeField(
        _("next job can start at"),
        null=True,
        blank=True,
        db_comment="The next job is scheduled: out of the claim index until then.",
    )
    refreshed_at = models.DateTimeField(_("refreshed at"), db_default=Now())

    class Meta:
        db_table = "django_pgqueue_partition"
        db_table_comment = "django-pgqueue partition claim state; written only by queue SQL."
        verbose_name = _("partition")
        verbose_name_plural = _("partitions")
        indexes = (
            # claim_batch, partitioned branch: idle partitions whose next job can start
            # now, in claim order. Running, empty, blocked and scheduled partitions are
            # not in it, so a claim reads only rows it can take, however many others
            # there are (migration 0015).
            models.Index(
                fields=["queue", "-head_priority", "head_available_at", "head_id"],
                name="pgq_partition_claim",
                condition=Q(
                    head_blocked=False,
                    head_id__isnull=False,
                    running_id__isnull=True,
                    wake_at__isnull=True,
                ),
            ),
            # fold_signals: partitions whose scheduled next job becomes ready.
            models.Index(
                fields=["wake_at"], name="pgq_partition_wake", condition=Q(wake_at__isnull=False)
            ),
            # repair_partitions: partitions marked running, checked against the job table.
            models.Index(
                fields=["running_id"],
                name="pgq_partition_running",
                condition=Q(running_id__isnull=False),
            ),
        )

    def __str__(self) -> str:
        return self.partition_key


@no_comment_warnings
class PartitionSignal(models.Model):
    """A note from a producer that a partition has new work: "refresh this partition".

    Appended in the enqueuing (or operator's) transaction, so it becomes visible exactly
    when the job does, and it takes no lock a worker could wait on.
    """

    id = models.BigAutoField(primary_key=True)
    partition_key = models.CharField(_("partition key"), max_length=KEY_MAX_LENGTH)
    urgent = models.BooleanField(
        _("urgent"),
        db_default=True,
        db_comment="The claim folds it (a job may be able to start); else housekeeping.",
    )
    job_id = models.BigIntegerField(
        _("job"),
        null=True,
        blank=True,
        db_comment="The oldest job signalled: the fold reads the partition's jobs from "
        "there. NULL: from the first (a signal of an older release, or a trigger).",
    )

    class Meta:
        db_table = "django_pgqueue_partition_signal"
        db_table_comment = "django-pgqueue: partitions to refresh; folded in by claims."
        verbose_name = _("partition signal")
        verbose_name_plural = _("partition signals")
        indexes = (
            # fold_signals and the claim's probe (urgent ones), fold_lazy_signals (the
            # others), oldest first. Partial: each scan reads only its kind, whatever
            # the statistics say (a flood of lazy signals is never walked by a claim).
            models.Index(
                fields=["id"], name="pgq_partition_signal_urgent", condition=Q(urgent=True)
            ),
            models.Index(
                fields=["id"], name="pgq_partition_signal_lazy", condition=Q(urgent=False)
            ),
        )

    def __str__(self) -> str:
        return self.partition_key


@no_comment_warnings
class ConcurrencyKey(models.Model):
    """The claim state of one concurrency key: its limit, what is in flight, what is next.

    The generalisation of :class:`Partition` to "at most N in flight, any order". Kept by
    the queue's own statements, never by the ORM: the claim counts what it takes, and
    each statement that moves a limited job (complete, fail, release, reap) recounts the
    row in the same transaction, under the row's lock, from the job table itself (the
    function ``django_pgqueue_refresh_concurrency`` of migration 0011). Producers append
    a :class:`ConcurrencySignal` instead. A row exists while its key has a pending or
    processing job.
    """

    concurrency_key = models.CharField(
        _("concurrency key"), primary_key=True, max_length=KEY_MAX_LENGTH
    )
    queue = models.CharField(  # noqa: DJ001 - NULL only while the row is being created
        _("queue of the next job"), max_length=QUEUE_MAX_LENGTH, null=True, blank=True
    )
    max_in_flight = models.IntegerField(
        _("limit"), db_default=1, db_comment="Jobs in flight at most (the newest job's limit)."
    )
    in_flight = models.IntegerField(
        _("in flight"), db_default=0, db_comment="Processing jobs of the key (leased)."
    )
    rate_limit = models.IntegerField(
        _("rate limit"),
        null=True,
        blank=True,
        db_comment="Starts per rate_period at most; NULL: no rate limit.",
    )
    rate_period = models.FloatField(_("rate period (s)"), null=True, blank=True)
    tokens = models.FloatField(
        _("tokens"),
        null=True,
        blank=True,
        db_comment="Token bucket: starts allowed as of tokens_at (at most rate_limit).",
    )
    tokens_at = models.DateTimeField(_("tokens counted at"), null=True, blank=True)
    head_id = models.BigIntegerField(
        _("next job"),
        null=True,
        blank=True,
        db_comment="Best ready pending job (else the soonest ready); NULL: none.",
    )
    head_priority = models.SmallIntegerField(_("next job's priority"), null=True, blank=True)
    head_available_at = models.DateTimeField(_("next job available at"), null=True, blank=True)
    wake_at = models.DateTimeField(
        _("next job can start at"),
        null=True,
        blank=True,
        db_comment="The next job is scheduled or the rate bucket is empty: out of "
        "the claim index until then.",
    )
    refreshed_at = models.DateTimeField(_("refreshed at"), db_default=Now())

    class Meta:
        db_table = "django_pgqueue_concurrency"
        db_table_comment = (
            "django-pgqueue concurrency-limit claim state; written only by queue SQL."
        )
        verbose_name = _("concurrency key")
        verbose_name_plural = _("flow control")
        indexes = (
            # claim_batch, limited branch: keys under their limit whose next job can
            # start now, in claim order. A key at its limit, out of rate tokens or
            # waiting for a scheduled job is not in it, so a hundred thousand of them
            # cost a claim nothing (migration 0015).
            models.Index(
                fields=["queue", "-head_priority", "head_available_at", "head_id"],
                name="pgq_concurrency_claim",
                condition=Q(
                    head_id__isnull=False,
                    in_flight__lt=F("max_in_flight"),
                    wake_at__isnull=True,
                ),
            ),
            # fold_signals: keys whose scheduled next job or next token becomes ready.
            models.Index(
                fields=["wake_at"],
                name="pgq_concurrency_wake",
                condition=Q(wake_at__isnull=False),
            ),
        )

    def __str__(self) -> str:
        return self.concurrency_key


@no_comment_warnings
class ConcurrencySignal(models.Model):
    """A note from a producer that a concurrency key has new work: "refresh this key"."""

    id = models.BigAutoField(primary_key=True)
    concurrency_key = models.CharField(_("concurrency key"), max_length=KEY_MAX_LENGTH)
    urgent = models.BooleanField(
        _("urgent"),
        db_default=True,
        db_comment="The claim folds it (a job may be able to start); else housekeeping.",
    )
    job_id = models.BigIntegerField(
        _("job"),
        null=True,
        blank=True,
        db_comment="The job enqueued (of a bulk enqueue, the key's best ready one): the lazy "
        "fold compares it with the row's next job. NULL: the fold asks the job table.",
    )

    class Meta:
        db_table = "django_pgqueue_concurrency_signal"
        db_table_comment = "django-pgqueue: concurrency keys to refresh; folded in by claims."
        verbose_name = _("concurrency signal")
        verbose_name_plural = _("concurrency signals")
        indexes = (
            # fold_signals and the claim's probe (urgent ones), fold_lazy_signals (the
            # others), oldest first. Partial: each scan reads only its kind, whatever
            # the statistics say (a flood of lazy signals is never walked by a claim).
            models.Index(
                fields=["id"], name="pgq_concurrency_signal_urgent", condition=Q(urgent=True)
            ),
            models.Index(
                fields=["id"], name="pgq_concurrency_signal_lazy", condition=Q(urgent=False)
            ),
        )

    def __str__(self) -> str:
        return self.concurrency_key
