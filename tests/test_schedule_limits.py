"""Periodic fires carry their task's flow limits, as an enqueued job of the task does.

A schedule's jobs are inserted by the schedule's own statements (fire_schedule,
run_schedule_now), not by enqueue: each must copy the limits the sync resolved onto the
schedule row and signal the key, or a periodic task would run past its limit.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import override_settings

from django_pgqueue.features.periodic import PeriodicSchedule
from django_pgqueue.features.scheduling import fire_due, run_now
from django_pgqueue.models import Job, Schedule
from django_pgqueue.states import JobStatus
from tests import tasks
from tests.schedules import PROBE, make_due, sync

pytestmark = pytest.mark.timeout(60)

LIMITED = "tests.tasks.ledger_task_limited"  # concurrency_limit=2, no key: the task is the key
RATED = "tests.tasks.ledger_rated"  # rate_limit="20/s"


def _claim(store) -> list[int]:
    return [job.id for job in store.claim("w", ["default"], per_queue=50, lease_seconds=30)]


def _limits(job_or_schedule) -> tuple:
    return (
        job_or_schedule.concurrency_key,
        job_or_schedule.concurrency_limit,
        job_or_schedule.rate_limit,
        job_or_schedule.rate_period,
    )


def test_a_fire_of_a_limited_task_waits_for_a_free_slot(observer, store):
    sync(observer, PeriodicSchedule(name="limited", task_path=LIMITED, expression="* * * * *"))
    assert _limits(Schedule.objects.get(pk="limited")) == (f"task:{LIMITED}", 2, None, None)
    running = [int(tasks.ledger_task_limited.enqueue().id) for _ in range(2)]
    leases = store.claim("w", ["default"], per_queue=50, lease_seconds=30)
    assert sorted(job.id for job in leases) == sorted(running)

    make_due(observer, "limited")
    assert fire_due(store).fired == {"limited": 1}
    fired = Job.objects.get(idempotency_key__startswith="pgqueue:schedule:limited:")
    assert _limits(fired) == (f"task:{LIMITED}", 2, None, None)
    assert _claim(store) == [], "the task is at its limit of 2: the fire waits"

    store.complete_if_leased(leases[0].lease, "null")
    assert _claim(store) == [fired.pk], "a slot freed: the fired job starts"


def test_run_now_of_a_rated_task_carries_its_rate_limit(observer, store):
    sync(observer, PeriodicSchedule(name="rated", task_path=RATED, expression="@daily"))
    assert _limits(Schedule.objects.get(pk="rated")) == (f"task:{RATED}", None, 20, 1.0)
    made = run_now(store, ["rated"], requested_at=datetime.now(UTC))
    job = Job.objects.get(pk=made["rated"])
    assert _limits(job) == (f"task:{RATED}", None, 20, 1.0)
    assert job.status == JobStatus.PENDING
    assert _claim(store) == [job.pk]


def test_a_queue_limit_from_the_settings_applies_to_fires_and_a_change_is_synced(observer, store):
    plain = PeriodicSchedule(name="probe", task_path=PROBE, expression="* * * * *")
    sync(observer, plain)
    assert _limits(Schedule.objects.get(pk="probe")) == (None, None, None, None)
    with override_settings(PGQUEUE_CONCURRENCY_LIMITS={"queue:default": 1}):
        report = sync(observer, plain)
        assert report.changed == ("probe",)
        assert _limits(Schedule.objects.get(pk="probe")) == ("queue:default", 1, None, None)
        make_due(observer, "probe")
        assert fire_due(store).fired == {"probe": 1}
    fired = Job.objects.get(idempotency_key__startswith="pgqueue:schedule:probe:")
    assert _limits(fired) == ("queue:default", 1, None, None)
    # Back to no limit: the next sync clears the row's limits.
    assert sync(observer, plain).changed == ("probe",)
    assert _limits(Schedule.objects.get(pk="probe")) == (None, None, None, None)
