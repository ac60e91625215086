"""Pause and resume a queue from the lag page: confirmed, permission-checked, logged.

The lag page links each queue to ``pause/?queue=<name>`` or ``resume/?queue=<name>``;
GET shows the confirmation page (with a reason field for a pause), a POST carrying
``confirmed=yes`` applies it through :mod:`django_pgqueue.features.pausing` and logs a
``LogEntry`` against the queue. Both need the change permission on jobs, like the other
operator actions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_permission_codename
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.exceptions import EnqueueError
from django_pgqueue.features.pausing import pause_queue, paused_queues, resume_queue
from django_pgqueue.models import Job, QueuePause
from django_pgqueue.store.reports import PausedQueue

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin

__all__ = ["QUEUES_SHOWN", "can_pause", "pause_links", "paused_queues_for", "queue_pause_view"]

#: Longest reason the form accepts.
REASON_MAX_LENGTH = 500


def can_pause(request: HttpRequest) -> bool:
    """Return whether the user may pause and resume queues (change permission on jobs)."""
    opts = Job._meta
    return bool(
        request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")
    )


#: Queues offered a pause button above the lag table and the inbox.
QUEUES_SHOWN = 20


def pause_links(
    request: HttpRequest, queues: Iterable[str], paused: Iterable[PausedQueue]
) -> list[tuple[str, str]]:
    """Return (queue, URL of its pause confirmation) of each running queue, for users who
    may pause; the confirmation returns to this page. Paused queues are in the banner,
    with their Resume button, instead."""
    if not can_pause(request):
        return []
    stopped = {pause.queue for pause in paused}
    address = reverse("admin:django_pgqueue_lag_pause")
    back = request.get_full_path()
    return [
        (queue, f"{address}?{urlencode({'queue': queue, 'next': back})}")
        for queue in queues
        if queue not in stopped
    ][:QUEUES_SHOWN]


def paused_queues_for(model_admin: _ModelAdmin) -> list[PausedQueue]:
    """Return the paused queues of the admin's database, by name."""
    return sorted(paused_queues(using=model_admin.model.objects.db).values(), key=lambda p: p.queue)


def queue_pause_view(model_admin: _ModelAdmin, request: HttpRequest, action: str) -> HttpResponse:
    """Confirm, then pause or resume the queue named by ``?queue=`` (``action``)."""
    if not can_pause(request):
        raise PermissionDenied
    queue = request.POST.get("queue") or request.GET.get("queue") or ""
    using = model_admin.model.objects.db
    lag_url = reverse("admin:django_pgqueue_lag", current_app=model_admin.admin_site.name)
    # Back where the button was (the inbox, say), if that is a page of this site.
    back = request.POST.get("next") or request.GET.get("next") or ""
    if back and url_has_allowed_host_and_scheme(
        back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        lag_url = back
    reason = request.POST.get("reason", "").strip()[:REASON_MAX_LENGTH]
    if request.method != "POST" or request.POST.get("confirmed") != "yes":
        label = _("Pause queue") if action == "pause" else _("Resume queue")
        context = {
            **model_admin.admin_site.each_context(request),
            "title": _("Are you sure?"),
            "subtitle": label,
            "opts": model_admin.opts,
            "label": label,
            "action": action,
            "queue": queue,
            "current": paused_queues(using=using).get(queue),
            "reason_max_length": REASON_MAX_LENGTH,
            "lag_url": lag_url,
            "next": lag_url,
        }
        request.current_app = model_admin.admin_site.name
        return TemplateResponse(request, "django_pgqueue/admin/confirm_queue_pause.html", context)
    try:
        if action == "pause":
            pause = pause_queue(queue, by=request.user.get_username(), reason=reason, using=using)
            done = pause.created
            message = gettext("Paused from the admin.") + (f" {reason}" if reason else "")
        else:
            done = resume_queue(queue, using=using) is not None
            message = gettext("Resumed from the admin.")
    except EnqueueError as error:
        messages.error(request, str(error))
        return HttpResponseRedirect(lag_url)
    if done:
        _log(request, queue, message)
        text = (
            gettext("Queue %(queue)s is paused: workers start none of its jobs until resumed.")
            if action == "pause"
            else gettext("Queue %(queue)s is resumed.")
        )
        messages.success(request, text % {"queue": queue})
    else:
        messages.info(
            request,
            (
                gettext("Queue %(queue)s was already paused; left as it was.")
                if action == "pause"
                else gettext("Queue %(queue)s was not paused; left as it was.")
            )
            % {"queue": queue},
        )
    return HttpResponseRedirect(lag_url)


def _log(request: HttpRequest, queue: str, message: str) -> None:
    user_id: Any = request.user.pk
    LogEntry.objects.create(
        user_id=user_id,
        content_type_id=ContentType.objects.get_for_model(QueuePause).pk,
        object_id=queue,
        object_repr=queue,
        action_flag=CHANGE,
        change_message=message,
    )
