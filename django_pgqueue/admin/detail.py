"""The read-only job page: payloads, error history, timeline, partition and actions.

Shared by the inbox and the dead-letter page, each with its own permissions. Nothing on
it can be edited; operator actions are buttons that go through the action confirmation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.actions import OPERATIONS, RETURN_TO, Operation, has_operation_permission
from django_pgqueue.admin.flow import describe_wait
from django_pgqueue.admin.formatting import (
    UNKNOWN_TASK_LABEL,
    duration,
    pretty_json,
    relative,
    status_badge,
)
from django_pgqueue.admin.worker_detail import StuckHandler, stuck_handlers
from django_pgqueue.conf import conf
from django_pgqueue.features.periodic import parse_fire_key
from django_pgqueue.models import Job, Worker
from django_pgqueue.states import JobStatus

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

__all__ = ["TimelineEvent", "render_job_detail"]

#: Jobs waiting behind a partitioned job that the page lists.
WAITING_SHOWN = 20


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One moment in a job's life."""

    label: Any
    at: datetime
    detail: str = ""

    @property
    def relative(self) -> str:
        """Return the moment relative to now ("3 min ago", "in 20 s")."""
        return relative(self.at)


@dataclass(frozen=True, slots=True)
class ErrorAttempt:
    """One failed attempt of the error history."""

    attempt: Any
    exception_class: str
    message: str
    traceback: str
    worker: str
    at: str
    #: A snooze (the handler asked to run again later), not a failure.
    snoozed: bool = False


def render_job_detail(
    model_admin: ModelAdmin[Any], request: HttpRequest, object_id: str
) -> HttpResponse:
    """Render the read-only page of one job (GET only: nothing on it is editable)."""
    if request.method not in {"GET", "HEAD"}:
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    opts = model_admin.opts
    changelist = reverse(
        f"admin:{opts.app_label}_{opts.model_name}_changelist",
        current_app=model_admin.admin_site.name,
    )
    job = model_admin.get_object(request, unquote(object_id))
    if job is None:
        moved = _moved_to_inbox(model_admin, request, unquote(object_id))
        if moved:
            # A dead letter retried since (in another tab, say): it is still a job.
            model_admin.message_user(
                request,
                _("Job #%(id)s is no longer a %(page)s; here it is among all jobs.")
                % {"id": object_id, "page": opts.verbose_name},
                messages.INFO,
            )
            return HttpResponseRedirect(moved)
        # Discarded or pruned.
        model_admin.message_user(
            request,
            _("Job #%(id)s is not here: it may have been discarded or retried.")
            % {"id": object_id},
            messages.WARNING,
        )
        return HttpResponseRedirect(changelist)
    now = timezone.now()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Job #%(id)s") % {"id": job.pk},
        "subtitle": job.task_path,
        "opts": opts,
        "original": job,
        "job": job,
        "status_html": status_badge(job.status, unknown_task=job.unknown_task_since is not None),
        "unknown_task_label": UNKNOWN_TASK_LABEL,
        "now": now,
        "has_view_permission": True,
        "timeline": _timeline(job, now),
        "attempts": _attempts(job),
        "args_json": pretty_json(job.args),
        "kwargs_json": pretty_json(job.kwargs),
        "result_json": pretty_json(job.result) if job.status == JobStatus.SUCCEEDED else None,
        "operations": _operations(model_admin, request, job),
        "changelist_url": changelist,
        "history_url": _history_url(model_admin, request, job),
        "return_to_field": RETURN_TO,
        "return_to": _return_to(model_admin, request, job),
        "overdue": _overdue(job),
        "stuck_grace": conf.STUCK_HANDLER_GRACE_SECONDS,
        "scheduled": parse_fire_key(job.idempotency_key),
        **_partition(job),
        **_dependencies(job),
        "flow_wait": describe_wait(job),
        **_claimed_by(model_admin, request, job),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_pgqueue/admin/job_detail.html", context)


def _moved_to_inbox(model_admin: ModelAdmin[Any], request: HttpRequest, object_id: str) -> str:
    """Return the inbox page of a job this page no longer lists, if the user may see it."""
    inbox = _inbox(model_admin, request)
    if inbox is None or not object_id.isdigit():
        return ""
    if not Job.objects.db_manager(model_admin.model.objects.db).filter(pk=int(object_id)).exists():
        return ""
    return reverse(
        f"admin:{Job._meta.app_label}_job_change",
        args=[int(object_id)],
        current_app=model_admin.admin_site.name,
    )


def _inbox(model_admin: ModelAdmin[Any], request: HttpRequest) -> ModelAdmin[Any] | None:
    """Return the inbox's admin if it is not this one and the user may see it there."""
    if model_admin.model is Job:
        return None
    try:
        inbox = model_admin.admin_site.get_model_admin(Job)
    except NotRegistered:
        return None
    return inbox if inbox.has_view_permission(request) else None


def _return_to(model_admin: ModelAdmin[Any], request: HttpRequest, job: Job) -> str:
    # After an action the job may have left this page's listing (a retried dead letter
    # is pending): its page in the inbox always shows it, so the action's report is the
    # only message. Without the permission to see it there, the listing it came from.
    if model_admin.model is Job:
        return request.get_full_path()
    site = model_admin.admin_site.name
    if _inbox(model_admin, request) is not None:
        return reverse(f"admin:{Job._meta.app_label}_job_change", args=[job.pk], current_app=site)
    opts = model_admin.opts
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist", current_app=site)


def _history_url(model_admin: ModelAdmin[Any], request: HttpRequest, job: Job) -> str:
    # Actions log against the job model, whichever page ran them: its history has them
    # all (the dead-letter page's own history would be empty).
    job_view = f"{Job._meta.app_label}.{get_permission_codename('view', Job._meta)}"
    opts = Job._meta if request.user.has_perm(job_view) else model_admin.opts
    return reverse(
        f"admin:{opts.app_label}_{opts.model_name}_history",
        args=[job.pk],
        current_app=model_admin.admin_site.name,
    )


def _timeline(job: Job, now: datetime) -> list[TimelineEvent]:
    events = [TimelineEvent(_("created"), job.created_at)]
    if job.started_at:
        events.append(TimelineEvent(_("first started"), job.started_at))
    for entry in job.error_history():
        at = _parse_time(entry.get("at"))
        if at is None:
            continue
        if "snoozed" in entry:
            events.append(
                TimelineEvent(
                    _("attempt %(attempt)s snoozed") % {"attempt": entry.get("attempt", "?")},
                    at,
                    _("for %(seconds)s") % {"seconds": _snooze_length(entry["snoozed"])},
                )
            )
            continue
        events.append(
            TimelineEvent(
                _("attempt %(attempt)s failed") % {"attempt": entry.get("attempt", "?")},
                at,
                str(entry.get("exception_class", "")),
            )
        )
    if job.claimed_at:
        events.append(TimelineEvent(_("claimed"), job.claimed_at, job.claimed_by or ""))
    if job.status == JobStatus.PENDING:
        label = _("ready") if job.available_at <= now else _("scheduled to be ready")
        events.append(TimelineEvent(label, job.available_at))
    if job.lease_expires_at:
        expired = job.lease_expires_at < now
        label = _("lease expired") if expired else _("lease expires")
        events.append(TimelineEvent(label, job.lease_expires_at))
    if job.finished_at:
        events.append(
            TimelineEvent(
                _("finished"),
                job.finished_at,
                duration((job.finished_at - job.created_at).total_seconds()),
            )
        )
    return sorted(events, key=lambda event: event.at)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if timezone.is_aware(moment) else timezone.make_aware(moment)


def _snooze_length(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return duration(float(value))
    return str(value)


def _attempts(job: Job) -> list[ErrorAttempt]:
    return [
        ErrorAttempt(
            attempt=entry.get("attempt", "?"),
            exception_class=str(
                _("snoozed (no attempt used)")
                if "snoozed" in entry
                else entry.get("exception_class") or ""
            ),
            message=str(
                _("asked to run again in %(seconds)s")
                % {"seconds": _snooze_length(entry["snoozed"])}
                if "snoozed" in entry
                else entry.get("message") or ""
            ),
            traceback=str(entry.get("traceback") or ""),
            worker=str(entry.get("worker") or ""),
            at=_format_at(entry.get("at")),
            snoozed="snoozed" in entry,
        )
        for entry in job.error_history()
        if isinstance(entry, dict)
    ]


def _format_at(value: object) -> str:
    moment = _parse_time(value)
    if moment is None:
        return str(value or "")
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S} ({relative(moment)})"


def _operations(model_admin: ModelAdmin[Any], request: HttpRequest, job: Job) -> list[Operation]:
    actions = model_admin.get_actions(request)
    return [
        operation
        for name, operation in OPERATIONS.items()
        if name in actions
        and operation.applies(job)
        and has_operation_permission(model_admin, request, operation)
    ]


def _claimed_by(model_admin: ModelAdmin[Any], request: HttpRequest, job: Job) -> dict[str, Any]:
    """Return the link to the page of the worker that claimed the job, if it has one.

    Housekeeping forgets dead workers after a while: such a worker has no page any more.
    """
    if not job.claimed_by:
        return {}
    site = model_admin.admin_site
    try:
        workers = site.get_model_admin(Worker)
    except NotRegistered:
        return {}
    if not workers.has_view_permission(request):
        return {}
    if not Worker.objects.using(job._state.db).filter(pk=job.claimed_by).exists():
        return {"claimed_by_gone": True}
    url = reverse(
        f"admin:{Worker._meta.app_label}_worker_change",
        args=[quote(job.claimed_by)],
        current_app=site.name,
    )
    return {"claimed_by_url": url}


def _overdue(job: Job) -> StuckHandler | bool:
    """Return the job's stuck handler as its worker reports it (True: an older worker's).

    A worker of this release reports how long ago it asked the handler to stop; one of
    the previous release only lists the job as past its timeout.
    """
    if job.status != JobStatus.PROCESSING or not job.claimed_by:
        return False
    worker = Worker.objects.using(job._state.db).filter(pk=job.claimed_by).first()
    if worker is None:
        return False
    for handler in stuck_handlers(worker, timezone.now()):
        if handler.job_id == job.pk:
            return handler
    return job.pk in ((worker.metadata or {}).get("overdue_jobs") or [])


#: Jobs listed on each side of a job's dependencies (a fan-in may wait for thousands).
DEPENDENCIES_SHOWN = 50


def _dependencies(job: Job) -> dict[str, Any]:
    """Return what the job runs after and what runs after it, each with its status."""
    from django_pgqueue.models import Dependency

    if not job.has_dependents and job.status != JobStatus.BLOCKED:
        # A job enqueued after= others has edges even once settled: one cheap probe.
        edges = Dependency.objects.using(job._state.db).filter(job_id=job.pk)
        if not edges.exists():
            return {}
    edges = Dependency.objects.using(job._state.db).select_related("blocker", "job")
    runs_after = list(edges.filter(job_id=job.pk).order_by("position")[: DEPENDENCIES_SHOWN + 1])
    runs_before = list(edges.filter(blocker_id=job.pk).order_by("job_id")[: DEPENDENCIES_SHOWN + 1])
    return {
        "runs_after": [
            (edge.blocker_id, status_badge(edge.blocker.status), edge.blocker.task_name)
            for edge in runs_after[:DEPENDENCIES_SHOWN]
        ],
        "runs_after_more": len(runs_after) > DEPENDENCIES_SHOWN,
        "runs_before": [
            (edge.job_id, status_badge(edge.job.status), edge.job.task_name)
            for edge in runs_before[:DEPENDENCIES_SHOWN]
        ],
        "runs_before_more": len(runs_before) > DEPENDENCIES_SHOWN,
        "on_blocker_failure": runs_after[0].get_on_failure_display() if runs_after else None,
    }


def _partition(job: Job) -> dict[str, Any]:
    if job.partition_key is None or job.status not in {JobStatus.PENDING, JobStatus.PROCESSING}:
        return {}
    store = Job.objects.store(job._state.db)
    blocker = None
    if job.status == JobStatus.PENDING:
        blocker = store.partition_blocker(job.pk, job.partition_key)
    waiting = store.partition_waiting(
        job.pk,
        job.partition_key,
        include_older=job.status == JobStatus.PROCESSING,
        limit=WAITING_SHOWN + 1,
    )
    return {
        "blocker": blocker,
        "waiting": waiting[:WAITING_SHOWN],
        "waiting_more": len(waiting) > WAITING_SHOWN,
    }
