"""The lag page: how far behind each queue is, how fast it drains, and the job table's health.

Health includes the INVALID indexes on the queue's tables (as system check W002 reports
them), each with the command that repairs it.

Registered by the job admin (``admin:django_pgqueue_lag``) and rendered inside the admin
site, so login, permissions (view permission on jobs) and breadcrumbs work as elsewhere.
Every figure comes from a read-only query of the queue manager (``sql/admin.sql``, and
``sql/schema.sql`` for the indexes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..manager import QueueLag, QueueMinute
from ..models import Job
from ..schema import index_problems
from ..states import JobStatus
from .filters import EXPIRED, READY, SCHEDULED, UNKNOWN_TASK
from .formatting import duration
from .queues import configured_queues
from .svg import ChartPoint, minute_series, throughput_chart

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

__all__ = ["COUNT_LIMIT", "QueueRow", "lag_view"]

#: Depth and dead-letter counts stop here: the page shows "10,000+" beyond.
COUNT_LIMIT = 10_000
#: Minutes of history in the throughput figures and the chart.
CHART_MINUTES = 60
#: The short throughput window, in minutes.
RECENT_MINUTES = 5


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue's line on the lag page."""

    lag: QueueLag
    #: Attempts finished in the last RECENT_MINUTES and CHART_MINUTES minutes.
    recent: ChartPoint
    hour: ChartPoint
    chart: SafeString
    links: dict[str, str]

    @property
    def lag_display(self) -> str:
        """Return how long the oldest ready job has waited, as a short duration."""
        return duration(self.lag.lag_seconds)

    @property
    def recent_per_minute(self) -> float:
        """Return the finished attempts per minute over the short window."""
        return self.recent.finished / RECENT_MINUTES

    @property
    def hour_per_minute(self) -> float:
        """Return the finished attempts per minute over the hour."""
        return self.hour.finished / CHART_MINUTES


def lag_view(model_admin: ModelAdmin[Any], request: HttpRequest) -> TemplateResponse:
    """Render the lag page (view permission on jobs required)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    store = Job.objects.store(model_admin.model.objects.db)
    queues = store.known_queues(configured_queues())
    lags = store.queue_lag(queues, count_limit=COUNT_LIMIT)
    minutes = store.queue_minutes(queues, minutes=CHART_MINUTES)
    measured_at = lags[0].measured_at if lags else timezone.now()
    last_minute = measured_at.replace(second=0, microsecond=0)

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
                    width=120,
                    height=32,
                    title=gettext("%(queue)s: finished jobs and longest wait per minute")
                    % {"queue": lag.queue},
                    axes=False,
                ),
                links=_links(model_admin, lag.queue),
            )
        )
    overall = minute_series(minutes, last_minute=last_minute)
    health = store.job_table_health()
    invalid_indexes = index_problems(store.runner.alias)
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Queue lag"),
        "opts": model_admin.opts,
        "rows": rows,
        "count_limit": COUNT_LIMIT,
        "chart": throughput_chart(
            overall, title=gettext("All queues: finished jobs and longest wait per minute")
        ),
        "chart_minutes": CHART_MINUTES,
        "recent_minutes": RECENT_MINUTES,
        "health": health,
        "dead_percent": health.dead_fraction * 100 if health else 0,
        "invalid_indexes": invalid_indexes,
        "measured_at": measured_at,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_pgqueue/admin/lag.html", context)


def _total(points: list[ChartPoint], minute: datetime) -> ChartPoint:
    return ChartPoint(
        minute,
        sum(point.succeeded for point in points),
        sum(point.failed for point in points),
        sum(point.dead_lettered for point in points),
        max((point.wait_ms_max for point in points), default=0),
    )


def _links(model_admin: ModelAdmin[Any], queue: str) -> dict[str, str]:
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
            ("processing", JobStatus.PROCESSING.value),
            ("expired", EXPIRED),
        )
    }
    links["dead_letters"] = f"{dead}?{urlencode({'queue': queue})}"
    return links
