"""A worker's page and the pieces of it the listing shares: status, jobs in flight.

The page is a read-only summary (the registry is written by the workers only): what the
worker serves, exact times to the second, and its running jobs as links to the inbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.filters import EXPIRED
from django_pgqueue.admin.formatting import duration, exact, pretty_json, relative, worker_badge
from django_pgqueue.conf import conf
from django_pgqueue.models import Job, Worker
from django_pgqueue.states import JobStatus, WorkerStatus
from django_pgqueue.store.partition import BUCKET_COUNT
from django_pgqueue.store.reports import WorkerLoad

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

__all__ = ["in_flight_html", "inbox_url", "is_silent", "render_worker_detail", "worker_status"]


def is_silent(worker: Worker) -> bool:
    """Return whether an alive worker has not heartbeated for longer than the timeout."""
    silence = (timezone.now() - worker.last_seen_at).total_seconds()
    return worker.status == WorkerStatus.ALIVE and silence > conf.WORKER_TIMEOUT_SECONDS


def worker_status(worker: Worker) -> SafeString:
    """Return the worker's status badge; an alive worker gone silent is flagged."""
    return worker_badge(worker.status, silent=is_silent(worker))


def in_flight_html(worker: Worker, load: WorkerLoad | None, inbox: str) -> SafeString:
    """Return "running / concurrency", linked to those jobs in ``inbox`` (if not empty)."""
    jobs, expired = (load.jobs, load.expired) if load else (0, 0)
    count = format_html(
        '<span title="{}">{} / {}</span>',
        gettext("running jobs / concurrency"),
        jobs,
        worker.concurrency,
    )
    if jobs and inbox:
        query = urlencode({"status": JobStatus.PROCESSING.value, "claimed_by": worker.id})
        count = format_html('<a href="{}?{}">{}</a>', inbox, query, count)
    if not expired:
        return count
    label = gettext("%(count)d expired") % {"count": expired}
    if inbox:
        query = urlencode({"status": EXPIRED, "claimed_by": worker.id})
        return format_html(
            '{} <a class="pgq-expired" href="{}?{}">({})</a>', count, inbox, query, label
        )
    return format_html('{} <span class="pgq-expired">({})</span>', count, label)


def inbox_url(model_admin: ModelAdmin[Any], request: HttpRequest) -> str:
    """Return the inbox's URL, or "" if the user may not see it."""
    site = model_admin.admin_site
    try:
        inbox = site.get_model_admin(Job)
    except NotRegistered:
        return ""
    if not inbox.has_view_permission(request):
        return ""
    return reverse(f"admin:{Job._meta.app_label}_job_changelist", current_app=site.name)


@dataclass(frozen=True, slots=True)
class StuckHandler:
    """A handler its worker reports still running although asked to stop."""

    job_id: int
    task: str
    #: Seconds since it was asked to stop, as of now (the report plus the heartbeat's age).
    seconds: float
    why: str

    @property
    def label(self) -> str:
        """Return "handler still running 40 s past its timeout" (or after its cancel)."""
        if self.why == "timeout":
            return gettext("handler still running %(duration)s past its timeout") % {
                "duration": duration(self.seconds)
            }
        return gettext("handler still running %(duration)s after it was cancelled") % {
            "duration": duration(self.seconds)
        }


def stuck_handlers(worker: Worker, now: datetime) -> list[StuckHandler]:
    """Return the stuck handlers ``worker`` reported at its last heartbeat, aged to now."""
    reported = (worker.metadata or {}).get("stuck_handlers") or []
    since_beat = max(0.0, (now - worker.last_seen_at).total_seconds())
    found = []
    for item in reported:
        if not isinstance(item, dict):
            continue
        try:
            found.append(
                StuckHandler(
                    job_id=int(item["job"]),
                    task=str(item.get("task", "")),
                    seconds=float(item.get("seconds", 0)) + since_beat,
                    why=str(item.get("why", "timeout")),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue  # written by another release: shown in the metadata as it is
    return found


def render_worker_detail(
    model_admin: ModelAdmin[Any], request: HttpRequest, object_id: str
) -> HttpResponse:
    """Render the read-only page of one worker (GET only)."""
    if request.method not in {"GET", "HEAD"}:
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    opts = model_admin.opts
    changelist = reverse(
        f"admin:{opts.app_label}_{opts.model_name}_changelist",
        current_app=model_admin.admin_site.name,
    )
    worker = model_admin.get_object(request, unquote(object_id))
    if worker is None:
        # Housekeeping forgets dead workers after a while.
        model_admin.message_user(
            request,
            _("Worker %(id)s is not in the registry any more.") % {"id": object_id},
            messages.WARNING,
        )
        return HttpResponseRedirect(changelist)
    now = timezone.now()
    load = (
        Job.objects.store(model_admin.model.objects.db).jobs_in_flight([worker.id]).get(worker.id)
    )
    metadata = dict(worker.metadata or {})
    owned = metadata.pop("owned_buckets", None)
    stuck = stuck_handlers(worker, now)
    buckets = (
        sorted((str(queue), count) for queue, count in owned.items())
        if isinstance(owned, dict)
        else []
    )
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Worker %(id)s") % {"id": worker.id},
        "opts": opts,
        "original": worker,
        "worker": worker,
        "status_html": worker_status(worker),
        "silent": is_silent(worker),
        "in_flight_html": in_flight_html(worker, load, inbox_url(model_admin, request)),
        "queues": [str(queue) for queue in worker.queues or []],
        "buckets": buckets,
        "bucket_count": BUCKET_COUNT,
        "started_exact": exact(worker.started_at),
        "started_relative": relative(worker.started_at, now),
        "uptime": duration((now - worker.started_at).total_seconds()),
        "last_seen_exact": exact(worker.last_seen_at),
        "last_seen_relative": relative(worker.last_seen_at, now),
        "timeout": conf.WORKER_TIMEOUT_SECONDS,
        "metadata_json": pretty_json(metadata) if metadata else "",
        "stuck_handlers": stuck,
        "stuck_grace": conf.STUCK_HANDLER_GRACE_SECONDS,
        "changelist_url": changelist,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_pgqueue/admin/worker_detail.html", context)
