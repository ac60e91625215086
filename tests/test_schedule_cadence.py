"""Schedule expressions: cron with nicknames, steps and ranges, intervals, DST (pure)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_pgqueue.features.cadence import ALIASES, CadenceError, parse_cadence, zone

BERLIN = ZoneInfo("Europe/Berlin")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def fires(expression: str, start: datetime, count: int, tz: ZoneInfo = BERLIN) -> list[datetime]:
    cadence = parse_cadence(expression)
    found, moment = [], start
    for _ in range(count):
        moment = cadence.next_after(moment, tz)
        found.append(moment)
    return found


@pytest.mark.parametrize(
    ("nickname", "fields"),
    [
        ("@hourly", "0 * * * *"),
        ("@daily", "0 0 * * *"),
        ("@weekly", "0 0 * * 0"),
        ("@monthly", "0 0 1 * *"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@midnight", "0 0 * * *"),
    ],
)
def test_nicknames_stand_for_their_cron_fields(nickname, fields):
    assert parse_cadence(nickname).cron == fields == ALIASES[nickname]


def test_steps_ranges_and_lists():
    cadence = parse_cadence("1-5/2,10 9 * * mon-fri")
    start = utc(2026, 11, 20, 0, 0)  # a Friday
    minutes = [f.minute for f in fires("1-5/2,10 9 * * mon-fri", start, 4, ZoneInfo("UTC"))]
    assert minutes == [1, 3, 5, 10]
    assert cadence.describe() == (
        "At every second minute from 1 through 5 and minute 10 past hour 9 on Monday through Friday"
    )
    # Saturday and Sunday are skipped: the next fire after Friday 09:10 is Monday.
    after_friday = parse_cadence("1-5/2,10 9 * * mon-fri").next_after(
        utc(2026, 11, 20, 9, 10), ZoneInfo("UTC")
    )
    assert after_friday == utc(2026, 11, 23, 9, 1)


def test_every_interval_is_anchored_at_the_epoch():
    cadence = parse_cadence("@every 1h30m")
    assert cadence.interval == timedelta(minutes=90)
    assert cadence.next_after(utc(2026, 1, 1, 0, 10), BERLIN) == utc(2026, 1, 1, 1, 30)
    assert cadence.next_after(utc(2026, 1, 1, 1, 30), BERLIN) == utc(2026, 1, 1, 3, 0)
    assert cadence.describe() == "Every 1 hour 30 minutes"
    assert parse_cadence("@every 2s").describe() == "Every 2 seconds"


def test_fires_between_walks_back_from_the_end_only_as_far_as_the_limit():
    cadence = parse_cadence("@every 1s")
    start, end = utc(2020, 1, 1), utc(2026, 1, 1)  # six years of missed seconds
    assert cadence.fires_between(start, end, BERLIN, limit=3) == [
        end - timedelta(seconds=2),
        end - timedelta(seconds=1),
        end,
    ]
    assert parse_cadence("@hourly").fires_between(
        utc(2026, 1, 1, 0, 30), utc(2026, 1, 1, 3, 0), BERLIN, limit=10
    ) == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2), utc(2026, 1, 1, 3)]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "not a valid cron expression"),
        ("@fortnightly", "unknown nickname"),
        ("@every 0s", "at least one second"),
        ("@every soon", "not an interval"),
        ("", "non-empty"),
        ("* * *", "not a valid cron expression"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expression, message):
    with pytest.raises(CadenceError, match=message):
        parse_cadence(expression)


def test_unknown_timezone():
    with pytest.raises(CadenceError, match="unknown timezone 'Mars/Olympus'"):
        zone("Mars/Olympus")


# ------------------------------------------------------------------ DST, Europe/Berlin
# 2026-03-29: clocks go from 02:00 to 03:00 (02:30 does not exist).
# 2026-10-25: clocks go from 03:00 back to 02:00 (02:30 happens twice).


def test_a_fire_time_that_does_not_exist_fires_once_right_after_the_gap():
    daily = fires("30 2 * * *", utc(2026, 3, 27, 12), 3)
    assert [f.astimezone(BERLIN).isoformat() for f in daily] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 did not exist: the first minute after the gap
        "2026-03-30T02:30:00+02:00",
    ]
    # Exactly 24 hours apart in wall-clock terms; 23 real hours across the change.
    assert daily[1] - daily[0] == timedelta(hours=23, minutes=30)


def test_a_fire_time_that_happens_twice_fires_once():
    daily = fires("30 2 * * *", utc(2026, 10, 24, 12), 2)
    assert [f.astimezone(BERLIN).isoformat() for f in daily] == [
        "2026-10-25T02:30:00+02:00",  # the first 02:30 only
        "2026-10-26T02:30:00+01:00",
    ]


def test_an_every_hour_expression_fires_in_both_passes_of_the_repeated_hour():
    half_hourly = fires("*/30 * * * *", utc(2026, 10, 24, 23, 45), 5)
    assert [f.astimezone(BERLIN).isoformat() for f in half_hourly] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    # Each fire is a distinct instant, 30 real minutes apart.
    assert {b - a for a, b in itertools.pairwise(half_hourly)} == {timedelta(minutes=30)}


def test_a_nightly_schedule_stays_at_local_time_across_both_changes():
    start = utc(2026, 3, 27)
    nightly = fires("0 2 * * *", start, 3)
    assert [f.astimezone(BERLIN).strftime("%d %H:%M %z") for f in nightly] == [
        "27 02:00 +0100",
        "28 02:00 +0100",
        "29 03:00 +0200",
    ]
    autumn = fires("0 2 * * *", utc(2026, 10, 23, 12), 3)
    assert [f.astimezone(BERLIN).strftime("%d %H:%M %z") for f in autumn] == [
        "24 02:00 +0200",
        "25 02:00 +0200",
        "26 02:00 +0100",
    ]


def test_the_same_expression_in_utc_ignores_berlin_changes():
    assert fires("30 2 * * *", utc(2026, 3, 28, 12), 1, ZoneInfo("UTC")) == [
        utc(2026, 3, 29, 2, 30)
    ]
