"""Pausing queues from the lag page: permission, confirmation, log entry, and the badges."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry

from django_pgqueue import pause_queue, paused_queues
from tests.admin_fixtures import enqueue, login, messages_of, url

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

LAG = url("django_pgqueue_lag")
PAUSE = url("django_pgqueue_lag_pause")
RESUME = url("django_pgqueue_lag_resume")


def test_pause_is_confirmed_then_applied_and_logged(client):
    user = login(client, "change_job")
    page = client.get(PAUSE, {"queue": "emails"})
    assert page.status_code == 200
    assert page.templates[0].name == "django_pgqueue/admin/confirm_queue_pause.html"
    assert "Pause queue “emails”?" in page.content.decode()
    assert paused_queues() == {}  # a GET changes nothing
    done = client.post(PAUSE, {"queue": "emails", "confirmed": "yes", "reason": "provider down"})
    assert done.status_code == 302
    assert done.url == LAG
    pause = paused_queues()["emails"]
    assert (pause.paused_by, pause.reason) == (user.get_username(), "provider down")
    entry = LogEntry.objects.get(object_id="emails")
    assert (entry.action_flag, entry.user_id) == (CHANGE, user.pk)
    assert entry.change_message == "Paused from the admin. provider down"
    assert "Queue emails is paused" in " ".join(messages_of(client.get(LAG)))


def test_resume_is_confirmed_then_applied_and_logged(client):
    user = login(client, "change_job")
    pause_queue("emails", by="alice", reason="incident")
    page = client.get(RESUME, {"queue": "emails"})
    assert "Resume queue “emails”?" in page.content.decode()
    assert "by alice" in page.content.decode()
    client.post(RESUME, {"queue": "emails"})  # not confirmed: shows the page again
    assert "emails" in paused_queues()
    done = client.post(RESUME, {"queue": "emails", "confirmed": "yes"})
    assert done.status_code == 302
    assert paused_queues() == {}
    entry = LogEntry.objects.get(object_id="emails")
    assert (entry.user_id, entry.change_message) == (user.pk, "Resumed from the admin.")


def test_viewers_see_the_pause_but_cannot_pause(client):
    login(client, "view_job")
    pause_queue("emails", by="alice", reason="incident 42")
    enqueue(queue="emails")
    page = client.get(LAG).content.decode()
    assert 'id="pgq-paused-banner"' in page
    assert "incident 42" in page
    assert "by alice" in page
    assert 'class="pgq-badge pgq-paused"' in page
    assert "pgq-pause-button" not in page
    inbox = client.get(url("django_pgqueue_job_changelist")).content.decode()
    assert 'id="pgq-paused-banner"' in inbox
    assert "pgq-queue-bar" not in inbox
    assert "pgq-pause-button" not in inbox
    assert client.get(PAUSE, {"queue": "reports"}).status_code == 403
    assert client.post(RESUME, {"queue": "emails", "confirmed": "yes"}).status_code == 403
    assert "emails" in paused_queues()
    assert not LogEntry.objects.exists()


def test_operators_get_buttons_and_unknown_queues_a_message(client):
    login(client, "change_job")
    page = client.get(LAG).content.decode()
    # One button per queue above the table: a click there, a click to confirm.
    assert f'href="{PAUSE}?queue=emails&amp;next=' in page
    assert 'id="pgq-paused-banner"' not in page
    inbox = client.get(url("django_pgqueue_job_changelist")).content.decode()
    assert 'id="pgq-queue-bar"' in inbox
    assert f'href="{PAUSE}?queue=emails&amp;next=' in inbox
    pause_queue("emails")
    page = client.get(LAG).content.decode()
    assert f'href="{PAUSE}?queue=emails&amp;next=' not in page
    assert f"{RESUME}?queue=emails" in page
    inbox = client.get(url("django_pgqueue_job_changelist")).content.decode()
    assert f'href="{PAUSE}?queue=emails&amp;next=' not in inbox  # it has Resume instead
    assert f"{RESUME}?queue=emails" in inbox
    done = client.post(PAUSE, {"queue": "nope", "confirmed": "yes"}, follow=True)
    assert any("'nope' is not one of" in message for message in messages_of(done))
    assert list(paused_queues()) == ["emails"]


def test_a_pause_from_the_inbox_returns_to_the_inbox_and_no_other_site(client):
    login(client, "change_job")
    inbox = url("django_pgqueue_job_changelist") + "?queue=emails"
    done = client.post(PAUSE, {"queue": "emails", "confirmed": "yes", "next": inbox})
    assert done.status_code == 302
    assert done["Location"] == inbox
    assert "emails" in paused_queues()
    elsewhere = client.post(
        RESUME, {"queue": "emails", "confirmed": "yes", "next": "https://evil.example/"}
    )
    assert elsewhere["Location"] == LAG
    assert "emails" not in paused_queues()
