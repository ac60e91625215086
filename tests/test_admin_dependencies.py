"""The admin and dependencies: job page edges, lag page blocked count, dead letters revive."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import Failure
from tests.admin_fixtures import claim, enqueue, login, post_action, row_ids, store, url

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]


def _failed_blocker_with_dependents():
    blocker = enqueue(max_attempts=1, available_at=timezone.now() - dt.timedelta(days=365))
    first = enqueue("tests.tasks.noop", after=[blocker.pk])
    second = enqueue("tests.tasks.noop", after=[first.pk])
    store().fail_if_leased(claim(blocker).lease, Failure("ValueError", "boom"))
    return blocker, first, second


def test_the_job_page_shows_what_it_runs_after_and_what_waits_for_it(client):
    login(client, superuser=True)
    blocker = enqueue()
    dependent = enqueue("tests.tasks.noop", after=[blocker.pk])
    page = client.get(url("django_pgqueue_job_change", dependent.pk)).text
    assert 'id="pgq-runs-after"' in page
    assert f"/django_pgqueue/job/{blocker.pk}/" in page
    assert "pgq-status-pending" in page  # the blocker's status
    assert "pgq-status-blocked" in page  # its own
    page = client.get(url("django_pgqueue_job_change", blocker.pk)).text
    assert 'id="pgq-runs-before"' in page
    assert f"/django_pgqueue/job/{dependent.pk}/" in page
    plain = enqueue()
    assert "pgq-runs" not in client.get(url("django_pgqueue_job_change", plain.pk)).text


def test_the_lag_page_counts_blocked_jobs_apart(client):
    login(client, superuser=True)
    blocker = enqueue()
    for _ in range(3):
        enqueue("tests.tasks.noop", after=[blocker.pk])
    page = client.get(url("django_pgqueue_lag")).text
    assert 'class="pgq-number pgq-blocked"' in page
    assert "status=blocked" in page
    assert row_ids(client.get(url("django_pgqueue_job_changelist", status="blocked"))) != []


def test_the_dead_letter_page_shows_and_revives_cancelled_dependents(client):
    login(client, superuser=True)
    blocker, first, second = _failed_blocker_with_dependents()
    assert Job.objects.get(pk=second.pk).status == JobStatus.CANCELLED
    listing = client.get(url("django_pgqueue_deadletter_changelist")).text
    assert "1 cancelled" in listing
    path = url("django_pgqueue_deadletter_changelist")
    confirm = post_action(client, path, "retry_now", [blocker.pk], confirmed=False).text
    assert 'id="pgq-cancelled-dependents"' in confirm
    assert "Retry and revive dependents" in confirm
    post_action(client, path, "retry_and_revive", [blocker.pk])
    assert Job.objects.get(pk=blocker.pk).status == JobStatus.PENDING
    assert Job.objects.get(pk=first.pk).status == JobStatus.BLOCKED
    assert Job.objects.get(pk=second.pk).status == JobStatus.BLOCKED
