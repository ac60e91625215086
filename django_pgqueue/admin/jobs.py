"""The inbox: every job, filterable and searchable, with its read-only detail page.

Jobs are never edited or deleted through the ORM here: the change view is a read-only
page, Django's delete views are closed (``has_delete_permission`` is False), and every
change is an action that goes through the queue manager. The model's delete permission
allows the "discard" action.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.functions import Left
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.actions import (
    CANCEL,
    DISCARD,
    REQUEUE,
    RETRY,
    RETRY_REVIVE,
    RUN_NOW,
    operation_actions,
)
from django_pgqueue.admin.changelist import QueueChangeList
from django_pgqueue.admin.detail import render_job_detail
from django_pgqueue.admin.filters import (
    AvailableRangeFilter,
    CreatedRangeFilter,
    FinishedRangeFilter,
    PartitionKeyFilter,
    QueueFilter,
    StatusFilter,
    TaskFilter,
)
from django_pgqueue.admin.formatting import moment, status_badge, task_link
from django_pgqueue.admin.pagination import EstimatedCountPaginator
from django_pgqueue.admin.parameters import drop_unstorable_parameters
from django_pgqueue.admin.pauses import can_pause, pause_links, paused_queues_for
from django_pgqueue.admin.queues import known_queues
from django_pgqueue.admin.stuck import stuck_lines
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus

__all__ = ["BaseJobAdmin", "JobAdmin"]

#: Largest id a search term may name (bigint).
_MAX_ID = 2**63 - 1
_MAX_ID_DIGITS = len(str(_MAX_ID))
#: Characters of the last error the listings read; the rest stays in the database.
ERROR_EXCERPT = 200
_ACTIVE = frozenset({JobStatus.PENDING, JobStatus.PROCESSING})


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
    #: Columns the listing never shows and that can be large (of the last error, the
    #: listing reads only its start: see get_queryset).
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
    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        """Return the jobs, each with the start of its last error (``error_excerpt``)."""
        return (
            super().get_queryset(request).annotate(error_excerpt=Left("last_error", ERROR_EXCERPT))
        )

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """Return the permissions the app list shows: view, never "change".

        The change permission only runs the actions; nothing here is edited in a form,
        so the index and the sidebar offer a "View" link.
        """
        return {**super().get_model_perms(request), "change": False}

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
    # One short line per job; everything else is on the job's page. The stylesheet clips
    # task and error to the width left, and the tooltips hold the whole text.
    @admin.display(description=_("task"))
    def task(self, job: Job) -> SafeString:
        """Show the task, linked to the listing of that task's jobs: its function's name
        whole, then its module, cut to the width left (the tooltip has the whole path)."""
        return task_link(job.task_path, f"?{urlencode({'task': job.task_path})}")

    @admin.display(description=_("queue"))
    def queue_name(self, job: Job) -> SafeString:
        """Show the queue, linked to the listing of that queue."""
        return format_html('<a href="?{}">{}</a>', urlencode({"queue": job.queue}), job.queue)

    @admin.display(description=_("status"))
    def status_display(self, job: Job) -> SafeString:
        """Show the status as a badge (a job waiting for its task as its own kind), and
        the attempts of a job that is retrying."""
        badge = status_badge(job.status, unknown_task=job.unknown_task_since is not None)
        if job.status in _ACTIVE and job.last_error_class and job.attempts:
            return format_html(
                '{} <span class="pgq-muted" title="{}">{}/{}</span>',
                badge,
                _("attempts started, of the maximum"),
                job.attempts,
                job.max_attempts,
            )
        return badge

    @admin.display(description=_("when"))
    def when(self, job: Job) -> SafeString:
        """Show the moment that matters for the job's status, as a compact age.

        Ready or scheduled for a pending job, claimed (or lease expired) for a running
        one, finished for the others; the tooltip names it and gives the exact time.
        """
        now = timezone.now()
        if job.status == JobStatus.PENDING:
            label = _("ready since") if job.available_at <= now else _("scheduled for")
            return moment(job.available_at, str(label), now=now)
        if job.status == JobStatus.PROCESSING:
            if job.lease_expires_at is not None and job.lease_expires_at < now:
                return format_html(
                    '<span class="pgq-expired">{}</span>',
                    moment(job.lease_expires_at, str(_("lease expired at")), now=now),
                )
            return moment(job.claimed_at, str(_("claimed at")), now=now)
        return moment(job.finished_at, str(_("finished at")), now=now)

    @admin.display(description=_("error"), empty_value="")
    def error(self, job: Job) -> SafeString:
        """Show the class and the start of the last error (the job's page has them all).

        The class goes without its module ("ReadTimeout"), leaving the width to the
        message; the tooltip has both in full. A job that succeeded in the end shows
        none: its failed attempts are on its page.
        """
        excerpt: str = getattr(job, "error_excerpt", None) or ""  # see get_queryset
        error_class = job.last_error_class or ""
        if job.status == JobStatus.SUCCEEDED or not (error_class or excerpt):
            return SafeString("")
        return format_html(
            '<span title="{}: {}"><span class="pgq-error-class">{}</span> {}</span>',
            error_class,
            excerpt,
            error_class.rpartition(".")[2],
            excerpt,
        )

    #: Title of the listing page (Django's is "Select job to change").
    listing_title: Any = _("Jobs")
    #: Whether the listing shows what is stuck above the jobs (the inbox does).
    shows_stuck = False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Render the listing under a plain title (dropping filters no row can match)."""
        redirect = drop_unstorable_parameters(request)
        if redirect is not None:
            return redirect
        paused = paused_queues_for(self)
        queues = known_queues(self.model.objects.db) if self.shows_stuck else []
        return super().changelist_view(
            request,
            {
                "title": self.listing_title,
                "paused": paused,
                "can_pause": can_pause(request),
                "stuck": stuck_lines(self, request, queues) if self.shows_stuck else None,
                "pausable_queues": pause_links(request, queues, paused),
                **(extra_context or {}),
            },
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
    """The inbox: all jobs, under what is stuck right now."""

    shows_stuck = True
    list_display = ("id", "task", "status_display", "queue_name", "when", "error")
    list_filter = (
        StatusFilter,
        QueueFilter,
        TaskFilter,
        PartitionKeyFilter,
        ("created_at", CreatedRangeFilter),
        ("available_at", AvailableRangeFilter),
        ("finished_at", FinishedRangeFilter),
    )
    actions = operation_actions(RETRY, RETRY_REVIVE, RUN_NOW, CANCEL, REQUEUE, DISCARD)
