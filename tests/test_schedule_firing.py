"""Firing schedules against the database: sync, fences, downtime policies, races."""

from __future__ import annotations

import threading
from datetime import UTC, timedelta

import pytest

from django_pgqueue.conf import conf
from django_pgqueue.features.cadence import parse_cadence
from django_pgqueue.features.scheduling import fire_due, pause, resume, run_now
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from tests.schedules import (
    PROBE,
    jobs_per_fire,
    make_due,
    schedule,
    scheduled_jobs,
    sync,
)

pytestmark = pytest.mark.timeout(60)


def row(conn, name="probe"):
    return conn.execute(
        "SELECT next_fire_at, last_fire_at, paused_at, statement_timestamp(), queue, priority, "
        "max_attempts, description FROM django_pgqueue_schedule WHERE name = %s",
        [name],
    ).fetchone()


def test_sync_adds_changes_and_removes(observer):
    report = sync(
        observer, schedule("a", "@hourly"), schedule("b", "@daily", kwargs={"label": "x"})
    )
    assert (report.added, report.changed, report.removed) == (("a", "b"), (), ())
    next_fire, last_fire, paused, now, queue, priority, max_attempts, description = row(
        observer, "a"
    )
    assert now < next_fire <= now + timedelta(hours=1)
    assert next_fire.minute == next_fire.second == 0
    assert (last_fire, paused, queue, priority, max_attempts) == (
        None,
        None,
        "default",
        0,
        conf.MAX_ATTEMPTS,
    )
    assert description == parse_cadence("@hourly").describe()

    again = sync(observer, schedule("a", "@hourly"), schedule("b", "@daily", kwargs={"label": "x"}))
    assert (again.added, again.changed, again.removed) == ((), (), ())

    # Arguments changed: same timing, so the next fire stays; timing changed: it moves.
    before_b = row(observer, "b")[0]
    changed = sync(
        observer, schedule("a", "*/5 * * * *"), schedule("b", "@daily", kwargs={"label": "y"})
    )
    assert changed.changed == ("a", "b")
    assert row(observer, "b")[0] == before_b
    next_a, *_rest, now = row(observer, "a")[:4]
    assert next_a.minute % 5 == 0
    assert next_a <= now + timedelta(minutes=5)

    gone = sync(observer, schedule("b", "@daily", kwargs={"label": "y"}))
    assert gone.removed == ("a",)
    assert row(observer, "a") is None


def test_a_due_schedule_fires_one_job_with_its_fire_time_in_the_key(observer, store):
    sync(observer, schedule("probe", "* * * * *", kwargs={"label": "hourly"}, priority=5))
    assert fire_due(store).fired == {}  # not due yet
    make_due(observer, "probe")
    planned = row(observer)[0]
    report = fire_due(store)
    assert report.fired == {"probe": 1}
    [(key, args, kwargs, status)] = scheduled_jobs(observer)
    assert key == f"pgqueue:schedule:probe:{planned:%Y-%m-%dT%H:%M:%S}Z"
    assert (args, kwargs, status) == ([], {"label": "hourly"}, "pending")
    assert observer.execute(
        "SELECT priority, task_path FROM django_pgqueue_job_all"
    ).fetchone() == (
        5,
        PROBE,
    )
    next_fire, last_fire, *_ = row(observer)
    assert last_fire == planned
    assert next_fire > planned
    assert fire_due(store).fired == {}  # advanced: nothing due any more


@pytest.mark.parametrize(
    ("downtime", "catch_up", "expected"),
    [("latest", None, 1), ("skip", None, 0), ("catch_up", 2, 2), ("catch_up", 10, 4)],
)
def test_downtime_policies_after_missing_fires(observer, store, downtime, catch_up, expected):
    # An hourly schedule at the minute half an hour from now, whose workers were down
    # for its last four fire times (the newest half an hour ago: late, even for skip).
    now = store.database_now()
    minute = (now.minute + 30) % 60
    expression = f"{minute} * * * *"
    newest = parse_cadence(expression).fires_between(now - timedelta(hours=1), now, UTC, limit=1)[0]
    sync(observer, schedule("probe", expression, downtime=downtime, catch_up=catch_up))
    observer.execute(
        "UPDATE django_pgqueue_schedule SET next_fire_at = %s", [newest - timedelta(hours=3)]
    )
    report = fire_due(store)
    fires = jobs_per_fire(observer)
    assert sum(fires.values()) == expected
    assert set(fires.values()) <= {1}
    if expected:
        newest = max(fires)
        assert newest == row(observer)[1]  # last_fire_at
    assert report.fired == {"probe": expected}
    next_fire, _, _, now, *_ = row(observer)
    assert next_fire == newest + timedelta(hours=1)


def test_racing_firers_insert_each_fire_time_once(open_connection, observer):
    sync(observer, schedule("probe", "* * * * *", downtime="catch_up", catch_up=3))
    observer.execute(
        "UPDATE django_pgqueue_schedule SET next_fire_at = "
        "date_trunc('minute', statement_timestamp()) - interval '5 minutes'"
    )
    stores = [QueueStore(PsycopgRunner(open_connection(), "default")) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    reports = []

    def firer(store):
        barrier.wait(10)
        reports.append(fire_due(store))

    threads = [threading.Thread(target=firer, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(reports) == 8
    winners = [r for r in reports if r.fired]
    assert len(winners) == 1  # the fence on next_fire_at, not the unique key, decided
    assert winners[0].fired == {"probe": 3}
    assert sorted(jobs_per_fire(observer).values()) == [1, 1, 1]


def test_paused_schedules_do_not_fire_and_resume_from_now(observer, store):
    sync(observer, schedule("probe", "* * * * *"))
    assert pause(store, ["probe", "missing"]) == ["probe"]
    assert pause(store, ["probe"]) == []  # already paused: fenced
    make_due(observer, "probe", 10)
    assert fire_due(store).fired == {}
    assert sync(observer, schedule("probe", "* * * * *")).changed == ()
    assert row(observer)[2] is not None  # a sync keeps the operator's pause
    assert resume(store, ["probe"]) == ["probe"]
    assert resume(store, ["probe"]) == []
    next_fire, _, paused, now, *_ = row(observer)
    assert paused is None
    assert now < next_fire <= now + timedelta(minutes=1)  # the paused hours are not owed
    assert fire_due(store).fired == {}
    assert jobs_per_fire(observer) == {}


def test_run_now_enqueues_once_per_confirmation(observer, store):
    sync(observer, schedule("probe", "@daily", kwargs={"label": "manual"}))
    requested_at = store.database_now()
    first = run_now(store, ["probe", "gone"], requested_at=requested_at)
    assert list(first) == ["probe"]
    assert run_now(store, ["probe"], requested_at=requested_at) == {}  # resubmitted
    [(key, _, kwargs, status)] = scheduled_jobs(observer)
    assert key.startswith("pgqueue:schedule:probe:run-now:")
    assert (kwargs, status) == ({"label": "manual"}, "pending")
    assert row(observer)[1] is None  # the timetable did not move
