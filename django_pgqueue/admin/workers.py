"""The worker registry: who is alive, draining or dead, and what each one is holding.

Read-only: rows belong to the workers, which write them on every heartbeat. The registry
is advisory (never trusted for safety), so the page also flags an "alive" worker that
has been silent for longer than the worker timeout: housekeeping will mark it dead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.formatting import age, exact, moment
from django_pgqueue.admin.parameters import drop_unstorable_parameters
from django_pgqueue.admin.worker_detail import (
    in_flight_html,
    inbox_url,
    render_worker_detail,
    worker_status,
)
from django_pgqueue.models import Job, Worker
from django_pgqueue.store.partition import BUCKET_COUNT
from django_pgqueue.store.reports import WorkerLoad

__all__ = ["WorkerAdmin"]


if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Worker]
else:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin


class WorkerAdmin(_ModelAdmin):
    """Live, draining and dead workers with their jobs in flight and partition buckets."""

    # Host and pid make up the id; buckets, metadata and exact times are on its page. The
    # start goes with the last heartbeat ("4s · up 3h"): a column of its own pushed the
    # table past its column at 1280x800 with the sidebar open.
    list_display = (
        "id",
        "status_display",
        "queue_list",
        "in_flight",
        "buckets",
        "last_seen",
    )
    list_filter = ("status", "hostname")
    show_facets = admin.ShowFacets.NEVER
    search_fields = ("id", "hostname")
    ordering = ("status", "-last_seen_at")
    list_per_page = 100

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("django_pgqueue/admin/pgqueue.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Return False: workers register themselves."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: the registry is written by the workers only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: housekeeping forgets dead workers on its own."""
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Render the listing, with each worker's running jobs looked up in one query."""
        redirect = drop_unstorable_parameters(request)
        if redirect is not None:
            return redirect
        response = super().changelist_view(
            request, {"title": _("Workers"), **(extra_context or {})}
        )
        if isinstance(response, TemplateResponse) and response.context_data:
            changelist = response.context_data.get("cl")
            if changelist is not None:
                # Evaluates the page once; the template then reads the same instances.
                workers = list(changelist.result_list)
                loads = Job.objects.store(self.model.objects.db).jobs_in_flight(
                    [worker.id for worker in workers]
                )
                inbox = inbox_url(self, request)
                for worker in workers:
                    worker.in_flight_load = loads.get(worker.id)
                    worker.inbox_url = inbox
        return response

    @admin.display(description=_("status"))
    def status_display(self, worker: Worker) -> SafeString:
        """Show the status; an alive worker silent past the timeout is flagged."""
        return worker_status(worker)

    @admin.display(description=_("queues"))
    def queue_list(self, worker: Worker) -> str:
        """Show the queues the worker serves."""
        return ", ".join(str(queue) for queue in worker.queues or [])

    @admin.display(description=_("jobs in flight"))
    def in_flight(self, worker: Worker) -> SafeString:
        """Show the running jobs the worker holds, of its concurrency, linked to them."""
        load: WorkerLoad | None = getattr(worker, "in_flight_load", None)
        return in_flight_html(worker, load, getattr(worker, "inbox_url", ""))

    @admin.display(description=_("buckets"))
    def buckets(self, worker: Worker) -> SafeString:
        """Show how many of the partition buckets of each queue the worker owns."""
        owned = (worker.metadata or {}).get("owned_buckets") or {}
        if not isinstance(owned, dict):
            return SafeString("")
        return format_html(
            "<span>{}</span>",
            format_html_join(
                ", ",
                "{}: {}/{}",
                ((queue, count, BUCKET_COUNT) for queue, count in sorted(owned.items())),
            ),
        )

    @admin.display(description=_("last seen"), ordering="last_seen_at")
    def last_seen(self, worker: Worker) -> SafeString:
        """Show how long ago the worker last heartbeated, and how long it has been up."""
        now = timezone.now()
        return format_html(
            '{} <span class="pgq-muted" title="{}">· {}</span>',
            moment(worker.last_seen_at, gettext("last heartbeat at"), now=now),
            gettext("started at %(moment)s") % {"moment": exact(worker.started_at)},
            gettext("up %(duration)s") % {"duration": age(worker.started_at, now)},
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Render the worker's page: a read-only summary, not a form."""
        return render_worker_detail(self, request, object_id)
