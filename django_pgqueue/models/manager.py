"""``Job.objects``: read jobs with the ORM, change them only through the queue store."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models

from django_pgqueue.exceptions import NotPostgreSQL
from django_pgqueue.states import BlockerFailure
from django_pgqueue.store.runners import DjangoRunner
from django_pgqueue.store.values import JobSpec, OperatorResult, ReapedJob

if TYPE_CHECKING:
    from django_pgqueue.models import Job
from django_pgqueue.store.queue import QueueStore


# ---------------------------------------------------------------------- Job.objects
class JobManager(models.Manager["Job"]):
    """``Job.objects``: read jobs with the ORM, change them only through these methods."""

    def store(self, using: str | None = None) -> QueueStore:
        """Return a :class:`QueueStore` on the Django connection for ``using``.

        Raises :class:`~django_pgqueue.exceptions.NotPostgreSQL` if that database is not
        PostgreSQL (its statements would fail with a syntax error naming nothing).
        """
        alias = using or self.db
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            raise NotPostgreSQL(alias, vendor, f"DATABASES[{alias!r}]['ENGINE']")
        return QueueStore(DjangoRunner(alias))

    def enqueue(
        self,
        task_path: str,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int | None = None,
        available_at: datetime | None = None,
        idempotency_key: str | None = None,
        partition_key: str | None = None,
        coalesce_key: str | None = None,
        debounce: timedelta | float | None = None,
        after: Sequence[Any] = (),
        on_blocker_failure: str = BlockerFailure.CANCEL,
        using: str | None = None,
    ) -> Job:
        """Enqueue one job in the current transaction; see :meth:`QueueStore.enqueue`.

        ``after``: jobs (ids, jobs or task results) it runs after; it is stored
        ``blocked`` until they have all succeeded.
        """
        spec = JobSpec(
            task_path=task_path,
            queue=queue,
            args=args,
            kwargs=kwargs or {},
            priority=priority,
            max_attempts=max_attempts,
            available_at=available_at,
            idempotency_key=idempotency_key,
            partition_key=partition_key,
            coalesce_key=coalesce_key,
            debounce=debounce,
            after=tuple(after),
            on_blocker_failure=on_blocker_failure,
        )
        return self.store(using).enqueue(spec).job

    def enqueue_many(self, specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
        """Enqueue many jobs with one statement; see :meth:`QueueStore.enqueue_many`."""
        return [outcome.job for outcome in self.store(using).enqueue_many(specs)]

    def retry(
        self,
        job_ids: Iterable[int],
        *,
        revive_dependents: bool = False,
        using: str | None = None,
    ) -> OperatorResult:
        """Revive dead-lettered or cancelled jobs (and, if asked, what they cancelled)."""
        return self.store(using).retry(job_ids, revive_dependents=revive_dependents)

    def run_now(self, job_ids: Iterable[int], *, using: str | None = None) -> OperatorResult:
        """Make scheduled pending jobs ready now."""
        return self.store(using).run_now(job_ids)

    def cancel(
        self, job_ids: Iterable[int], *, reason: str | None = None, using: str | None = None
    ) -> OperatorResult:
        """Cancel pending and running jobs; see :meth:`QueueStore.cancel`."""
        return self.store(using).cancel(job_ids, reason=reason)

    def discard(self, job_ids: Iterable[int], *, using: str | None = None) -> OperatorResult:
        """Delete finished jobs."""
        return self.store(using).discard(job_ids)

    def requeue_expired(
        self, job_ids: Iterable[int], *, using: str | None = None
    ) -> OperatorResult:
        """Recover jobs whose lease expired, now rather than at the next housekeeping."""
        return self.store(using).requeue_expired(job_ids)

    def reap_expired(self, *, limit: int = 1000, using: str | None = None) -> list[ReapedJob]:
        """Recover jobs whose lease expired (housekeeping does this on its own)."""
        return self.store(using).reap_expired(limit=limit)
