"""Models of the test app: the execution ledger written by test tasks."""

from __future__ import annotations

from django.db import models


class LedgerEntry(models.Model):
    """One event of a test task, written over its own autocommit connection.

    Because the ledger does not share the handler's transaction, it records what really
    ran even when the handler's own work rolls back or its worker is killed.
    """

    job_id = models.BigIntegerField()
    event = models.CharField(max_length=32)
    attempt = models.IntegerField(default=0)
    lease_generation = models.BigIntegerField(default=0)
    worker_pid = models.IntegerField(default=0)
    label = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = (models.Index(fields=["job_id", "event"], name="ledger_job_event"),)


class Order(models.Model):
    """A domain row a task writes in its own (or an atomic) transaction."""

    job_id = models.BigIntegerField(unique=True)
    note = models.CharField(max_length=200, blank=True, default="")
