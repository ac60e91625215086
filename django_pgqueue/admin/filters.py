"""The changelist filters: status, queue, task, partition key, error class and time ranges.

Each filter narrows the listing with conditions an index can serve on a table of millions
of rows (the comments name the index). Text filters match exactly: a ``LIKE '%x%'`` on
a free-text column would read the whole table. None of them lists distinct values by
scanning the job table; the queue filter asks the queue manager, which probes indexes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateTimeRangeFilter

from django_pgqueue.admin.pagination import estimate_rows
from django_pgqueue.admin.queues import known_queues
from django_pgqueue.states import TERMINAL_STATUSES, JobStatus

__all__ = [
    "ANY_TIME",
    "EXPIRED",
    "NO_ERROR_CLASS",
    "READY",
    "SCHEDULED",
    "AvailableRangeFilter",
    "CreatedRangeFilter",
    "ErrorClassFilter",
    "FinishedRangeFilter",
    "PartitionKeyFilter",
    "QueueFilter",
    "StatusFilter",
    "TaskFilter",
]

#: "available_at > ANY_TIME" holds for every row. It says "available_at IS NOT NULL" in a
#: form PostgreSQL 17+ still matches against the pending indexes' predicates (it drops an
#: IS NOT NULL on a NOT NULL column before matching, and then cannot use them).
ANY_TIME = datetime(1, 1, 2, tzinfo=UTC)

#: Error-class filter value of dead letters recorded without an error class.
NO_ERROR_CLASS = "-"

#: Status filter values of the states operators act on, besides the statuses themselves.
READY = "ready"
SCHEDULED = "scheduled"
UNKNOWN_TASK = "unknown_task"
EXPIRED = "expired"


def _status_conditions() -> dict[str, tuple[Any, Q]]:
    now = timezone.now()
    pending = Q(status=JobStatus.PENDING)
    processing = Q(status=JobStatus.PROCESSING)
    return {
        # pgq_job_blocked.
        JobStatus.BLOCKED: (JobStatus.BLOCKED.label, Q(status=JobStatus.BLOCKED)),
        # pgq_job_pending holds every pending row.
        JobStatus.PENDING: (JobStatus.PENDING.label, pending & Q(available_at__gt=ANY_TIME)),
        READY: (
            _("Pending, ready now"),
            pending & Q(available_at__lte=now, unknown_task_since__isnull=True),
        ),
        SCHEDULED: (
            _("Pending, scheduled"),
            pending & Q(available_at__gt=now, unknown_task_since__isnull=True),
        ),
        # pgq_job_unknown_task.
        UNKNOWN_TASK: (
            _("Pending, waiting for a worker that knows its task"),
            pending & Q(unknown_task_since__isnull=False),
        ),
        # pgq_job_lease holds every processing row (a lease is required to process).
        JobStatus.PROCESSING: (
            JobStatus.PROCESSING.label,
            processing & Q(lease_expires_at__isnull=False),
        ),
        EXPIRED: (_("Processing, lease expired"), processing & Q(lease_expires_at__lt=now)),
        # Succeeded rows are most of the table: the primary key finds the newest quickly.
        JobStatus.SUCCEEDED: (JobStatus.SUCCEEDED.label, Q(status=JobStatus.SUCCEEDED)),
        # pgq_job_revivable.
        JobStatus.DEAD_LETTER: (JobStatus.DEAD_LETTER.label, Q(status=JobStatus.DEAD_LETTER)),
        JobStatus.CANCELLED: (JobStatus.CANCELLED.label, Q(status=JobStatus.CANCELLED)),
    }


class StatusFilter(admin.SimpleListFilter):
    """Filter by status, with the states operators act on split out (ready, expired...)."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """Return every status and sub-state, in the order of a job's life."""
        return [(str(value), label) for value, (label, _q) in _status_conditions().items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Narrow to the chosen status; an unknown value matches nothing."""
        value = self.value()
        if value is None:
            return queryset
        condition = _status_conditions().get(value)
        return queryset.filter(condition[1]) if condition else queryset.none()


class QueueFilter(admin.SimpleListFilter):
    """Filter by queue, among the queues configured or in use."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Return the known queues (found through indexes, never by scanning jobs)."""
        queues = known_queues(model_admin.model.objects.db)
        value = request.GET.get(self.parameter_name)
        if value and value not in queues:
            queues = sorted([*queues, value])  # keep a filter on an empty queue visible
        return [(queue, queue) for queue in queues]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Narrow to one queue (pgq_job_filter_brin, or the primary key if it is common)."""
        value = self.value()
        return queryset if value is None else queryset.filter(queue=value)


class TextInputFilter(admin.SimpleListFilter):
    """A filter with a text box: an exact match on one column."""

    template = "django_pgqueue/admin/input_filter.html"
    field_name: str = ""
    placeholder: Any = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> Sequence[tuple[str, str]]:
        """Return no fixed choices: the value is typed in."""
        return ()

    def has_output(self) -> bool:
        """Always show the text box."""
        return True

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Narrow to rows whose column equals the typed value."""
        value = self.value()
        if not value:
            return queryset
        return queryset.filter(**{self.field_name: value})

    def choices(self, changelist: ChangeList) -> Iterator[Any]:
        """Yield what the template's form needs: the value and the other parameters."""
        hidden = [
            (name, value)
            for name, values in changelist.filter_params.items()
            if name != self.parameter_name
            for value in values
        ]
        yield {
            "selected": bool(self.value()),
            "value": self.value() or "",
            "parameter_name": self.parameter_name,
            "placeholder": self.placeholder,
            "hidden": hidden,
            "clear_query_string": changelist.get_query_string(remove=[str(self.parameter_name)]),
        }


class TaskFilter(TextInputFilter):
    """Filter by task path (pgq_job_filter_brin; pgq_job_dead for dead letters)."""

    title = _("task")
    parameter_name = "task"
    field_name = "task_path"
    placeholder = _("module.function")


class PartitionKeyFilter(TextInputFilter):
    """Filter by partition key (pgq_job_filter_brin; pgq_job_part_pending when pending)."""

    title = _("partition key")
    parameter_name = "partition_key"
    field_name = "partition_key"
    placeholder = _("exact key")


class ErrorClassFilter(TextInputFilter):
    """Filter by the class of the last error; ``-`` matches jobs without one."""

    title = _("error class")
    parameter_name = "error_class"
    field_name = "last_error_class"
    placeholder = _("exact class, or -")

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Narrow to one error class, or to jobs without one."""
        if self.value() == NO_ERROR_CLASS:
            return queryset.filter(last_error_class__isnull=True)
        return super().queryset(request, queryset)


class TimeRangeFilter(DateTimeRangeFilter):  # type: ignore[misc] # rangefilter is untyped
    """A date-time range (django-admin-rangefilter) that may also order the listing.

    Listed newest id first, a narrow range in the past makes PostgreSQL walk the primary
    key backwards through every newer row (it assumes matches are spread evenly). When
    the range holds few rows the listing is ordered by the range's own column instead:
    the index finds those rows and sorting them is cheap.
    """

    #: Ranges estimated to hold at most this many rows order the listing by their column.
    sort_limit = 50_000

    def is_active(self) -> bool:
        """Return whether a valid range was entered."""
        return bool(self.form.is_valid() and any(self.form.cleaned_data.values()))

    def listing_order(self, queryset: QuerySet[Any]) -> str | None:
        """Return the column to order the filtered listing by, or None to keep the default."""
        if not self.is_active():
            return None
        if estimate_rows(queryset) > self.sort_limit:
            return None
        column: str = self.field_path
        return column


class CreatedRangeFilter(TimeRangeFilter):
    """Created-at range (pgq_job_created_brin)."""


class AvailableRangeFilter(TimeRangeFilter):
    """Available-at range (pgq_job_filter_brin)."""


class FinishedRangeFilter(TimeRangeFilter):
    """Finished-at range (pgq_job_finished, which also orders the listing)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Narrow to finished jobs in the range (only finished jobs have finished_at)."""
        filtered: QuerySet[Any] = super().queryset(request, queryset)
        if self.is_active():
            # Implied by finished_at being set; stated so pgq_job_finished applies.
            filtered = filtered.filter(status__in=sorted(TERMINAL_STATUSES))
        return filtered

    def listing_order(self, queryset: QuerySet[Any]) -> str | None:
        """Order by finished_at whenever the range is set: its index has that order."""
        column: str = self.field_path
        return column if self.is_active() else None
