"""Periodic schedules fired by real runqueueworker processes: exactly once, downtime,
changes in code picked up at restart, the fire time in the task's context."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter
from datetime import timedelta

import pytest

from django_pgqueue.features.periodic import parse_fire_key
from tests.schedules import PROBE, jobs_per_fire
from tests.workers import wait_for

pytestmark = [pytest.mark.timeout(150), pytest.mark.one_server]

PERIOD = timedelta(seconds=2)
_FIRED = re.compile(r"schedule (\S+) fired for (.+) \((\d+) jobs\)")


def schedules_setting(**entries):
    return {"SCHEDULES": {name: {"task": PROBE, **entry} for name, entry in entries.items()}}


def fire_log(workers_):
    """Return how many times each (schedule, fire time) was logged as fired."""
    counts: Counter[tuple[str, str]] = Counter()
    for worker in workers_:
        for name, times, _ in _FIRED.findall(worker.output()):
            for fire in times.split(", "):
                counts[(name, fire)] += 1
    return counts


def stop_all(started):
    for worker in started:
        worker.send(signal.SIGTERM)
    for worker in started:
        assert worker.wait() == 0, worker.output()


def fires_after(observer, name, moment):
    return sorted(f for f in jobs_per_fire(observer, name) if f > moment)


def test_four_workers_started_together_fire_each_time_exactly_once(workers, observer, capsys):
    setting = schedules_setting(probe={"schedule": "@every 2s"})
    started = [workers(settings=setting) for _ in range(4)]
    for worker in started:
        worker.wait_registered(observer)
    wait_for(
        lambda: len(jobs_per_fire(observer)) >= 8,
        timeout=60,
        message="eight fire times of the every-2s schedule",
    )
    stop_all(started)
    per_fire = jobs_per_fire(observer)
    fire_times = sorted(per_fire)
    expected = [fire_times[0] + n * PERIOD for n in range(len(fire_times))]
    logged = fire_log(started)
    with capsys.disabled():
        print(
            f"\nexactly-once: 4 workers, {len(per_fire)} fire times, jobs per fire time "
            f"{sorted(Counter(per_fire.values()).items())}, fires logged per fire time "
            f"{sorted(Counter(logged.values()).items())}, gaps {len(set(expected) - set(per_fire))}"
        )
    assert set(per_fire.values()) == {1}
    assert fire_times == expected  # no fire time skipped either
    # The fence on next_fire_at decided, not the unique key: one worker fired each time.
    assert sorted(logged) == sorted(("probe", f"{f:%Y-%m-%d %H:%M:%S}Z") for f in fire_times)
    assert set(logged.values()) == {1}
    # Every job ran and saw its own fire time in its context.
    results = observer.execute(
        "SELECT idempotency_key, result::text FROM django_pgqueue_job_all "
        "WHERE status = 'succeeded' AND idempotency_key LIKE 'pgqueue:schedule:probe:%'"
    ).fetchall()
    assert results
    for key, result in results:
        value = json.loads(result)
        assert value["schedule"] == "probe"
        assert key.endswith(value["fire_time"].replace("+00:00", "Z"))


def test_downtime_policies_after_all_workers_were_stopped(workers, observer):
    setting = schedules_setting(
        latest={"schedule": "@every 2s"},
        skip={"schedule": "@every 2s", "downtime": "skip"},
        catch_up={"schedule": "@every 2s", "downtime": "catch_up", "catch_up": 2},
    )
    names = ("latest", "skip", "catch_up")
    first = [workers(settings=setting), workers(settings=setting)]
    wait_for(
        lambda: all(len(jobs_per_fire(observer, name)) >= 2 for name in names),
        timeout=60,
        message="two fires of every schedule",
    )
    stop_all(first)
    last_before = {name: max(jobs_per_fire(observer, name)) for name in names}
    stopped_at = observer.execute("SELECT statement_timestamp()").fetchone()[0]
    # Three fire times pass with no worker running.
    wait_for(
        lambda: (
            observer.execute("SELECT statement_timestamp()").fetchone()[0]
            > stopped_at + 3 * PERIOD + timedelta(seconds=0.5)
        ),
        timeout=30,
        interval=0.2,
        message="three fire times of downtime",
    )
    restarted = [workers(settings=setting), workers(settings=setting)]
    wait_for(
        lambda: all(len(fires_after(observer, name, last_before[name])) >= 3 for name in names),
        timeout=60,
        message="three fires of every schedule after the restart",
    )
    stop_all(restarted)

    def first_pass(name):
        """The jobs the first firing after the restart inserted (one statement: one
        created_at), as (fire time, created_at)."""
        rows = observer.execute(
            "SELECT idempotency_key, created_at FROM django_pgqueue_job_all "
            "WHERE idempotency_key LIKE %s ORDER BY created_at",
            [f"pgqueue:schedule:{name}:%"],
        ).fetchall()
        after = [(parse_fire_key(key).fire_time, created) for key, created in rows]
        after = [(fire, created) for fire, created in after if fire > last_before[name]]
        first_created = after[0][1]
        # One statement, one created_at: ORDER BY created_at leaves their order open.
        return sorted(fire for fire, created in after if created == first_created), first_created

    latest, _ = first_pass("latest")
    assert len(latest) == 1  # one job for all the missed times, not one each
    # Three or more fire times came during the downtime: the newest got the one job.
    assert latest[0] - last_before["latest"] >= 3 * PERIOD
    caught_up, _ = first_pass("catch_up")
    assert len(caught_up) == 2  # at most N=2, the most recent
    assert caught_up[1] - caught_up[0] == PERIOD
    assert caught_up[0] - last_before["catch_up"] >= 2 * PERIOD  # the oldest was dropped
    skipped, skip_at = first_pass("skip")
    # skip: nothing for the late times; the first job after the restart was on time.
    assert all(skip_at - fire <= PERIOD / 2 for fire in skipped)
    assert len(skipped) == 1
    for name in names:
        assert set(jobs_per_fire(observer, name).values()) == {1}


def test_schedule_changes_at_restart_are_picked_up_without_duplicate_fires(workers, observer):
    before = schedules_setting(
        probe={"schedule": "@every 2s", "kwargs": {"label": "v1"}},
        retired={"schedule": "@every 2s"},
        moved={"schedule": "@every 2s"},
    )
    first = workers(settings=before)
    wait_for(
        lambda: all(len(jobs_per_fire(observer, n)) >= 2 for n in ("probe", "retired", "moved")),
        timeout=60,
        message="two fires of each schedule",
    )
    stop_all([first])
    stopped = {n: max(jobs_per_fire(observer, n)) for n in ("probe", "moved")}
    after = schedules_setting(
        probe={"schedule": "@every 2s", "kwargs": {"label": "v2"}},
        moved={"schedule": "@every 4s"},
        added={"schedule": "@every 2s"},
    )
    # Two workers restart together with the new code: both sync, one after the other.
    second = [workers(settings=after), workers(settings=after)]
    wait_for(
        lambda: (
            len(fires_after(observer, "probe", stopped["probe"])) >= 3
            and len(fires_after(observer, "moved", stopped["moved"])) >= 2
            and jobs_per_fire(observer, "added")
        ),
        timeout=60,
        message="fires of the changed schedules",
    )
    stop_all(second)
    rows = dict(
        observer.execute(
            "SELECT name, kwargs::text || ' ' || expression FROM django_pgqueue_schedule"
        ).fetchall()
    )
    assert rows == {
        "probe": '{"label": "v2"} @every 2s',
        "moved": "{} @every 4s",
        "added": "{} @every 2s",
    }
    for name in ("probe", "moved", "added", "retired"):
        assert set(jobs_per_fire(observer, name).values()) == {1}, name
    labels = observer.execute(
        "SELECT kwargs->>'label', count(*) FROM django_pgqueue_job_all "
        "WHERE idempotency_key LIKE 'pgqueue:schedule:probe:%' GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [label for label, _ in labels] == ["v1", "v2"]
    # The moved schedule fires on its new timing only after the restart.
    moved_after = fires_after(observer, "moved", stopped["moved"])
    assert all(fire.timestamp() % 4 == 0 for fire in moved_after)
    logged = fire_log([first, *second])
    assert set(logged.values()) == {1}
    assert "schedules removed: retired" in "".join(w.output() for w in second)
