"""The lag page: how far behind each queue is, how fast it drains, and the job table's health.

Health includes the INVALID indexes on the queue's tables (as system check W002 reports
them), each with the command that repairs it.

Registered through the ``Lag`` proxy model (``admin:django_pgqueue_lag``), so that
it is listed in the admin index and sidebar, and rendered inside the admin site, so
login, permissions (view permission on jobs) and breadcrumbs work as elsewhere.
Every figure comes from a read-only query of the queue manager (``sql/admin.sql``, and
``sql/schema.sql`` for the indexes). Paused queues are marked, with who paused them and
since when; the pause and resume buttons lead to :mod:`.pauses`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.filters import EXPIRED, READY, SCHEDULED, UNKNOWN_TASK
from django_pgqueue.admin.formatting import compact, duration, exact
from django_pgqueue.admin.pauses import can_pause, pause_links, paused_queues_for, queue_pause_view
from django_pgqueue.admin.queues import configured_queues
from django_pgqueue.admin.stuck import stuck_lines
from django_pgqueue.admin.svg import ChartPoint, minute_series, throughput_chart
from django_pgqueue.models import Job, Lag
from django_pgqueue.states import JobStatus
from django_pgqueue.store.reports import PausedQueue, QueueLag, QueueMinute
from django_pgqueue.store.schema import index_problems

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Lag]
else:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin

__all__ = ["COUNT_LIMIT", "HORIZON_WARN_SECONDS", "QueueLagAdmin", "QueueRow", "lag_view"]

#: Depth and dead-letter counts stop here: the page shows "10,000+" beyond.
COUNT_LIMIT = 10_000
#: Minutes of history in the throughput figures and the chart.
CHART_MINUTES = 60
#: The short throughput window, in minutes.
RECENT_MINUTES = 5
#: A snapshot held this long is flagged on the page: VACUUM has kept every dead tuple of
#: the job table for as long (at the drain rate, millions within minutes).
HORIZON_WARN_SECONDS = 300
#: Pixels of each queue's one-hour chart: narrow enough that the table, with its
#: optional columns (unknown task, blocked), fits 1280x800 with the sidebar open.
SPARKLINE_WIDTH = 100


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue's line on the lag page."""

    lag: QueueLag
    #: Attempts finished in the last RECENT_MINUTES and CHART_MINUTES minutes.
    recent: ChartPoint
    hour: ChartPoint
    chart: SafeString
    links: dict[str, str]
    #: The queue's pause (None: it is not paused).
    pause: PausedQueue | None = None

    @property
    def lag_display(self) -> str:
        """Return how long the oldest ready job has waited, as a short duration."""
        return duration(self.lag.lag_seconds)

    @property
    def oldest_ready_title(self) -> str:
        """Return when the oldest ready job became ready, to the second."""
        if self.lag.oldest_ready_at is None:
            return ""
        return gettext("oldest ready job ready since %(moment)s") % {
            "moment": exact(self.lag.oldest_ready_at)
        }

    @property
    def recent_display(self) -> str:
        """Return the short window's rate in a few characters ("13.9k", "2.5")."""
        return _rate(self.recent_per_minute)

    @property
    def hour_display(self) -> str:
        """Return the hour's rate in a few characters."""
        return _rate(self.hour_per_minute)

    @property
    def recent_per_minute(self) -> float:
        """Return the finished attempts per minute over the short window."""
        return self.recent.finished / RECENT_MINUTES

    @property
    def hour_per_minute(self) -> float:
        """Return the finished attempts per minute over the hour."""
        return self.hour.finished / CHART_MINUTES


class QueueLagAdmin(_ModelAdmin):
    """The lag page as an admin "model": one read-only page, seen by whoever sees jobs."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return whether the user may see jobs (the page shows nothing else)."""
        opts = Job._meta
        return any(
            request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
            for action in ("view", "change")
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Return False: there is nothing to add."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: the page is read-only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: the page is read-only."""
        return False

    def get_urls(self) -> list[URLPattern]:
        """Return the page's only URL, under the index's name for it and its own."""
        view = self.admin_site.admin_view(self.lag_view)
        opts = self.opts
        return [
            path(
                "pause/",
                self.admin_site.admin_view(self.pause_view),
                name=f"{opts.app_label}_lag_pause",
            ),
            path(
                "resume/",
                self.admin_site.admin_view(self.resume_view),
                name=f"{opts.app_label}_lag_resume",
            ),
            path("", view, name=f"{opts.app_label}_{opts.model_name}_changelist"),
            path("", view, name=f"{opts.app_label}_lag"),
        ]

    def lag_view(self, request: HttpRequest) -> TemplateResponse:
        """Render the lag page."""
        return lag_view(self, request)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """Confirm, then pause a queue (change permission on jobs)."""
        return queue_pause_view(self, request, "pause")

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        """Confirm, then resume a queue (change permission on jobs)."""
        return queue_pause_view(self, request, "resume")


def lag_view(model_admin: _ModelAdmin, request: HttpRequest) -> TemplateResponse:
    """Render the lag page (view permission on jobs required)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    store = Job.objects.store(model_admin.model.objects.db)
    queues = store.known_queues(configured_queues())
    lags = store.queue_lag(queues, count_limit=COUNT_LIMIT)
    minutes = store.queue_minutes(queues, minutes=CHART_MINUTES)
    measured_at = lags[0].measured_at if lags else timezone.now()
    last_minute = measured_at.replace(second=0, microsecond=0)

    paused = paused_queues_for(model_admin)
    pauses = {pause.queue: pause for pause in paused}
    by_queue: dict[str, list[QueueMinute]] = defaultdict(list)
    for row in minutes:
        by_queue[row.queue].append(row)
    rows = []
    for lag in lags:
        series = minute_series(by_queue[lag.queue], last_minute=last_minute)
        rows.append(
            QueueRow(
                lag=lag,
                recent=_total(series[-RECENT_MINUTES:], last_minute),
                hour=_total(series, last_minute),
                chart=throughput_chart(
                    series,
                    width=SPARKLINE_WIDTH,
                    height=24,
                    title=gettext("%(queue)s: finished jobs and longest wait per minute")
                    % {"queue": lag.queue},
                    axes=False,
                ),
                links=_links(model_admin, lag.queue),
                pause=pauses.get(lag.queue),
            )
        )
    overall = minute_series(minutes, last_minute=last_minute)
    overall_title = gettext("All queues: finished jobs and longest wait per minute")
    health = store.job_table_health()
    horizon = store.vacuum_horizon()
    invalid_indexes = index_problems(store.runner.alias)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Queue lag"),
        "opts": model_admin.opts,
        "rows": rows,
        # Jobs waiting for a worker that knows their task are rare (a rolling deploy):
        # their column is shown only while some queue has them.
        "unknown_task_column": any(row.lag.unknown_task for row in rows),
        # Likewise jobs waiting for the jobs they run after (after=).
        "blocked_column": any(row.lag.blocked for row in rows),
        "count_limit": COUNT_LIMIT,
        "chart": throughput_chart(overall, title=overall_title),
        "chart_narrow": throughput_chart(overall, width=360, height=180, title=overall_title),
        "chart_minutes": CHART_MINUTES,
        "recent_minutes": RECENT_MINUTES,
        "health": health,
        "dead_percent": health.dead_fraction * 100 if health else 0,
        "horizon": horizon,
        "horizon_age": duration(horizon.age_seconds)
        if horizon and horizon.age_seconds is not None
        else "",
        "horizon_warn": bool(horizon and (horizon.age_seconds or 0) >= HORIZON_WARN_SECONDS),
        "invalid_indexes": invalid_indexes,
        "measured_at": measured_at,
        "paused": paused,
        "can_pause": can_pause(request),
        "stuck": stuck_lines(model_admin, request, queues),
        "pausable_queues": pause_links(request, [row.lag.queue for row in rows], paused),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_pgqueue/admin/lag.html", context)


def _rate(per_minute: float) -> str:
    return f"{per_minute:.1f}" if per_minute < 10 else compact(per_minute)


def _total(points: list[ChartPoint], minute: datetime) -> ChartPoint:
    return ChartPoint(
        minute,
        sum(point.succeeded for point in points),
        sum(point.failed for point in points),
        sum(point.dead_lettered for point in points),
        max((point.wait_ms_max for point in points), default=0),
    )


def _links(model_admin: _ModelAdmin, queue: str) -> dict[str, str]:
    site = model_admin.admin_site.name
    opts = model_admin.opts
    inbox = reverse(f"admin:{opts.app_label}_job_changelist", current_app=site)
    dead = reverse(f"admin:{opts.app_label}_deadletter_changelist", current_app=site)
    links = {
        name: f"{inbox}?{urlencode({'queue': queue, 'status': status})}"
        for name, status in (
            ("ready", READY),
            ("scheduled", SCHEDULED),
            ("unknown_task", UNKNOWN_TASK),
            ("blocked", JobStatus.BLOCKED.value),
            ("processing", JobStatus.PROCESSING.value),
            ("expired", EXPIRED),
        )
    }
    links["dead_letters"] = f"{dead}?{urlencode({'queue': queue})}"
    return links
