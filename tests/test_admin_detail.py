"""The job page: read-only, payloads and errors shown escaped, timeline, partition, actions."""

from __future__ import annotations

import json
from functools import partial

import pytest

from django_pgqueue.models import Job
from django_pgqueue.store.values import Failure
from tests.admin_fixtures import (
    CHANGE,
    ESCAPED_SCRIPT,
    SCRIPT,
    VIEW,
    claim,
    dead_letter,
    enqueue,
    login,
    running,
    scheduled,
    store,
    succeeded,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]


def detail(job_id):
    return url("django_pgqueue_job_change", job_id)


def test_shows_payloads_pretty_printed(client):
    login(client, superuser=True)
    job = succeeded(args=[1, {"b": [2, 3]}], kwargs={"x": "y"}, result={"total": 5})
    response = client.get(detail(job.pk))
    assert response.status_code == 200
    text = response.text
    assert json.dumps([1, {"b": [2, 3]}], indent=2, sort_keys=True).replace('"', "&quot;") in text
    assert "&quot;total&quot;: 5" in text
    assert "lease generation" in text
    assert "first started" in text
    assert "finished" in text


def test_html_in_payloads_and_errors_is_escaped(client):
    login(client, superuser=True)
    dead = dead_letter(
        SCRIPT,
        args=[SCRIPT],
        kwargs={"html": SCRIPT},
        partition_key=SCRIPT,
        error_class=SCRIPT,
        message=SCRIPT,
        traceback=f"Traceback\n{SCRIPT}",
    )
    done = succeeded(result={"html": SCRIPT})
    for job in (dead, done):
        response = client.get(detail(job.pk))
        assert response.status_code == 200
        assert "<script>alert" not in response.text
        assert ESCAPED_SCRIPT in response.text
    # Every place the dead letter's script appears, escaped: task, key, args, errors.
    assert client.get(detail(dead.pk)).text.count(ESCAPED_SCRIPT) >= 7


def test_full_error_history_with_a_traceback_per_attempt(client):
    login(client, superuser=True)
    job = enqueue("tests.tasks.always_fails", max_attempts=3)
    for attempt in (1, 2):
        lease = claim(job, worker_id=f"web-{attempt}:1").lease
        store().fail_if_leased(
            lease, Failure("ValueError", f"failure {attempt}", f"Traceback of attempt {attempt}")
        )
        assert store().run_now([job.pk]).done == (job.pk,)  # skip the backoff
    response = client.get(detail(job.pk))
    text = response.text
    for attempt in (1, 2):
        assert f"Traceback of attempt {attempt}" in text
        assert f"failure {attempt}" in text
        assert f"web-{attempt}:1" in text
        assert f"attempt {attempt} failed" in text


def test_read_only_no_form_and_post_is_refused(client):
    login(client, superuser=True)
    job = enqueue()
    response = client.get(detail(job.pk))
    assert "<form" not in response.text.split('id="content-main"')[1].split("pgq-operations")[0]
    assert 'name="_save"' not in response.text
    assert client.post(detail(job.pk), {"status": "succeeded"}).status_code == 405
    assert Job.objects.get(pk=job.pk).status == "pending"
    assert client.get(url("django_pgqueue_job_add")).status_code == 403
    assert client.get(url("django_pgqueue_job_delete", job.pk)).status_code == 403
    assert client.post(url("django_pgqueue_job_delete", job.pk), {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()


def test_missing_job_redirects_with_a_message(client):
    login(client, superuser=True)
    response = client.get(detail(10**12), follow=True)
    assert response.status_code == 200
    assert "may have been discarded or retried" in response.text


@pytest.mark.parametrize(
    ("make", "buttons"),
    [
        (dead_letter, {"retry_now", "discard"}),
        (succeeded, {"discard"}),
        (scheduled, {"run_now", "cancel"}),
        (enqueue, {"cancel"}),
        (running, {"cancel"}),
        (partial(running, expired=True), {"requeue_expired", "cancel"}),
    ],
)
def test_buttons_for_the_actions_that_apply(client, make, buttons):
    login(client, superuser=True)
    job = make()
    response = client.get(detail(job.pk))
    assert {operation.name for operation in response.context["operations"]} == buttons


@pytest.mark.parametrize(("permissions", "buttons"), [(CHANGE, ["retry_now"]), (VIEW, [])])
def test_buttons_follow_permissions(client, permissions, buttons):
    job = dead_letter()
    login(client, *permissions)
    response = client.get(detail(job.pk))
    assert response.status_code == 200
    assert [o.name for o in response.context["operations"]] == buttons


def test_partition_blocker_and_waiting_jobs(client):
    login(client, superuser=True)
    first = enqueue(partition_key="tenant-1")
    second = enqueue(partition_key="tenant-1")
    third = enqueue(partition_key="tenant-1")
    response = client.get(detail(second.pk))
    assert response.context["blocker"].job_id == first.pk
    assert response.context["waiting"] == [third.pk]
    # Once the head runs, it holds up every pending job of the partition.
    claim(first)
    response = client.get(detail(first.pk))
    assert response.context["waiting"] == [second.pk, third.pk]
    response = client.get(detail(second.pk))
    assert response.context["blocker"].job_id == first.pk
    assert response.context["blocker"].status == "processing"


def test_dead_letter_page_detail_uses_its_own_admin(client):
    login(client, superuser=True)
    dead = dead_letter()
    response = client.get(url("django_pgqueue_deadletter_change", dead.pk))
    assert response.status_code == 200
    assert response.context["changelist_url"] == url("django_pgqueue_deadletter_changelist")
    # Not a dead letter: not on the dead-letter page, but on its own in the inbox.
    pending = enqueue()
    response = client.get(url("django_pgqueue_deadletter_change", pending.pk), follow=True)
    assert response.redirect_chain[-1][0] == url("django_pgqueue_job_change", pending.pk)
    assert "is no longer a dead letter" in response.text


def test_a_running_job_whose_cancel_was_requested_says_it_is_cancelling(client):
    login(client, superuser=True)
    job = running()
    assert "pgq-cancelling" not in client.get(detail(job.pk)).text
    Job.objects.cancel([job.pk])
    text = client.get(detail(job.pk)).text
    assert 'id="pgq-cancelling"' in text
    assert "keeps its lease, its slot and its partition" in text
