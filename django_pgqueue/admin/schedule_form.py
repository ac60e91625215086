"""The form of a schedule created or edited in the admin.

It builds the same :class:`~django_pgqueue.features.periodic.PeriodicSchedule` a
``@periodic`` declaration or a ``PGQUEUE_SCHEDULES`` entry makes, and checks it with the
same rules (:func:`~django_pgqueue.features.scheduling.admin_schedule_problems`: the
system checks' and the workers' sync's), each problem shown on its field. Saving is the
admin's (:mod:`django_pgqueue.admin.schedules`), through the store.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.db import router
from django.utils.translation import gettext_lazy as _

from django_pgqueue.compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from django_pgqueue.features.periodic import (
    DOWNTIME_POLICIES,
    MAX_CATCH_UP,
    PeriodicSchedule,
    declared_schedules,
)
from django_pgqueue.features.scheduling import admin_schedule_problems
from django_pgqueue.limits import QUEUE_MAX_LENGTH
from django_pgqueue.models import Schedule

__all__ = ["FIELDS", "AdminScheduleForm", "database_of"]

#: The form's fields, in the order the page shows them.
FIELDS = (
    "name",
    "task_path",
    "expression",
    "timezone",
    "args",
    "kwargs",
    "queue",
    "priority",
    "downtime",
    "catch_up",
)
#: The form field showing each attribute of a declaration (for its problems).
_FORM_FIELDS = {
    "name": "name",
    "task_path": "task_path",
    "expression": "expression",
    "timezone": "timezone",
    "queue_name": "queue",
    "priority": "priority",
    "catch_up": "catch_up",
}
_DOWNTIME_LABELS = {
    "latest": _("fire the latest missed once"),
    "skip": _("skip missed fires"),
    "catch_up": _("catch up (at most the number below)"),
}


def database_of(schedule: Schedule) -> str:
    """Return the database alias ``schedule``'s row is (or is to be) written to."""
    return schedule._state.db or router.db_for_write(Schedule)


class AdminScheduleForm(forms.ModelForm):  # type: ignore[type-arg]
    """A schedule of the admin's: what it runs, when, with what; checked as code's are.

    After validation, :attr:`declaration` holds the schedule to save.
    """

    expression = forms.CharField(
        label=_("schedule"),
        max_length=200,
        help_text=_(
            "Cron (<code>0 2 * * *</code>, <code>*/5 * * * mon-fri</code>), a nickname "
            "(<code>@hourly</code>, <code>@daily</code>) or an interval "
            "(<code>@every 30s</code>, <code>@every 1h30m</code>)."
        ),
    )
    timezone = forms.CharField(label=_("time zone"), required=False, max_length=64)
    args = forms.JSONField(
        label=_("positional arguments"),
        required=False,
        initial=list,
        help_text=_('A JSON list, like <code>[1, "eu"]</code>; blank: none.'),
    )
    kwargs = forms.JSONField(
        label=_("keyword arguments"),
        required=False,
        initial=dict,
        help_text=_('A JSON object, like <code>{"region": "eu"}</code>; blank: none.'),
    )
    queue = forms.CharField(
        label=_("queue"),
        required=False,
        max_length=QUEUE_MAX_LENGTH,
        help_text=_("Blank: the task's queue (when saved)."),
    )
    priority = forms.IntegerField(label=_("priority"), required=False)
    downtime = forms.ChoiceField(
        label=_("after downtime"),
        choices=[(policy, _DOWNTIME_LABELS[policy]) for policy in DOWNTIME_POLICIES],
        initial="latest",
        help_text=_("What the first worker back fires for fire times missed with no worker."),
    )
    catch_up = forms.IntegerField(label=_("catch up at most"), required=False)

    class Meta:
        model = Schedule
        fields = FIELDS
        help_texts = {  # noqa: RUF012 - Django reads it
            "name": _(
                "Letters, digits, '.', '_' or '-'; part of every job's key. Cannot be "
                "changed later."
            ),
            "task_path": _("The task's dotted path, like <code>shop.tasks.send_digest</code>."),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.declaration: PeriodicSchedule | None = None
        # Formatted per form, not at import: the language and TIME_ZONE of the request.
        zone = getattr(settings, "TIME_ZONE", None) or "UTC"
        self.fields["timezone"].help_text = _(
            "An IANA name the cron expression is read in; blank: TIME_ZONE (%(zone)s)."
        ) % {"zone": zone}
        self.fields["priority"].help_text = _(
            "%(low)d to %(high)d; blank: the task's priority (when saved)."
        ) % {"low": TASK_MIN_PRIORITY, "high": TASK_MAX_PRIORITY}
        self.fields["catch_up"].help_text = _("With “catch up” only: 1 to %(most)d fires.") % {
            "most": MAX_CATCH_UP
        }
        # The row holds 1 for a policy without catch-up: show nothing there.
        if self.instance.pk is not None and self.instance.downtime != "catch_up":
            self.initial["catch_up"] = None

    def clean_args(self) -> list[Any]:
        """Return the positional arguments: a JSON list (blank: none)."""
        value = self.cleaned_data.get("args")
        if value is None:
            return []
        if not isinstance(value, list):
            raise forms.ValidationError(_('Enter a JSON list, like [1, "eu"].'))
        return value

    def clean_kwargs(self) -> dict[str, Any]:
        """Return the keyword arguments: a JSON object (blank: none)."""
        value = self.cleaned_data.get("kwargs")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError(_('Enter a JSON object, like {"region": "eu"}.'))
        return value

    def clean(self) -> dict[str, Any]:
        """Build the declaration and check it as the code's are checked (imports the task)."""
        cleaned: dict[str, Any] = super().clean() or {}
        adding = self.instance._state.adding
        name = cleaned.get("name") if adding else self.instance.name
        needed = (name, cleaned.get("task_path"), cleaned.get("expression"))
        if any(not value for value in needed) or self.has_error("args", "kwargs"):
            return cleaned  # the fields' own errors say what is missing
        downtime = cleaned.get("downtime") or "latest"
        declaration = PeriodicSchedule(
            name=str(name),
            task_path=cleaned["task_path"],
            expression=cleaned["expression"].strip(),
            timezone=cleaned.get("timezone") or None,
            args=tuple(cleaned.get("args") or ()),
            kwargs=dict(cleaned.get("kwargs") or {}),
            queue_name=cleaned.get("queue") or None,
            priority=cleaned.get("priority"),
            downtime=downtime,
            catch_up=cleaned.get("catch_up") if downtime == "catch_up" else None,
            origin="the admin",
        )
        # A new admin schedule may not take a name the code declares (an existing one
        # keeps its name, and wins over a declaration added later: the sync reports it).
        declared = declared_schedules()[0] if adding else {}
        problems = admin_schedule_problems(
            declaration, alias=database_of(self.instance), declared=declared
        )
        for field, message in problems:
            target = _FORM_FIELDS.get(field)
            self.add_error(target if target in self.fields else None, message)
        if not problems:
            self.declaration = declaration
        return cleaned
