"""How the admin writes durations, numbers and payloads, and draws its chart."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue.admin.formatting import (
    age,
    compact,
    duration,
    moment,
    pretty_json,
    relative,
)
from django_pgqueue.admin.svg import minute_series, throughput_chart
from django_pgqueue.store.reports import QueueMinute

pytestmark = pytest.mark.timeout(10)

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250 ms"), (42, "42 s"), (125, "2 min 5 s"), (7260, "2 h 1 min"), (90061, "1 d 1 h")],
)
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_relative():
    assert relative(NOW + dt.timedelta(minutes=5), NOW) == "in 5 min"
    assert relative(NOW - dt.timedelta(seconds=3), NOW) == "3 s ago"
    assert relative(None, NOW) == ""


@pytest.mark.parametrize(
    ("number", "text"), [(950, "950"), (13_158, "13.2k"), (250_000, "250k"), (1_200_000, "1.2M")]
)
def test_compact(number, text):
    assert compact(number) == text


def test_pretty_json_is_indented_and_cut():
    assert pretty_json({"b": 1, "a": [1]}) == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}'
    assert pretty_json("x" * 50, limit=10).endswith("42 more characters")


def test_minute_series_fills_empty_minutes_and_sums_queues():
    rows = [
        QueueMinute("a", NOW - dt.timedelta(minutes=1), 5, 1, 0, 300),
        QueueMinute("b", NOW - dt.timedelta(minutes=1), 2, 0, 1, 900),
        QueueMinute("a", NOW - dt.timedelta(minutes=90), 1000, 0, 0, 0),  # too old
    ]
    series = minute_series(rows, last_minute=NOW, count=3)
    assert [point.minute for point in series] == [NOW - dt.timedelta(minutes=m) for m in (2, 1, 0)]
    assert [point.finished for point in series] == [0, 9, 0]
    assert series[1].wait_ms_max == 900


def test_chart_is_plain_svg_with_escaped_title():
    series = minute_series([QueueMinute("a", NOW, 5, 1, 1, 300)], last_minute=NOW, count=2)
    svg = throughput_chart(series, title="<script>x</script>")
    assert svg.startswith("<svg")
    assert svg.endswith("</svg>")
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert svg.count("<rect") == 1 + 3  # the frame, and three stacked bars
    assert throughput_chart([]) == ""


@pytest.mark.parametrize(
    ("offset", "text"),
    [
        (dt.timedelta(seconds=-0.2), "0s"),
        (dt.timedelta(seconds=0.4), "0s"),
        (dt.timedelta(seconds=-42), "42s"),
        (dt.timedelta(minutes=-2, seconds=-59), "2m"),
        (dt.timedelta(hours=-3, minutes=-50), "3h"),
        (dt.timedelta(days=-2, hours=-23), "2d"),
        (dt.timedelta(minutes=5), "in 5m"),
        (dt.timedelta(hours=23, minutes=59), "in 23h"),
    ],
)
def test_age_is_one_short_unit(offset, text):
    assert age(NOW + offset, NOW) == text


def test_moment_gives_the_exact_time_on_hover(settings):
    settings.TIME_ZONE = "Europe/Paris"
    html = moment(NOW - dt.timedelta(minutes=2), "finished at", now=NOW)
    assert html == (
        '<time datetime="2026-01-01T11:58:00+00:00" '
        'title="finished at: 2026-01-01 12:58:00 CET">2m</time>'
    )
    assert moment(None) == ""
    assert "&lt;b&gt;" in moment(NOW, "<b>", now=NOW)
