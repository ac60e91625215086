"""The Schedules page: each periodic schedule, when it fires, and what its last fire did.

Schedules declared in code are written by the workers (synced at start, advanced on each
fire): their page is read-only. Schedules created here (``source`` admin) have a form
(:mod:`django_pgqueue.admin.schedule_form`, checked as the code's are) and can be
deleted; both go through :mod:`django_pgqueue.features.scheduling` and the store, and
take effect on every worker at its next scheduler pass (at most a second). The actions
(pause, resume, run now) apply to both kinds: confirmed first, fenced in SQL (pausing an
already paused schedule, or resuming one a sync changed meanwhile, does nothing; a "run
now" confirmation submitted twice enqueues once), and logged per schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_pgqueue.admin.formatting import age, exact, pretty_json, relative, status_badge
from django_pgqueue.admin.schedule_form import AdminScheduleForm, database_of
from django_pgqueue.features.periodic import fire_key
from django_pgqueue.features.scheduling import (
    delete_admin_schedules,
    pause,
    resume,
    run_now,
    save_admin_schedule,
)
from django_pgqueue.models import Schedule, ScheduleSource
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import DjangoRunner

__all__ = ["ScheduleAdmin"]

if TYPE_CHECKING:
    from django.utils.functional import _StrPromise

    _ModelAdmin = admin.ModelAdmin[Schedule]
else:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin

#: Form field carrying the database time the "run now" confirmation was shown at.
REQUESTED_AT = "requested_at"
#: Set on a schedule the store refused to write (its name was taken, or it is not the
#: admin's any more, since the form was checked): nothing is logged for it.
_REFUSED = "_pgqueue_refused"


@dataclass(frozen=True, slots=True)
class ScheduleAction:
    """One operator action on schedules: confirmed, applied through scheduling, logged."""

    name: str
    label: _StrPromise
    explanation: _StrPromise
    #: (store, names, time the confirmation was shown) -> the names it applied to.
    apply: Callable[[QueueStore, list[str], datetime], list[str]]
    log_message: str


class ScheduleAdmin(_ModelAdmin):
    """Periodic schedules with their timing, last fire's job, and operator actions."""

    # What fits 1280x800 with the sidebar open: the timetable and the state. The task,
    # queue, arguments, limits and downtime policy are on the schedule's page.
    list_display = ("name", "description", "next_fire", "last_fire", "state", "source", "task")
    # No filter column: a project has a handful of schedules, and the search finds one.
    search_fields = ("name", "task_path")
    show_facets = admin.ShowFacets.NEVER
    ordering = ("name",)
    actions = ("pause_schedules", "resume_schedules", "run_schedules_now")
    # The form of the admin's own schedules (code schedules have a read-only page).
    form = AdminScheduleForm
    change_form_template = "django_pgqueue/admin/schedule_change_form.html"

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("django_pgqueue/admin/pgqueue.css",)}

    # ------------------------------------------------------------------ permissions
    def has_add_permission(self, request: HttpRequest) -> bool:
        """Allow creating schedules at run time (the add permission)."""
        return super().has_add_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Allow deleting one admin schedule from its page, never a code one.

        A schedule removed from the code is removed at the next worker start. No bulk
        delete: the list selects schedules of both kinds.
        """
        return _is_admins(obj) and super().has_delete_permission(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Allow the actions (change permission) and the form of the admin's schedules."""
        if obj is not None and not _is_admins(obj):
            return False
        return super().has_change_permission(request, obj)

    # ------------------------------------------------------------------ the form
    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """Return the form's sections; a saved schedule also shows when it fires."""
        fieldsets: list[tuple[Any, dict[str, Any]]] = [
            (None, {"fields": ("name", "task_path", "expression", "timezone")}),
            (_("Jobs"), {"fields": ("args", "kwargs", "queue", "priority")}),
            (_("After downtime"), {"fields": ("downtime", "catch_up")}),
        ]
        if obj is not None:
            fieldsets.append((_("State"), {"fields": ("state", "next_fire", "last_fire")}))
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Return the name (the key of its jobs) and the state of a saved schedule."""
        return () if obj is None else ("name", "state", "next_fire", "last_fire")

    def save_model(
        self, request: HttpRequest, obj: Schedule, form: forms.Form, change: bool
    ) -> None:
        """Write the form's schedule through the store (never a code schedule)."""
        declaration = getattr(form, "declaration", None)
        assert declaration is not None  # a valid form built it
        store = QueueStore(DjangoRunner(database_of(obj)))
        if not save_admin_schedule(store, declaration, adding=not change):
            setattr(obj, _REFUSED, True)
            self.message_user(
                request,
                _(
                    "Schedule %(name)s was not saved: another schedule took the name, or it "
                    "is not one of the admin's any more."
                )
                % {"name": declaration.name},
                messages.ERROR,
            )

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
    ) -> HttpResponse:
        """Go back to the list without Django's "added successfully" if the store refused."""
        if getattr(obj, _REFUSED, False):
            return HttpResponseRedirect(
                reverse(
                    "admin:django_pgqueue_schedule_changelist", current_app=self.admin_site.name
                )
            )
        return super().response_add(request, obj, post_url_continue)

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        """Go back to the list without Django's "changed successfully" if the store refused."""
        if getattr(obj, _REFUSED, False):
            return HttpResponseRedirect(
                reverse(
                    "admin:django_pgqueue_schedule_changelist", current_app=self.admin_site.name
                )
            )
        return super().response_change(request, obj)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        """Log the addition, unless the store refused it."""
        if getattr(obj, _REFUSED, False):
            return None
        return super().log_addition(request, obj, message)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        """Log the change, unless the store refused it."""
        if getattr(obj, _REFUSED, False):
            return None
        return super().log_change(request, obj, message)

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        """Delete an admin schedule through the store (its jobs stay)."""
        delete_admin_schedules(QueueStore(DjangoRunner(database_of(obj))), [obj.name])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """Delete the admin schedules among ``queryset`` through the store."""
        names = list(queryset.values_list("name", flat=True))
        delete_admin_schedules(QueueStore(DjangoRunner(queryset.db)), names)

    # ------------------------------------------------------------------ pages
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Render the listing under a plain title (Django's is "Select schedule to change")."""
        return super().changelist_view(request, {"title": _("Schedules"), **(extra_context or {})})

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Render an admin schedule's form, or a code schedule's read-only page; both with
        the actions as buttons."""
        schedule = self.get_object(request, unquote(object_id))
        changelist = reverse(
            "admin:django_pgqueue_schedule_changelist", current_app=self.admin_site.name
        )
        if schedule is not None and self.has_change_permission(request, schedule):
            context = {
                "changelist_url": changelist,
                "schedule_buttons": self._buttons(request, schedule),
                "checkbox_name": ACTION_CHECKBOX_NAME,
                **(extra_context or {}),
            }
            return super().change_view(request, object_id, form_url, context)
        if request.method not in {"GET", "HEAD"}:
            raise PermissionDenied  # a code schedule is not edited here
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if schedule is None:
            self.message_user(
                request,
                _("Schedule %(name)s is gone (no longer declared, or deleted).")
                % {"name": object_id},
                messages.WARNING,
            )
            return HttpResponseRedirect(changelist)
        from_code = schedule.source == ScheduleSource.CODE
        context = {
            **self.admin_site.each_context(request),
            "title": _("Schedule %(name)s") % {"name": schedule.name},
            "subtitle": schedule.description,
            "opts": self.opts,
            "original": schedule,
            "schedule": schedule,
            "has_view_permission": True,
            "changelist_url": changelist,
            "facts": [
                (
                    _("when"),
                    format_html("{} <code>{}</code>", schedule.description, schedule.expression),
                ),
                (_("time zone"), schedule.timezone),
                (_("next fire"), _moment(schedule.next_fire_at, schedule.timezone)),
                (
                    _("last fire"),
                    self._last_fire(schedule, _moment(schedule.last_fire_at, schedule.timezone))
                    if schedule.last_fire_at
                    else "—",
                ),
                (_("state"), self.state(schedule)),
                (_("declared in"), schedule.get_source_display()),
                (_("task"), format_html("<code>{}</code>", schedule.task_path)),
                (_("queue"), schedule.queue),
                (_("priority"), schedule.priority),
                (_("max attempts"), schedule.max_attempts or "—"),
                (_("arguments"), format_html("<code>{}</code>", pretty_json(schedule.args))),
                (
                    _("keyword arguments"),
                    format_html("<code>{}</code>", pretty_json(schedule.kwargs)),
                ),
                (_("limits"), self.limits(schedule)),
                (_("after downtime"), self.downtime_display(schedule)),
                (_("declared since"), _moment(schedule.created_at)),
                (
                    _("synced from the code") if from_code else _("last edited"),
                    _moment(schedule.updated_at),
                ),
            ],
            "buttons": self._buttons(request, schedule),
            "checkbox_name": ACTION_CHECKBOX_NAME,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_pgqueue/admin/schedule_detail.html", context)

    def _buttons(self, request: HttpRequest, schedule: Schedule) -> list[tuple[str, Any]]:
        # The actions that apply to the schedule in its state, as its page's buttons.
        actions = self.get_actions(request)
        return [
            (name, label)
            for name, label in (
                ("pause_schedules", _("Pause…")),
                ("resume_schedules", _("Resume…")),
                ("run_schedules_now", _("Run now…")),
            )
            if name in actions
            and (name != "pause_schedules" or schedule.paused_at is None)
            and (name != "resume_schedules" or schedule.paused_at is not None)
        ]

    # ------------------------------------------------------------------ columns
    @admin.display(description=_("task"), ordering="task_path")
    def task(self, obj: Schedule) -> SafeString:
        """Show the task, its function's name first, and its queue."""
        module, _dot, name = obj.task_path.rpartition(".")
        return format_html(
            '<span class="pgq-task" title="{} · {}"><span class="pgq-task-name">{}</span> '
            '<span class="pgq-task-module">{}</span></span>',
            obj.task_path,
            obj.queue,
            name,
            module,
        )

    @admin.display(description=_("limits"))
    def limits(self, obj: Schedule) -> str:
        """Return the fired jobs' concurrency key and limits, or a dash."""
        if obj.concurrency_key is None:
            return "—"
        parts = [obj.concurrency_key]
        if obj.concurrency_limit is not None:
            parts.append(_("at most %(limit)d in flight") % {"limit": obj.concurrency_limit})
        if obj.rate_limit is not None and obj.rate_period is not None:
            parts.append(
                _("at most %(limit)d starts per %(period)gs")
                % {"limit": obj.rate_limit, "period": obj.rate_period}
            )
        return " · ".join(parts)

    @admin.display(description=_("next fire"), ordering="next_fire_at")
    def next_fire(self, obj: Schedule) -> SafeString:
        """Return how far away the next fire is ("in 5m"), exact in the tooltip."""
        return _age(obj.next_fire_at, obj.timezone)

    @admin.display(description=_("last fire"), ordering="last_fire_at")
    def last_fire(self, obj: Schedule) -> SafeString | str:
        """Return the last fire time and its job's status, linked to the job."""
        if obj.last_fire_at is None:
            return "—"
        return self._last_fire(obj, _age(obj.last_fire_at, obj.timezone))

    def _last_fire(self, obj: Schedule, when: SafeString) -> SafeString | str:
        assert obj.last_fire_at is not None
        key = fire_key(obj.name, obj.last_fire_at)
        found = QueueStore(DjangoRunner(obj._state.db or "default")).jobs_by_keys([key])
        if key not in found:
            return format_html("{} · {}", when, _("job pruned"))
        job_id, status = found[key]
        url = reverse("admin:django_pgqueue_job_change", args=[job_id])
        return format_html('{} · <a href="{}">#{}</a> {}', when, url, job_id, status_badge(status))

    @admin.display(description=_("state"), ordering="paused_at")
    def state(self, obj: Schedule) -> SafeString:
        """Return active or paused (since when)."""
        if obj.paused_at is None:
            return format_html(
                '<span class="pgq-badge pgq-status-succeeded">{}</span>', _("Active")
            )
        return format_html(
            '<span class="pgq-badge pgq-status-cancelled" title="{}">{}</span>',
            obj.paused_at.isoformat(),
            _("Paused"),
        )

    @admin.display(description=_("after downtime"), ordering="downtime")
    def downtime_display(self, obj: Schedule) -> str:
        """Return the downtime policy in words."""
        if obj.downtime == "skip":
            return str(_("skip missed fires"))
        if obj.downtime == "catch_up":
            return str(_("catch up at most %(count)d") % {"count": obj.catch_up})
        return str(_("fire the latest missed once"))

    # ------------------------------------------------------------------ actions
    @admin.action(description=_("Pause"), permissions=["change"])
    def pause_schedules(
        self, request: HttpRequest, queryset: QuerySet[Schedule]
    ) -> HttpResponse | None:
        """Pause the selected schedules (fires stop until resumed)."""
        return self._operate(
            request,
            queryset,
            ScheduleAction(
                name="pause_schedules",
                label=_("Pause"),
                explanation=_(
                    "Paused schedules do not fire. Fire times that pass while paused are not "
                    "made up on resume. Schedules already paused are left as they are."
                ),
                apply=lambda store, names, _at: pause(store, names),
                log_message="Paused from the admin.",
            ),
        )

    @admin.action(description=_("Resume"), permissions=["change"])
    def resume_schedules(
        self, request: HttpRequest, queryset: QuerySet[Schedule]
    ) -> HttpResponse | None:
        """Resume the selected paused schedules from their next fire time after now."""
        return self._operate(
            request,
            queryset,
            ScheduleAction(
                name="resume_schedules",
                label=_("Resume"),
                explanation=_(
                    "Paused schedules fire again from their next fire time after now. Active "
                    "schedules are left as they are."
                ),
                apply=lambda store, names, _at: resume(store, names),
                log_message="Resumed from the admin.",
            ),
        )

    @admin.action(description=_("Run now"), permissions=["change"])
    def run_schedules_now(
        self, request: HttpRequest, queryset: QuerySet[Schedule]
    ) -> HttpResponse | None:
        """Enqueue one job of each selected schedule now, outside its timetable."""
        return self._operate(
            request,
            queryset,
            ScheduleAction(
                name="run_schedules_now",
                label=_("Run now"),
                explanation=_(
                    "Each selected schedule gets one job now, with its arguments; the timetable "
                    "does not move. Confirming this page twice enqueues once."
                ),
                apply=lambda store, names, at: sorted(run_now(store, names, requested_at=at)),
                log_message="Run now from the admin.",
            ),
        )

    def _operate(
        self, request: HttpRequest, queryset: QuerySet[Schedule], action: ScheduleAction
    ) -> HttpResponse | None:
        name, label, explanation = action.name, action.label, action.explanation
        names = sorted(queryset.values_list("name", flat=True))
        store = QueueStore(DjangoRunner(queryset.db))
        requested_at = parse_datetime(request.POST.get(REQUESTED_AT, ""))
        if request.POST.get("confirmed") != "yes" or requested_at is None:
            context = {
                **self.admin_site.each_context(request),
                "title": _("Are you sure?"),
                "subtitle": label,
                "opts": self.opts,
                "action": name,
                "label": label,
                "explanation": explanation,
                "names": names,
                "requested_at": store.database_now().isoformat(),
                "checkbox_name": ACTION_CHECKBOX_NAME,
            }
            request.current_app = self.admin_site.name
            return TemplateResponse(
                request, "django_pgqueue/admin/confirm_schedule_action.html", context
            )
        done = action.apply(store, names, requested_at)
        _log(request, done, action.log_message)
        skipped = sorted(set(names) - set(done))
        self.message_user(
            request,
            ngettext(
                "%(label)s: %(count)d schedule (%(names)s).",
                "%(label)s: %(count)d schedules (%(names)s).",
                len(done),
            )
            % {"label": label, "count": len(done), "names": ", ".join(done) or "—"},
            messages.SUCCESS if done else messages.INFO,
        )
        if skipped:
            self.message_user(
                request,
                _("Left as they were (already in that state, or gone): %(names)s.")
                % {"names": ", ".join(skipped)},
                messages.WARNING,
            )
        return None


def _is_admins(obj: Any) -> bool:
    # A schedule created in the admin (None: no schedule, as for the list's actions).
    return isinstance(obj, Schedule) and obj.source == ScheduleSource.ADMIN


def _exact(moment: datetime, zone: str | None) -> str:
    if zone:
        return f"{timezone.localtime(moment, ZoneInfo(zone)):%Y-%m-%d %H:%M:%S} {zone}"
    return exact(moment)


def _age(moment: datetime, zone: str | None = None) -> SafeString:
    # The list's compact form: "in 5m", "2h"; the tooltip is the page's exact form.
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        moment.isoformat(),
        _exact(moment, zone),
        age(moment),
    )


def _moment(moment: datetime, zone: str | None = None) -> SafeString:
    # One format on the list and on a schedule's page: to the second, in the schedule's
    # time zone (named), else the site's.
    text = _exact(moment, zone)
    return format_html(
        '<span title="{}">{}</span> <span class="pgq-muted">({})</span>',
        moment.isoformat(),
        text,
        relative(moment),
    )


def _log(request: HttpRequest, names: Sequence[str], message: str) -> None:
    if not names:
        return
    content_type = ContentType.objects.get_for_model(Schedule)
    user_id: Any = request.user.pk
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=user_id,
                content_type_id=content_type.pk,
                object_id=name,
                object_repr=name,
                action_flag=CHANGE,
                change_message=message,
            )
            for name in names
        ]
    )
