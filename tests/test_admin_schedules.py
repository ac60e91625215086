"""The Schedules admin page: timing in words, last fire's job, pause/resume/run now."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.db import transaction
from django.db.models.functions import TruncMinute
from django.utils import timezone

from django_pgqueue.features.scheduling import fire_due, sync_schedules
from django_pgqueue.models import Job, Schedule
from tests.admin_fixtures import login, messages_of, url
from tests.schedules import schedule

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

PAGE = url("django_pgqueue_schedule_changelist")


@pytest.fixture
def schedules():
    store = Job.objects.store()
    with transaction.atomic():
        sync_schedules(
            store,
            [
                schedule("nightly", "0 2 * * *", timezone="Europe/Berlin"),
                schedule("minutely", "* * * * *", downtime="catch_up", catch_up=3),
            ],
        )
    return store


def post(client, action, names, **extra):
    return client.post(PAGE, {"action": action, "_selected_action": names, "index": "0", **extra})


def confirm(client, action, names):
    """Post the action, then the confirmation page's form as a browser would."""
    page = post(client, action, names)
    assert page.status_code == 200
    assert page.templates[0].name == "django_pgqueue/admin/confirm_schedule_action.html"
    requested_at = page.context["requested_at"]
    return post(client, action, names, confirmed="yes", requested_at=requested_at), requested_at


def logged(name):
    return list(
        LogEntry.objects.filter(object_id=name)
        .order_by("id")
        .values_list("action_flag", "change_message")
    )


def test_the_page_lists_schedules_in_words_with_last_fire_linked(client, schedules):
    login(client, superuser=True)
    Schedule.objects.filter(name="minutely").update(next_fire_at=TruncMinute(timezone.now()))
    fire_due(schedules)
    job = Job.objects.get(idempotency_key__startswith="pgqueue:schedule:minutely:")
    response = client.get(PAGE)
    assert response.status_code == 200
    text = response.text
    assert "<title>Schedules |" in text  # not "Select schedule to change"
    assert "At 02:00 every day" in text
    assert "02:00:00 Europe/Berlin" in text  # the next fire, in the schedule's zone
    assert url("django_pgqueue_job_change", job.pk) in text
    assert "pgq-status-pending" in text
    assert text.count("Active") >= 2
    # A schedule's page: every detail, the times as on the list, and its actions.
    nightly = client.get(url("django_pgqueue_schedule_change", "nightly")).text
    assert "02:00:00 Europe/Berlin" in nightly
    assert "fire the latest missed once" in nightly
    assert 'value="pause_schedules"' in nightly
    assert 'value="run_schedules_now"' in nightly
    assert 'value="resume_schedules"' not in nightly  # it is not paused
    minutely = client.get(url("django_pgqueue_schedule_change", "minutely")).text
    assert "catch up at most 3" in minutely
    assert url("django_pgqueue_job_change", job.pk) in minutely


def test_pause_and_resume_are_confirmed_fenced_and_logged(client, schedules):
    login(client, superuser=True)
    page = post(client, "pause_schedules", ["nightly"])
    assert "will go through the 1 selected schedule" in page.text
    assert Schedule.objects.get(name="nightly").paused_at is None  # nothing yet
    response, _ = confirm(client, "pause_schedules", ["nightly"])
    assert response.status_code == 302
    assert Schedule.objects.get(name="nightly").paused_at is not None
    assert logged("nightly") == [(CHANGE, "Paused from the admin.")]
    again, _ = confirm(client, "pause_schedules", ["nightly", "minutely"])
    assert messages_of(again)[-2:] == [
        "Pause: 1 schedule (minutely).",
        "Left as they were (already in that state, or gone): nightly.",
    ]
    assert "Paused" in client.get(PAGE).text
    # Resume: from the next fire after now, not the missed ones.
    Schedule.objects.filter(name="nightly").update(next_fire_at=timezone.now() - timedelta(days=3))
    confirm(client, "resume_schedules", ["nightly"])
    resumed = Schedule.objects.get(name="nightly")
    assert resumed.paused_at is None
    assert resumed.next_fire_at > timezone.now()
    assert logged("nightly")[-1] == (CHANGE, "Resumed from the admin.")


def test_run_now_enqueues_once_even_if_the_confirmation_is_submitted_twice(client, schedules):
    login(client, superuser=True)
    response, requested_at = confirm(client, "run_schedules_now", ["nightly"])
    assert response.status_code == 302
    twice = post(
        client, "run_schedules_now", ["nightly"], confirmed="yes", requested_at=requested_at
    )
    assert twice.status_code == 302
    jobs = Job.objects.filter(idempotency_key__startswith="pgqueue:schedule:nightly:run-now:")
    assert jobs.count() == 1
    assert Schedule.objects.get(name="nightly").last_fire_at is None  # timetable unchanged
    assert logged("nightly") == [(CHANGE, "Run now from the admin.")]


def test_actions_need_the_change_permission_and_the_form_edits_nothing(client, schedules):
    login(client, "view_schedule")
    assert client.get(PAGE).status_code == 200
    response = post(
        client,
        "pause_schedules",
        ["nightly"],
        confirmed="yes",
        requested_at=timezone.now().isoformat(),
    )
    assert Schedule.objects.get(name="nightly").paused_at is None
    assert response.status_code in {200, 302}
    change = client.post(url("django_pgqueue_schedule_change", "nightly"), {"queue": "x"})
    assert change.status_code == 403
    assert Schedule.objects.get(name="nightly").queue == "default"


def test_a_scheduled_job_page_names_its_schedule_and_fire_time(client, schedules):
    login(client, superuser=True)
    Schedule.objects.filter(name="minutely").update(next_fire_at=TruncMinute(timezone.now()))
    fire_due(schedules)
    job = Job.objects.get(idempotency_key__startswith="pgqueue:schedule:minutely:")
    fire_time = Schedule.objects.get(name="minutely").last_fire_at
    page = client.get(url("django_pgqueue_job_change", job.pk))
    assert page.status_code == 200
    assert f"{PAGE}?q=minutely" in page.text
    assert f'<time datetime="{fire_time.isoformat()}">' in page.text
    listed = client.get(PAGE, {"q": "minutely"})
    assert listed.status_code == 200
    assert "nightly" not in listed.text.split("result_list")[-1]


def test_the_pause_button_of_a_schedules_page_leads_to_the_confirmation(client, schedules):
    login(client, superuser=True)
    page = client.get(url("django_pgqueue_schedule_change", "nightly"))
    assert page.status_code == 200
    # What the page's "Pause…" button posts: the confirmation page comes next.
    confirm_page = client.post(
        PAGE, {"action": "pause_schedules", "_selected_action": "nightly", "index": "0"}
    )
    assert confirm_page.templates[0].name == "django_pgqueue/admin/confirm_schedule_action.html"
    done, _ = confirm(client, "pause_schedules", ["nightly"])
    assert done.status_code == 302
    assert Schedule.objects.get(name="nightly").paused_at is not None
    paused = client.get(url("django_pgqueue_schedule_change", "nightly")).text
    assert 'value="resume_schedules"' in paused
    assert 'value="pause_schedules"' not in paused
