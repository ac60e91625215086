"""The dead letters: jobs that gave up, listed and grouped by task and error class.

The grouped view (``admin:django_pgqueue_deadletter_groups``) answers "what is failing,
how often, and with what error" in one page; each group links to its jobs and can be
retried or discarded as a whole, through the same confirmed actions as the listing.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.actions import (
    DISCARD,
    RETRY,
    RETRY_REVIVE,
    has_operation_permission,
    operation_actions,
)
from django_pgqueue.admin.filters import (
    NO_ERROR_CLASS,
    CreatedRangeFilter,
    ErrorClassFilter,
    FinishedRangeFilter,
    QueueFilter,
    TaskFilter,
)
from django_pgqueue.admin.formatting import moment, task_link
from django_pgqueue.admin.jobs import BaseJobAdmin
from django_pgqueue.models import Dependency, Job
from django_pgqueue.states import JobStatus

__all__ = ["DeadLetterAdmin"]

#: Groups shown on the grouped view, largest first.
GROUPS_SHOWN = 500


class DeadLetterAdmin(BaseJobAdmin):
    """Dead-lettered jobs only, with the grouped view and retry/discard actions."""

    # Every row is a dead letter: no status column, and the error gets its width. A
    # failure's cancelled dependents (rare) lead the error cell, where a column of their
    # own, empty on almost every row, took the error's width.
    list_display = ("id", "task", "queue_name", "when", "error")
    list_filter = (
        QueueFilter,
        TaskFilter,
        ErrorClassFilter,
        ("finished_at", FinishedRangeFilter),
        ("created_at", CreatedRangeFilter),
    )
    actions = operation_actions(RETRY, RETRY_REVIVE, DISCARD)
    listing_title = _("Dead letters")
    change_list_template = "django_pgqueue/admin/dead_letter_changelist.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        """Return dead letters only (pgq_job_revivable, newest first)."""
        # Per row, the dependents its failure cancelled (pgq_dep_blocker; a page is 100).
        cancelled = (
            Dependency.objects.filter(
                blocker_id=OuterRef("pk"), cancelled_job=True, job__status=JobStatus.CANCELLED
            )
            .order_by()
            .values("blocker_id")
            .annotate(count=Count("*"))
            .values("count")
        )
        return (
            super()
            .get_queryset(request)
            .filter(status=JobStatus.DEAD_LETTER)
            .annotate(cancelled_dependents=Subquery(cancelled))
        )

    @admin.display(description=_("error"), empty_value="")
    def error(self, job: Job) -> SafeString:
        """Show how many jobs its failure cancelled (if any), then the last error."""
        error = super().error(job)
        dependents = self.dependents(job)
        # One span in the cell: the stylesheet clips it to the width left, on one line.
        return format_html("<span>{} {}</span>", dependents, error) if dependents else error

    def dependents(self, job: Job) -> SafeString:
        """Show how many jobs that ran after this one its failure cancelled."""
        count = getattr(job, "cancelled_dependents", None) or 0
        if not count:
            return SafeString("")
        return format_html(
            '<a class="pgq-warn" href="{}" title="{}">{}</a>',
            reverse("admin:django_pgqueue_job_change", args=[job.pk]),
            _("cancelled because this job failed; “Retry and revive dependents” runs them"),
            ngettext("%(count)d cancelled", "%(count)d cancelled", count) % {"count": count},
        )

    def get_urls(self) -> list[URLPattern]:
        """Add the grouped view in front of the standard URLs."""
        groups = path(
            "groups/",
            self.admin_site.admin_view(self.groups_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_groups",
        )
        return [groups, *super().get_urls()]

    def groups_view(self, request: HttpRequest) -> TemplateResponse:
        """Render dead letters grouped by task and error class."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        changelist = reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
            current_app=self.admin_site.name,
        )
        groups = Job.objects.store(self.model.objects.db).dead_letter_groups(limit=GROUPS_SHOWN)
        rows = [
            {
                "group": group,
                "newest": moment(group.sample_finished_at, gettext("newest dead letter")),
                "error_class": (group.last_error_class or "").rpartition(".")[2],
                "url": changelist
                + "?"
                + urlencode(
                    {
                        "task": group.task_path,
                        "error_class": group.last_error_class or NO_ERROR_CLASS,
                    }
                ),
            }
            for group in groups
        ]
        for row, group in zip(rows, groups, strict=True):
            row["task"] = task_link(group.task_path, str(row["url"]))
        actions = self.get_actions(request)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Dead letters by task and error"),
            "opts": self.opts,
            "rows": rows,
            "groups_shown": GROUPS_SHOWN,
            "changelist_url": changelist,
            "can_retry": RETRY.name in actions and has_operation_permission(self, request, RETRY),
            "can_discard": DISCARD.name in actions
            and has_operation_permission(self, request, DISCARD),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_pgqueue/admin/dead_letter_groups.html", context)
