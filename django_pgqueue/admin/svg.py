"""A small server-rendered SVG chart: finished jobs per minute and the longest wait.

No JavaScript and nothing fetched from elsewhere: the chart is markup in the page. Every
text in it goes through ``format_html``; the numbers are formatted here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from django_pgqueue.admin.formatting import compact, duration
from django_pgqueue.store.reports import QueueMinute

__all__ = ["ChartPoint", "minute_series", "throughput_chart"]


@dataclass(frozen=True, slots=True)
class ChartPoint:
    """One minute of the chart."""

    minute: datetime
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    wait_ms_max: int = 0

    @property
    def finished(self) -> int:
        """Return the attempts that ended in this minute."""
        return self.succeeded + self.failed + self.dead_lettered


def minute_series(
    minutes: Iterable[QueueMinute], *, last_minute: datetime, count: int = 60
) -> list[ChartPoint]:
    """Return ``count`` minutes ending with ``last_minute``, summed over the given rows.

    Minutes without a row (no job finished) are zeros; waits take the maximum.
    """
    start = last_minute - timedelta(minutes=count - 1)
    slots = {
        start + timedelta(minutes=offset): ChartPoint(start + timedelta(minutes=offset))
        for offset in range(count)
    }
    for row in minutes:
        point = slots.get(row.minute)
        if point is None:
            continue
        slots[row.minute] = ChartPoint(
            point.minute,
            point.succeeded + row.succeeded,
            point.failed + row.failed,
            point.dead_lettered + row.dead_lettered,
            max(point.wait_ms_max, row.wait_ms_max),
        )
    return [slots[minute] for minute in sorted(slots)]


def throughput_chart(
    points: Sequence[ChartPoint],
    *,
    width: int = 720,
    height: int = 160,
    title: str = "",
    axes: bool = True,
) -> SafeString:
    """Return an SVG chart: stacked bars of finished jobs, and a line of the longest wait.

    Bars: succeeded (green), failed and retried (amber), dead-lettered (red), on the left
    scale. Line: the longest wait of a job claimed in that minute, on the right scale.
    """
    if not points:
        return SafeString("")
    pad_x, pad_top, pad_bottom = (60, 14, 18) if axes else (1, 2, 2)
    plot_width = width - 2 * pad_x
    plot_height = height - pad_top - pad_bottom
    slot = plot_width / len(points)
    most = max(point.finished for point in points) or 1
    longest = max(point.wait_ms_max for point in points) or 1

    bars = []
    for index, point in enumerate(points):
        x = pad_x + index * slot + slot * 0.1
        base: float = pad_top + plot_height
        for value, css in (
            (point.succeeded, "pgq-bar-succeeded"),
            (point.failed, "pgq-bar-failed"),
            (point.dead_lettered, "pgq-bar-dead"),
        ):
            if not value:
                continue
            bar_height = value / most * plot_height
            base -= bar_height
            bars.append((css, f"{x:.1f}", f"{base:.1f}", f"{slot * 0.8:.1f}", f"{bar_height:.1f}"))
    line = " ".join(
        f"{pad_x + (index + 0.5) * slot:.1f},"
        f"{pad_top + plot_height - point.wait_ms_max / longest * plot_height:.1f}"
        for index, point in enumerate(points)
    )
    parts = [
        format_html(
            '<svg class="pgq-chart" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" '
            'viewBox="0 0 {} {}" role="img" aria-label="{}"><title>{}</title>',
            width,
            height,
            width,
            height,
            title,
            title,
        ),
        format_html(
            '<rect class="pgq-plot" x="{}" y="{}" width="{}" height="{}"/>',
            pad_x,
            pad_top,
            plot_width,
            plot_height,
        ),
        format_html_join("", '<rect class="{}" x="{}" y="{}" width="{}" height="{}"/>', bars),
        format_html('<polyline class="pgq-line-wait" points="{}"/>', line),
    ]
    if axes:
        bottom = height - 4
        parts.append(
            format_html(
                '<text class="pgq-axis" x="{}" y="{}" text-anchor="end">{}</text>'
                '<text class="pgq-axis" x="{}" y="{}" text-anchor="end">0</text>'
                '<text class="pgq-axis pgq-axis-wait" x="{}" y="{}">{}</text>'
                '<text class="pgq-axis" x="{}" y="{}">{}</text>'
                '<text class="pgq-axis" x="{}" y="{}" text-anchor="end">{}</text>',
                pad_x - 4,
                pad_top + 8,
                _("%(count)s/min") % {"count": compact(most)},
                pad_x - 4,
                pad_top + plot_height,
                width - pad_x + 4,
                pad_top + 8,
                duration(longest / 1000),
                pad_x,
                bottom,
                _("%(count)d min ago") % {"count": len(points)},
                width - pad_x,
                bottom,
                _("now"),
            )
        )
    parts.append(SafeString("</svg>"))
    return SafeString("".join(parts))
