"""Operator actions: confirmation with a count, the manager's effect, report, admin log."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.utils import timezone

from django_pgqueue.models import Job
from tests.admin_fixtures import (
    cancelled,
    dead_letter,
    enqueue,
    login,
    messages_of,
    post_action,
    running,
    scheduled,
    statuses,
    succeeded,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

INBOX = url("django_pgqueue_job_changelist")


@pytest.fixture
def operator(client):
    return login(client, superuser=True)


def _log(job_ids):
    content_type = ContentType.objects.get_for_model(Job)
    return dict(
        LogEntry.objects.filter(
            content_type=content_type, object_id__in=[str(i) for i in job_ids]
        ).values_list("object_id", "action_flag")
    )


def test_confirmation_page_shows_the_count_and_changes_nothing(client, operator):
    dead = [dead_letter().pk, dead_letter().pk]
    response = post_action(client, INBOX, "retry_now", dead, confirmed=False)
    assert response.status_code == 200
    assert response.templates[0].name == "django_pgqueue/admin/confirm_action.html"
    assert "the 2 selected jobs" in response.text
    assert 'name="confirmed" value="yes"' in response.text
    assert statuses(dead) == dict.fromkeys(dead, "dead_letter")
    assert not _log(dead)


def test_retry_now_revives_dead_letters_and_cancelled_jobs(client, operator):
    dead, withdrawn, done = dead_letter(), cancelled(), succeeded()
    ids = [dead.pk, withdrawn.pk, done.pk]
    response = post_action(client, INBOX, "retry_now", ids)
    assert response.status_code == 302
    assert statuses(ids) == {dead.pk: "pending", withdrawn.pk: "pending", done.pk: "succeeded"}
    revived = Job.objects.get(pk=dead.pk)
    assert revived.attempts == 0
    assert len(revived.errors) == 1  # the history stays
    messages = messages_of(response)
    assert messages[0] == "Retried 2 jobs."
    assert "Skipped 1 job (not dead-lettered or cancelled" in messages[1]
    assert f"#{done.pk}" in messages[1]
    assert _log(ids) == {str(dead.pk): CHANGE, str(withdrawn.pk): CHANGE}


def test_run_now_makes_scheduled_jobs_ready(client, operator):
    later, ready = scheduled(), enqueue()
    response = post_action(client, INBOX, "run_now", [later.pk, ready.pk])
    assert messages_of(response)[0] == "Made 1 job ready now."
    assert "Skipped 1 job" in messages_of(response)[1]
    ready_before = ready.available_at
    later.refresh_from_db()
    ready.refresh_from_db()
    assert later.available_at <= timezone.now()
    assert ready.available_at == ready_before
    assert list(_log([later.pk, ready.pk])) == [str(later.pk)]


def test_cancel_pending_and_running_jobs_but_not_finished_ones(client, operator):
    pending, live, done = enqueue(), running(queue="emails"), succeeded()
    ids = [pending.pk, live.pk, done.pk]
    response = post_action(client, INBOX, "cancel", ids, confirmed=False)
    assert "Running jobs are asked to stop" in response.text
    response = post_action(client, INBOX, "cancel", ids)
    # The running one stays processing until its handler returns: nothing starts in its
    # place meanwhile.
    assert statuses(ids) == {pending.pk: "cancelled", live.pk: "processing", done.pk: "succeeded"}
    stopped = Job.objects.get(pk=live.pk)
    assert stopped.lease_generation == live.lease_generation
    assert stopped.cancel_requested_at is not None
    assert stopped.last_error == "cancelled from the admin"
    messages = messages_of(response)
    assert messages[0] == "Cancelled 2 jobs."
    assert messages[1] == (
        f"#{live.pk} was running: its handler was asked to stop, and it ends cancelled when "
        "the handler returns (it keeps its slot until then)."
    )
    assert messages[2] == f"Skipped 1 job (already finished): #{done.pk}."
    assert _log(ids) == {str(pending.pk): CHANGE, str(live.pk): CHANGE}


def test_requeue_expired_leases_only(client, operator):
    stuck, live = running(expired=True), running(queue="emails")
    response = post_action(client, INBOX, "requeue_expired", [stuck.pk, live.pk])
    assert statuses([stuck.pk, live.pk]) == {stuck.pk: "pending", live.pk: "processing"}
    assert messages_of(response)[0] == "Requeued 1 job."
    assert Job.objects.get(pk=stuck.pk).lease_expires_at is None


def test_discard_deletes_finished_jobs_only(client, operator):
    dead, done, pending = dead_letter(), succeeded(), enqueue()
    ids = [dead.pk, done.pk, pending.pk]
    response = post_action(client, INBOX, "discard", ids)
    assert statuses(ids) == {pending.pk: "pending"}
    assert messages_of(response)[0] == "Discarded 2 jobs."
    assert _log(ids) == {str(dead.pk): DELETION, str(done.pk): DELETION}


def test_the_job_history_shows_who_did_what(client, operator):
    dead = dead_letter()
    post_action(client, url("django_pgqueue_deadletter_changelist"), "retry_now", [dead.pk])
    detail = client.get(url("django_pgqueue_job_change", dead.pk))
    history = client.get(detail.context["history_url"])
    assert history.status_code == 200
    assert "Retried now from the admin" in history.text
    assert operator.username in history.text
    # And the admin's "Recent actions" links to the job.
    index = client.get(url("index"))
    assert f'href="{url("django_pgqueue_job_change", dead.pk)}"' in index.text


def test_select_across_acts_on_the_whole_filtered_set_in_chunks(client, operator, monkeypatch):
    from django_pgqueue.admin import actions

    monkeypatch.setattr(actions, "OPERATOR_CHUNK", 7)  # many chunks from few jobs
    dead = [dead_letter(queue="emails").pk for _ in range(60)]
    other = dead_letter(queue="reports").pk
    pending = enqueue(queue="emails").pk
    filtered = url("django_pgqueue_job_changelist", queue="emails")
    response = post_action(
        client, filtered, "retry_now", [dead[0]], confirmed=False, select_across=True
    )
    assert "will go through 60 jobs" in response.text  # the eligible ones, not one page
    response = post_action(client, filtered, "retry_now", [dead[0]], select_across=True)
    assert messages_of(response) == ["Retried 60 jobs."]
    assert set(statuses(dead).values()) == {"pending"}
    assert statuses([other, pending]) == {other: "dead_letter", pending: "pending"}
    assert len(_log(dead)) == 60


def test_actions_come_back_to_the_job_page_when_asked(client, operator):
    dead = dead_letter()
    detail = url("django_pgqueue_job_change", dead.pk)
    response = post_action(client, INBOX, "retry_now", [dead.pk], _return_to=detail)
    assert response.status_code == 302
    assert response["Location"] == detail
    # Only to pages of this site.
    other = dead_letter()
    response = post_action(
        client, INBOX, "retry_now", [other.pk], _return_to="https://evil.example/"
    )
    assert response["Location"] == INBOX


def test_nothing_selected_changes_nothing(client, operator):
    dead = dead_letter()
    response = post_action(client, INBOX, "retry_now", [], follow=True)
    assert "Items must be selected" in response.text
    assert statuses([dead.pk]) == {dead.pk: "dead_letter"}
