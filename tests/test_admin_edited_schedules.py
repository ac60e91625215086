"""Schedules created, edited and deleted in the admin; the code's stay read-only there."""

from __future__ import annotations

import json
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_pgqueue.features.scheduling import sync_schedules
from django_pgqueue.models import Job, Schedule, ScheduleSource
from tests.admin_fixtures import login, make_user, messages_of, url
from tests.schedules import PROBE, schedule

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

PAGE = url("django_pgqueue_schedule_changelist")
ADD = url("django_pgqueue_schedule_add")


def form(**overrides):
    """Return the add form's data for a valid schedule of the probe task."""
    return {
        "name": "digest",
        "task_path": PROBE,
        "expression": "0 7 * * *",
        "timezone": "",
        "args": "",
        "kwargs": '{"label": "digest"}',
        "queue": "",
        "priority": "",
        "downtime": "latest",
        "catch_up": "",
        **overrides,
    }


def change_form(name, **overrides):
    """Return the change form's data of admin schedule ``name`` as its page shows it."""
    row = Schedule.objects.get(name=name)
    data = form(
        expression=row.expression,
        timezone=row.timezone,
        args=json.dumps(row.args),
        kwargs=json.dumps(row.kwargs),
        queue=row.queue,
        priority=str(row.priority),
        downtime=row.downtime,
    )
    del data["name"]
    return {**data, **overrides}


def errors_of(response):
    assert response.status_code == 200, response.status_code
    return dict(response.context["adminform"].form.errors)


def logged(name):
    return list(
        LogEntry.objects.filter(object_id=name).order_by("id").values_list("action_flag", flat=True)
    )


@pytest.fixture
def code_schedule():
    with transaction.atomic():
        sync_schedules(Job.objects.store(), [schedule("nightly", "0 2 * * *")])


def test_adding_a_schedule_writes_an_admin_row_that_fires_from_the_next_time(client):
    login(client, superuser=True)
    page = client.get(ADD)
    assert page.status_code == 200
    assert 'name="expression"' in page.text
    response = client.post(ADD, form())
    assert response.status_code == 302, errors_of(response)
    row = Schedule.objects.get(name="digest")
    assert row.source == ScheduleSource.ADMIN
    # The task's queue and priority, the settings' time zone, as a code declaration gets.
    assert (row.task_path, row.queue, row.priority, row.timezone) == (PROBE, "default", 0, "UTC")
    assert (row.args, row.kwargs, row.description) == (
        [],
        {"label": "digest"},
        "At 07:00 every day",
    )
    assert row.next_fire_at > timezone.now()
    assert (row.next_fire_at.hour, row.next_fire_at.minute) == (7, 0)
    assert row.paused_at is None
    assert logged("digest") == [ADDITION]
    listed = client.get(PAGE).text
    assert "Admin" in listed


def test_a_name_taken_between_the_check_and_the_save_is_refused_alone(client, monkeypatch):
    # The race: the form was checked, then a worker's sync wrote a code schedule of the
    # same name before the admin's statement ran. The store refuses; the page says so
    # once, with no "added successfully" beside it, and nothing is logged.
    from django_pgqueue.admin.schedule_form import AdminScheduleForm

    checked = AdminScheduleForm._post_clean  # the last check: the model's, names included

    def checked_then_race(self):
        checked(self)
        with transaction.atomic():
            sync_schedules(Job.objects.store(), [schedule("digest", "0 2 * * *")])

    monkeypatch.setattr(AdminScheduleForm, "_post_clean", checked_then_race)
    login(client, superuser=True)
    response = client.post(ADD, form())
    assert response.status_code == 302
    assert response.url == PAGE
    notes = messages_of(response)
    assert any("was not saved" in note for note in notes), notes
    assert not any("successfully" in note for note in notes), notes
    assert Schedule.objects.get(name="digest").source == ScheduleSource.CODE
    assert logged("digest") == []


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"task_path": "tests.tasks.nope"}, "task_path", "nope"),
        ({"task_path": "os.path.join"}, "task_path", "os.path.join"),
        ({"expression": "0 25 * * *"}, "expression", "Bad hour"),
        ({"expression": "@every 0s"}, "expression", "at least one second"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "Europe/Atlantis"),
        ({"args": '{"a": 1}'}, "args", "JSON list"),
        ({"args": "[1,"}, "args", "valid JSON"),
        ({"kwargs": "[1]"}, "kwargs", "JSON object"),
        ({"priority": "500"}, "priority", "between -100 and 100"),
        ({"queue": "nowhere"}, "queue", "nowhere"),
        ({"downtime": "catch_up"}, "catch_up", "catch_up=N"),
        ({"downtime": "catch_up", "catch_up": "101"}, "catch_up", "from 1 to 100"),
        ({"name": "has space"}, "name", "letters"),
        ({"name": "nightly"}, "name", "already exists"),  # a code row has it
        ({"name": "weekly"}, "name", "declared in code"),  # declared, not synced here yet
    ],
)
def test_the_form_checks_the_schedule_as_the_code_is_checked(
    client, code_schedule, overrides, field, message
):
    login(client, superuser=True)
    weekly = {"weekly": {"task": PROBE, "schedule": "@weekly"}}
    with override_settings(PGQUEUE_SCHEDULES=weekly):
        errors = errors_of(client.post(ADD, form(**overrides)))
    assert list(errors) == [field], errors
    assert message in " ".join(errors[field])
    assert not Schedule.objects.filter(source=ScheduleSource.ADMIN).exists()


def test_editing_moves_the_next_fire_only_when_the_timing_changes(client):
    login(client, superuser=True)
    client.post(ADD, form())
    change = url("django_pgqueue_schedule_change", "digest")
    page = client.get(change)
    assert page.status_code == 200
    assert 'name="expression"' in page.text
    assert 'value="pause_schedules"' in page.text  # the actions, as buttons
    before = Schedule.objects.get(name="digest").next_fire_at

    # New arguments, queue and priority: the next fire stays and carries them.
    response = client.post(
        change, change_form("digest", args="[3]", queue="emails", priority="7", kwargs="")
    )
    assert response.status_code == 302, errors_of(response)
    row = Schedule.objects.get(name="digest")
    assert (row.args, row.kwargs, row.queue, row.priority) == ([3], {}, "emails", 7)
    assert row.next_fire_at == before

    # A new time zone: the same 07:00, in Berlin.
    response = client.post(change, change_form("digest", timezone="Europe/Berlin"))
    assert response.status_code == 302, errors_of(response)
    row = Schedule.objects.get(name="digest")
    local = row.next_fire_at.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute, row.timezone) == (7, 0, "Europe/Berlin")

    # A new expression: the next fire moves to its first time after now.
    response = client.post(change, change_form("digest", expression="*/5 * * * *"))
    assert response.status_code == 302, errors_of(response)
    row = Schedule.objects.get(name="digest")
    assert row.next_fire_at - timezone.now() <= timedelta(minutes=5)
    assert row.next_fire_at.minute % 5 == 0
    assert row.description == "Every fifth minute of every hour"
    assert logged("digest") == [ADDITION, CHANGE, CHANGE, CHANGE]

    # Invalid edits change nothing.
    errors = errors_of(client.post(change, change_form("digest", expression="nope")))
    assert list(errors) == ["expression"]
    assert Schedule.objects.get(name="digest").expression == "*/5 * * * *"


def test_deleting_an_admin_schedule_keeps_its_jobs(client):
    login(client, superuser=True)
    client.post(ADD, form())
    delete = url("django_pgqueue_schedule_delete", "digest")
    assert client.get(delete).status_code == 200
    response = client.post(delete, {"post": "yes"})
    assert response.status_code == 302
    assert not Schedule.objects.filter(name="digest").exists()
    assert logged("digest") == [ADDITION, DELETION]
    gone = client.get(url("django_pgqueue_schedule_change", "digest"), follow=True)
    assert "Schedule digest is gone" in " ".join(messages_of(gone))


def test_code_schedules_stay_read_only(client, code_schedule):
    login(client, superuser=True)
    change = url("django_pgqueue_schedule_change", "nightly")
    page = client.get(change)
    assert page.status_code == 200
    assert page.templates[0].name == "django_pgqueue/admin/schedule_detail.html"
    assert 'name="expression"' not in page.text
    assert client.post(change, change_form("nightly", args="[1]")).status_code == 403
    delete = url("django_pgqueue_schedule_delete", "nightly")
    assert client.get(delete).status_code == 403
    assert client.post(delete, {"post": "yes"}).status_code == 403
    row = Schedule.objects.get(name="nightly")
    assert (row.source, row.args) == (ScheduleSource.CODE, [])
    # No bulk delete on the list: it would select schedules of both kinds.
    assert 'value="delete_selected"' not in client.get(PAGE).text


def test_the_actions_apply_to_admin_schedules_too(client):
    login(client, superuser=True)
    client.post(ADD, form())
    page = client.post(
        PAGE, {"action": "pause_schedules", "_selected_action": ["digest"], "index": "0"}
    )
    done = client.post(
        PAGE,
        {
            "action": "pause_schedules",
            "_selected_action": ["digest"],
            "index": "0",
            "confirmed": "yes",
            "requested_at": page.context["requested_at"],
        },
    )
    assert done.status_code == 302
    assert Schedule.objects.get(name="digest").paused_at is not None
    resume = client.get(url("django_pgqueue_schedule_change", "digest")).text
    assert 'value="resume_schedules"' in resume


def test_adding_and_editing_need_their_permissions(client):
    login(client, "view_schedule")
    assert client.get(ADD).status_code == 403
    assert client.post(ADD, form()).status_code == 403
    assert not Schedule.objects.exists()
    client.force_login(make_user("view_schedule", "add_schedule", username="adder"))
    assert client.post(ADD, form()).status_code == 302
    # Without the change permission, its page is the read-only one.
    change = url("django_pgqueue_schedule_change", "digest")
    page = client.get(change)
    assert page.templates[0].name == "django_pgqueue/admin/schedule_detail.html"
    assert client.post(change, change_form("digest", args="[1]")).status_code == 403
    assert client.post(url("django_pgqueue_schedule_delete", "digest")).status_code == 403
    assert Schedule.objects.get(name="digest").args == []
