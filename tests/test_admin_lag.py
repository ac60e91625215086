"""The lag page: per-queue backlog and lag, throughput, the SVG chart and table health."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.utils import timezone

from django_pgqueue.admin import lag
from django_pgqueue.store.reports import QueueCounts
from tests.admin_fixtures import (
    SCRIPT,
    dead_letter,
    enqueue,
    login,
    running,
    scheduled,
    store,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

LAG = url("django_pgqueue_lag")


def _minute_ago(minutes: int, queue: str, succeeded: int, failed: int = 0, wait_ms: int = 0):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgqueue_queuestat "
            "(queue, minute, succeeded, failed, dead_lettered, wait_ms_max) "
            "VALUES (%s, date_trunc('minute', now()) - %s * interval '1 minute', %s, %s, 0, %s)",
            [queue, minutes, succeeded, failed, wait_ms],
        )


@pytest.fixture
def state(client):
    login(client, superuser=True)
    dead_letter(queue="emails")
    running(queue="emails")
    running(queue="emails", expired=True)
    waiting = enqueue(queue="emails", available_at=timezone.now() - dt.timedelta(minutes=5))
    enqueue(queue="emails")
    scheduled(queue="emails")
    enqueue(queue="unconfigured")
    store().record_queue_stats([QueueCounts("emails", succeeded=30, failed=2, wait_ms_max=900)])
    _minute_ago(3, "emails", 20)
    _minute_ago(30, "emails", 600, failed=10, wait_ms=4000)
    _minute_ago(90, "emails", 5000)  # outside the hour
    return waiting


def _row(response, queue):
    return next(row for row in response.context["rows"] if row.lag.queue == queue)


def test_per_queue_backlog_and_lag(client, state):
    response = client.get(LAG)
    assert response.status_code == 200
    row = _row(response, "emails")
    assert (row.lag.ready, row.lag.scheduled) == (2, 1)
    assert (row.lag.processing, row.lag.expired, row.lag.dead_letters) == (2, 1, 1)
    assert row.lag.oldest_ready_at == state.available_at
    # now() is the start of the test's transaction, a moment before "5 minutes ago".
    assert 290 < row.lag.lag_seconds < 400
    assert row.lag_display.startswith(("4 min", "5 min"))
    # Configured queues show even when empty; queues in use show even if not configured.
    queues = [row.lag.queue for row in response.context["rows"]]
    assert {"default", "reports", "high", "low", "emails", "unconfigured"} <= set(queues)
    assert queues == sorted(queues)


def test_throughput_over_five_and_sixty_minutes(client, state):
    row = _row(client.get(LAG), "emails")
    assert row.recent.succeeded == 50
    assert row.recent.failed == 2
    assert row.recent_per_minute == pytest.approx(52 / 5)
    assert row.hour.succeeded == 650
    assert row.hour_per_minute == pytest.approx(662 / 60)
    assert row.hour.wait_ms_max == 4000


def test_links_to_the_filtered_listings(client, state):
    text = client.get(LAG).text
    for status in ("ready", "scheduled", "processing", "expired"):
        assert f"?queue=emails&amp;status={status}" in text
    assert "deadletter/?queue=emails" in text


def test_charts_are_inline_svg_without_scripts_or_remote_resources(client, state):
    text = client.get(LAG).text
    charts = re.findall(r"<svg class=\"pgq-chart\".*?</svg>", text, re.S)
    assert len(charts) >= 2  # the overall chart and one per queue
    for chart in charts:
        assert "<script" not in chart
        assert "href" not in chart
    assert "<polyline" in charts[0]
    assert "pgq-bar-succeeded" in charts[0]
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text


def test_table_health(client, state):
    response = client.get(LAG)
    health = response.context["health"]
    assert health.total_bytes >= health.table_bytes > 0
    assert health.index_bytes > 0
    assert "Job table health" in response.text
    assert "Last autovacuum" in response.text


def test_counts_stop_at_the_limit(client, state, monkeypatch):
    monkeypatch.setattr(lag, "COUNT_LIMIT", 2)
    response = client.get(LAG)
    row = _row(response, "emails")
    assert row.lag.ready == 2
    assert re.search(r">2\+</a>", response.text)


def test_queue_names_are_escaped(client):
    login(client, superuser=True)
    enqueue(queue=SCRIPT)
    text = client.get(LAG).text
    assert "<script>alert" not in text
    assert "&lt;script&gt;" in text


def test_phones_get_a_narrow_chart_and_labelled_figures(client, state):
    text = client.get(LAG).text
    # The overall chart is drawn twice: scaled down, the wide one's labels would be
    # unreadable on a phone; the stylesheet shows one or the other.
    wide = re.search(r'class="pgq-chart-wide"><svg [^>]*width="(\d+)"', text)
    narrow = re.search(r'class="pgq-chart-narrow"><svg [^>]*width="(\d+)"', text)
    assert wide
    assert narrow
    assert (int(wide.group(1)), int(narrow.group(1))) == (720, 360)
    # Each figure carries its label, shown above it when a queue becomes a card.
    row = re.search(r'<tr data-queue="emails">(.*?)</tr>', text, re.S)
    assert row
    labels = re.findall(r'data-label="([^"]+)"', row.group(1))
    assert labels[:6] == [
        "Ready",
        "Scheduled",
        "Running",
        "Expired leases",
        "Dead letters",
        "Oldest ready (lag)",
    ]
    assert len(labels) == 10


def test_rates_are_short_and_the_lag_has_its_moment_on_hover(client, state):
    response = client.get(LAG)
    row = _row(response, "emails")
    assert row.recent_display == "10"  # 52 finished in 5 minutes
    assert row.hour_display == "11"  # 662 in 60 minutes
    assert (lag._rate(2.54), lag._rate(13_991.8)) == ("2.5", "14.0k")
    assert re.fullmatch(
        r"oldest ready job ready since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+", row.oldest_ready_title
    )
    assert f'title="{row.oldest_ready_title}"' in response.text
