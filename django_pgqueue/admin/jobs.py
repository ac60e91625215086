"""The inbox: every job, filterable and searchable, with its read-only detail page.

Also registers the lag page (``admin:django_pgqueue_lag``). Jobs are never edited or
deleted through the ORM here: the change view is a read-only page, Django's delete views
are closed (``has_delete_permission`` is False), and every change is an action that goes
through the queue manager. The model's delete permission allows the "discard" action.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Job
from ..states import JobStatus
from .actions import CANCEL, DISCARD, REQUEUE, RETRY, RUN_NOW, operation_actions
from .changelist import QueueChangeList
from .detail import render_job_detail
from .filters import (
    AvailableRangeFilter,
    CreatedRangeFilter,
    FinishedRangeFilter,
    PartitionKeyFilter,
    QueueFilter,
    StatusFilter,
    TaskFilter,
)
from .formatting import relative, status_badge
from .lag import lag_view
from .pagination import EstimatedCountPaginator
from .parameters import drop_unstorable_parameters

__all__ = ["BaseJobAdmin", "JobAdmin"]

#: Largest id a search term may name (bigint).
_MAX_ID = 2**63 - 1
_MAX_ID_DIGITS = len(str(_MAX_ID))


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Job]
else:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin


class BaseJobAdmin(_ModelAdmin):
    """What the inbox and the dead-letter page share: read-only, counted cheaply."""

    # Counting a filtered million-row table exactly takes seconds: see pagination.py.
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    # Facets count every filter choice on every page view.
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    list_max_show_all = 50
    # Only the primary key orders a million rows without sorting them.
    sortable_by = ("id",)
    list_display_links = ("id",)
    search_fields = ("=id",)  # shows the search box; get_search_results does the work
    search_help_text = _("An exact job id, idempotency key or partition key.")
    change_list_template = "django_pgqueue/admin/job_changelist.html"
    #: Columns the listing never shows and that can be large.
    list_deferred_fields: tuple[str, ...] = ("args", "kwargs", "errors", "result", "last_error")

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("django_pgqueue/admin/pgqueue.css",)}

    # ------------------------------------------------------------------ permissions
    def has_add_permission(self, request: HttpRequest) -> bool:
        """Return False: jobs are enqueued by code, not typed in."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: Django's delete views use the ORM; "discard" replaces them."""
        return False

    def has_discard_permission(self, request: HttpRequest) -> bool:
        """Return whether the user may discard jobs (the model's delete permission)."""
        codename = get_permission_codename("delete", self.opts)
        return bool(request.user.has_perm(f"{self.opts.app_label}.{codename}"))

    # ------------------------------------------------------------------ listing
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[QueueChangeList]:
        """Return the changelist class that leaves payloads out and orders by index."""
        return QueueChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """Match the term exactly against id, idempotency key and partition key.

        Each is an index lookup (primary key, pgq_job_idempotency_key,
        pgq_job_filter_brin); a substring search would read the whole table.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(idempotency_key=term) | Q(partition_key=term)
        number = term.removeprefix("#")
        # isdigit() is also true of "²" and Arabic-Indic digits; int() refuses the first and
        # reads the others. Only ASCII digits of a bigint name a job.
        if (
            number.isascii()
            and number.isdigit()
            and len(number) <= _MAX_ID_DIGITS
            and (int(number) <= _MAX_ID)
        ):
            condition |= Q(pk=int(number))
        return queryset.filter(condition), False

    # ------------------------------------------------------------------ columns
    @admin.display(description=_("task"))
    def task(self, job: Job) -> SafeString:
        """Show the task path, linked to the listing of that task's jobs."""
        return format_html(
            '<a href="?{}">{}</a>', urlencode({"task": job.task_path}), job.task_path
        )

    @admin.display(description=_("queue"))
    def queue_name(self, job: Job) -> SafeString:
        """Show the queue, linked to the listing of that queue."""
        return format_html('<a href="?{}">{}</a>', urlencode({"queue": job.queue}), job.queue)

    @admin.display(description=_("status"))
    def status_display(self, job: Job) -> SafeString:
        """Show the status as a badge (a job waiting for its task as its own kind)."""
        return status_badge(job.status, unknown_task=job.unknown_task_since is not None)

    @admin.display(description=_("attempts"))
    def attempts_display(self, job: Job) -> str:
        """Show attempts started out of the maximum."""
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description=_("available"))
    def available(self, job: Job) -> str:
        """Show when a pending job becomes or became ready."""
        if job.status != JobStatus.PENDING:
            return ""
        return relative(job.available_at)

    @admin.display(description=_("lease expires"))
    def lease(self, job: Job) -> SafeString | str:
        """Show when a running job's lease expires, flagged once it has."""
        if job.status != JobStatus.PROCESSING or job.lease_expires_at is None:
            return ""
        text = relative(job.lease_expires_at)
        if job.lease_expires_at < timezone.now():
            return format_html('<span class="pgq-expired">{}</span>', _("expired %s") % text)
        return text

    @admin.display(description=_("age"))
    def age(self, job: Job) -> str:
        """Show how long ago the job was created."""
        return relative(job.created_at)

    #: Title of the listing page (Django's is "Select job to change").
    listing_title: Any = _("Jobs")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Render the listing under a plain title (dropping filters no row can match)."""
        redirect = drop_unstorable_parameters(request)
        if redirect is not None:
            return redirect
        return super().changelist_view(
            request, {"title": self.listing_title, **(extra_context or {})}
        )

    # ------------------------------------------------------------------ read-only views
    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Render the read-only job page."""
        return render_job_detail(self, request, object_id)

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: bool) -> None:
        """Refuse: jobs change only through the queue manager."""
        raise PermissionDenied

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        """Refuse: jobs are discarded through the queue manager."""
        raise PermissionDenied

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Refuse: jobs are discarded through the queue manager."""
        raise PermissionDenied


class JobAdmin(BaseJobAdmin):
    """The inbox: all jobs."""

    list_display = (
        "id",
        "task",
        "queue_name",
        "status_display",
        "attempts_display",
        "priority",
        "available",
        "claimed_by",
        "lease",
        "age",
    )
    list_filter = (
        StatusFilter,
        QueueFilter,
        TaskFilter,
        PartitionKeyFilter,
        ("created_at", CreatedRangeFilter),
        ("available_at", AvailableRangeFilter),
        ("finished_at", FinishedRangeFilter),
    )
    actions = operation_actions(RETRY, RUN_NOW, CANCEL, REQUEUE, DISCARD)

    def get_urls(self) -> list[URLPattern]:
        """Add the lag page in front of the standard job URLs."""
        lag = path(
            "lag/",
            self.admin_site.admin_view(self.lag_view),
            name=f"{self.opts.app_label}_lag",
        )
        return [lag, *super().get_urls()]

    def lag_view(self, request: HttpRequest) -> TemplateResponse:
        """Render the lag page."""
        return lag_view(self, request)
