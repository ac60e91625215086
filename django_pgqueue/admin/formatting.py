"""How the admin shows durations, moments, statuses and payloads.

Everything returned here is either plain text (escaped by the templates) or built with
``format_html``, so payloads and error messages are never rendered as HTML.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_pgqueue.states import JobStatus, WorkerStatus

__all__ = [
    "PAYLOAD_DISPLAY_LIMIT",
    "age",
    "compact",
    "duration",
    "exact",
    "moment",
    "pretty_json",
    "relative",
    "status_badge",
    "task_link",
    "worker_badge",
]

#: Characters of a payload shown on the detail page; the rest is cut (a payload may be 1 MB).
PAYLOAD_DISPLAY_LIMIT = 100_000

_UNITS = ((86_400, "d"), (3_600, "h"), (60, "min"), (1, "s"))


def duration(seconds: float) -> str:
    """Return ``seconds`` as a short duration, two units at most ("2 h 5 min", "40 s")."""
    seconds = abs(seconds)
    if seconds < 1:
        return _("%(milliseconds)d ms") % {"milliseconds": round(seconds * 1000)}
    parts = []
    remaining = int(seconds)
    for size, unit in _UNITS:
        if remaining >= size:
            parts.append(f"{remaining // size} {unit}")
            remaining %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def compact(number: float) -> str:
    """Return ``number`` in at most four characters or so: 950, 13.2k, 1.2M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(number) >= size:
            value = number / size
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{number:.0f}"


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """Return ``moment`` relative to now: "in 5 min", "3 s ago", or "" for None."""
    if moment is None:
        return ""
    delta = (moment - (now or timezone.now())).total_seconds()
    if delta >= 0:
        return _("in %(duration)s") % {"duration": duration(delta)}
    return _("%(duration)s ago") % {"duration": duration(delta)}


def age(moment: datetime, now: datetime | None = None) -> str:
    """Return ``moment`` relative to now in one short unit: "40s", "2m", "3h", "in 5m"."""
    delta = (moment - (now or timezone.now())).total_seconds()
    seconds = int(abs(delta))
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")):
        if seconds >= size or size == 1:
            text = f"{seconds // size}{unit}"
            break
    # Rounded down, a moment a few milliseconds away is "0s", never "in 0s".
    return _("in %(age)s") % {"age": text} if delta >= 1 else text


def exact(moment: datetime) -> str:
    """Return ``moment`` to the second in the current time zone, with the zone's name."""
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


def moment(value: datetime | None, label: str = "", *, now: datetime | None = None) -> SafeString:
    """Return a compact age ("2m") whose tooltip tells the exact time and what it was."""
    if value is None:
        return SafeString("")
    title = f"{label}: {exact(value)}" if label else exact(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), title, age(value, now)
    )


#: What the admin calls a pending job that no worker so far could import the task of.
UNKNOWN_TASK_LABEL = _("waiting for a worker that knows this task")


def status_badge(status: str, *, unknown_task: bool = False) -> SafeString:
    """Return a job status as a coloured badge.

    ``unknown_task`` marks a pending job waiting for a worker that can import its task
    (a rolling deploy): its own kind, not plain "pending".
    """
    if unknown_task and status == JobStatus.PENDING:
        return format_html(
            '<span class="pgq-badge pgq-status-unknown-task" title="{}">{}</span>',
            UNKNOWN_TASK_LABEL,
            _("Unknown task"),
        )
    try:
        label = str(JobStatus(status).label)
    except ValueError:
        label = status
    return format_html('<span class="pgq-badge pgq-status-{}">{}</span>', status, label)


def worker_badge(status: str, *, silent: bool = False) -> SafeString:
    """Return a worker status as a badge; ``silent`` flags an alive worker gone quiet."""
    try:
        label = str(WorkerStatus(status).label)
    except ValueError:
        label = status
    if silent:
        return format_html(
            '<span class="pgq-badge pgq-worker-silent">{}</span>', _("%s, silent") % label
        )
    return format_html('<span class="pgq-badge pgq-worker-{}">{}</span>', status, label)


def pretty_json(value: Any, *, limit: int = PAYLOAD_DISPLAY_LIMIT) -> str:
    """Return ``value`` as indented JSON text, cut after ``limit`` characters."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > limit:
        omitted = len(text) - limit
        text = text[:limit] + "\n" + _("… %(count)d more characters") % {"count": omitted}
    return text


def task_link(task_path: str, url: str) -> SafeString:
    """Return a task path as a link, its function's name first and whole ("send_receipt"),
    then its module in grey ("orders.tasks"), which a narrow column cuts short.

    Cutting the path's start instead left "or…" in one row and "ord…" in the next, the
    name pushed out of sight; every row now reads the same way.
    """
    module, _dot, name = task_path.rpartition(".")
    return format_html(
        '<a class="pgq-task" href="{}" title="{}"><span class="pgq-task-name">{}</span> '
        '<span class="pgq-task-module">{}</span></a>',
        url,
        task_path,
        name,
        module,
    )
