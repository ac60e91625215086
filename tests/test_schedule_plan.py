"""Downtime policies and fire keys (pure: a fixed clock is passed in)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_pgqueue.features.cadence import parse_cadence
from django_pgqueue.features.periodic import (
    MAX_CATCH_UP,
    PeriodicSchedule,
    ScheduledFire,
    fire_key,
    parse_fire_key,
    plan_fires,
    run_now_key,
)

UTC_ZONE = ZoneInfo("UTC")
HOURLY = parse_cadence("@hourly")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def plan(downtime: str, *, due_since: datetime, now: datetime, catch_up: int = 1):
    return plan_fires(
        HOURLY, UTC_ZONE, due_since=due_since, now=now, downtime=downtime, catch_up=catch_up
    )


@pytest.mark.parametrize("downtime", ["latest", "skip", "catch_up"])
def test_on_time_every_policy_fires_the_one_due_time(downtime):
    result = plan(downtime, due_since=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 3, 0, 1))
    assert result.fire_times == (utc(2026, 1, 1, 3),)
    assert result.next_fire_at == utc(2026, 1, 1, 4)


def test_after_downtime_latest_fires_the_most_recent_missed_time_once():
    # Workers down from 02:59 to 05:20: 03:00, 04:00 and 05:00 were missed.
    result = plan("latest", due_since=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 5, 20))
    assert result.fire_times == (utc(2026, 1, 1, 5),)
    assert result.next_fire_at == utc(2026, 1, 1, 6)


def test_after_downtime_skip_fires_nothing_late():
    result = plan("skip", due_since=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 5, 20))
    assert result.fire_times == ()
    assert result.next_fire_at == utc(2026, 1, 1, 6)
    # 30 seconds late is still on time for an hourly schedule.
    on_time = plan("skip", due_since=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 5, 0, 30))
    assert on_time.fire_times == (utc(2026, 1, 1, 5),)


def test_skip_lateness_is_half_the_period_for_short_schedules():
    every_2s = parse_cadence("@every 2s")
    due = utc(2026, 1, 1, 0, 0, 10)
    late = plan_fires(
        every_2s, UTC_ZONE, due_since=due, now=due + timedelta(seconds=1.5), downtime="skip"
    )
    assert late.fire_times == ()
    prompt = plan_fires(
        every_2s, UTC_ZONE, due_since=due, now=due + timedelta(seconds=0.5), downtime="skip"
    )
    assert prompt.fire_times == (due,)


def test_after_downtime_catch_up_fires_at_most_n_most_recent():
    result = plan("catch_up", due_since=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 9, 20), catch_up=2)
    assert result.fire_times == (utc(2026, 1, 1, 8), utc(2026, 1, 1, 9))
    fewer = plan("catch_up", due_since=utc(2026, 1, 1, 3), now=utc(2026, 1, 1, 4, 20), catch_up=5)
    assert fewer.fire_times == (utc(2026, 1, 1, 3), utc(2026, 1, 1, 4))


def test_never_a_burst_however_long_the_downtime():
    every_second = parse_cadence("@every 1s")
    result = plan_fires(
        every_second,
        UTC_ZONE,
        due_since=utc(2025, 1, 1),
        now=utc(2026, 1, 1),
        downtime="catch_up",
        catch_up=10_000,
    )
    assert len(result.fire_times) == MAX_CATCH_UP


def test_fire_keys_round_trip():
    fire = utc(2026, 3, 29, 1, 0)
    key = fire_key("nightly.report", fire.astimezone(ZoneInfo("Europe/Berlin")))
    assert key == "pgqueue:schedule:nightly.report:2026-03-29T01:00:00Z"
    assert parse_fire_key(key) == ScheduledFire("nightly.report", fire)
    manual = run_now_key("nightly.report", utc(2026, 3, 29, 1, 0, 5, 123))
    assert manual == "pgqueue:schedule:nightly.report:run-now:2026-03-29T01:00:05.000123Z"
    assert parse_fire_key(manual) == ScheduledFire(
        "nightly.report", utc(2026, 3, 29, 1, 0, 5, 123), manual=True
    )
    assert parse_fire_key("order-42") is None
    assert parse_fire_key(None) is None


def test_declaration_problems_name_their_check_ids():
    bad = PeriodicSchedule(
        name="has space",
        task_path="tests.tasks.noop",
        expression="61 * * * *",
        timezone="Mars/Olympus",
        downtime="burst",
    )
    assert [check_id for check_id, _ in bad.problems()] == [
        "django_pgqueue.E207",
        "django_pgqueue.E201",
        "django_pgqueue.E202",
        "django_pgqueue.E205",
    ]
    needs_n = PeriodicSchedule(name="x", task_path="t", expression="@daily", downtime="catch_up")
    assert [message for _, message in needs_n.problems()] == [
        f"downtime 'catch_up' needs catch_up=N, an integer from 1 to {MAX_CATCH_UP}"
    ]
