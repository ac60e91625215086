"""Periodic schedule declarations: the decorator, the setting, and one test per check ID."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_pgqueue.checks import check_schedules
from django_pgqueue.exceptions import InvalidSchedule
from django_pgqueue.features import cadence, periodic
from django_pgqueue.features.periodic import PeriodicSchedule, declared_schedules
from django_pgqueue.features.scheduling import definition_of
from tests import tasks

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def no_declarations(monkeypatch):
    """Give each test an empty @periodic registry."""
    monkeypatch.setattr(periodic, "_declared", {})
    monkeypatch.setattr(periodic, "_duplicates", [])


def entry(**overrides):
    return {"task": "tests.tasks.scheduled_probe", "schedule": "@daily", **overrides}


def errors(**schedules):
    with override_settings(PGQUEUE_SCHEDULES=schedules):
        return [(message.id, message.msg) for message in check_schedules()]


def test_valid_schedules_pass():
    assert errors(nightly=entry(timezone="Europe/Berlin", kwargs={"label": "n"})) == []


def test_the_decorator_declares_a_schedule_and_returns_the_task():
    decorated = periodic.periodic("*/5 * * * *", timezone="Europe/Berlin", downtime="skip")(
        tasks.scheduled_probe
    )
    assert decorated is tasks.scheduled_probe
    declared, problems = declared_schedules()
    assert problems == []
    assert declared == {
        "tests.tasks.scheduled_probe": PeriodicSchedule(
            name="tests.tasks.scheduled_probe",
            task_path="tests.tasks.scheduled_probe",
            expression="*/5 * * * *",
            timezone="Europe/Berlin",
            downtime="skip",
            origin="@periodic on tests.tasks.scheduled_probe",
        )
    }
    assert check_schedules() == []


def test_the_decorator_goes_above_task():
    with pytest.raises(TypeError, match="@periodic goes above @task"):
        periodic.periodic("@daily")(lambda: None)


def test_timezone_defaults_to_time_zone():
    with override_settings(TIME_ZONE="America/New_York"):
        assert PeriodicSchedule("n", "t", "@daily").timezone_name == "America/New_York"


def test_e201_bad_expression():
    assert errors(nightly=entry(schedule="0 25 * * *")) == [
        (
            "django_pgqueue.E201",
            "schedule 'nightly' (PGQUEUE_SCHEDULES): expression '0 25 * * *' is not a valid "
            "cron expression: Bad hour",
        )
    ]


def test_e202_unknown_timezone():
    assert errors(nightly=entry(timezone="Europe/Atlantis")) == [
        (
            "django_pgqueue.E202",
            "schedule 'nightly' (PGQUEUE_SCHEDULES): unknown timezone 'Europe/Atlantis'",
        )
    ]


def test_e203_unknown_task():
    [(check_id, message)] = errors(nightly=entry(task="tests.tasks.missing"))
    assert check_id == "django_pgqueue.E203"
    assert "tests.tasks.missing" in message
    [(check_id, message)] = errors(nightly=entry(task="tests.tasks.not_a_task"))
    assert check_id == "django_pgqueue.E203"
    assert "not a task" in message


def test_e204_queue_not_in_queues():
    assert errors(nightly=entry(queue_name="nowhere")) == [
        (
            "django_pgqueue.E204",
            "schedule 'nightly' (PGQUEUE_SCHEDULES): queue 'nowhere' is not in "
            "TASKS['default']['QUEUES'] (default, emails, high, low, reports)",
        )
    ]


def test_e205_bad_downtime_policy():
    assert [i for i, _ in errors(a=entry(downtime="burst"))] == ["django_pgqueue.E205"]
    assert [i for i, _ in errors(a=entry(downtime="catch_up"))] == ["django_pgqueue.E205"]
    assert [i for i, _ in errors(a=entry(downtime="catch_up", catch_up=500))] == [
        "django_pgqueue.E205"
    ]
    assert [i for i, _ in errors(a=entry(catch_up=3))] == ["django_pgqueue.E205"]


def test_e206_cron_library_missing(monkeypatch):
    monkeypatch.setattr(cadence, "cron_available", lambda: False)
    [(check_id, message)] = errors(nightly=entry(schedule="0 2 * * *"))
    assert check_id == "django_pgqueue.E206"
    assert "pip install 'django-tasks-pgqueue[cron]'" in message
    # Intervals need no library; the sync refuses a cron schedule with the same words.
    assert errors(often=entry(schedule="@every 30s")) == []
    with pytest.raises(InvalidSchedule, match=r"django-tasks-pgqueue\[cron\]"):
        definition_of(PeriodicSchedule("n", "tests.tasks.scheduled_probe", "@daily"))


def test_e208_priority_out_of_range():
    # Every fire would break the job table's check on priority.
    assert errors(nightly=entry(priority=101)) == [
        (
            "django_pgqueue.E208",
            "schedule 'nightly' (PGQUEUE_SCHEDULES): priority 101 is not a whole number "
            "between -100 and 100",
        )
    ]
    assert [i for i, _ in errors(nightly=entry(priority="5"))] == ["django_pgqueue.E208"]
    assert errors(nightly=entry(priority=-100)) == []


def test_e207_malformed_declarations():
    assert [i for i, _ in errors(**{"has space": entry()})] == ["django_pgqueue.E207"]
    assert errors(nightly={"task": "tests.tasks.scheduled_probe", "cron": "@daily"}) == [
        (
            "django_pgqueue.E207",
            "PGQUEUE_SCHEDULES['nightly'] has unknown keys ['cron'] (known: args, catch_up, "
            "downtime, kwargs, priority, queue_name, schedule, task, timezone)",
        )
    ]
    assert [i for i, _ in errors(nightly=entry(args=[object()]))] == ["django_pgqueue.E207"]
    periodic.periodic("@daily", name="nightly")(tasks.scheduled_probe)
    assert errors(nightly=entry()) == [
        (
            "django_pgqueue.E207",
            "schedule 'nightly' is declared twice (@periodic on tests.tasks.scheduled_probe "
            "and PGQUEUE_SCHEDULES)",
        )
    ]
