"""Actions racing a worker on the same rows: skipped and reported, never waited on, no 500.

The worker side holds real row locks on its own connection, as a claim or a completion
in progress does, while the admin request runs.
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_pgqueue.exceptions import LeaseLost
from django_pgqueue.models import Job
from django_pgqueue.store.values import Failure, JobSpec
from tests.admin_fixtures import login, messages_of, post_action, url

pytestmark = pytest.mark.timeout(60)

INBOX = url("django_pgqueue_job_changelist")


@pytest.fixture
def operator(client, transactional_db):
    return login(client, superuser=True)


def _state(ids):
    rows = Job.objects.filter(pk__in=ids).values_list(
        "pk", "status", "available_at", "cancel_requested_at"
    )
    return {pk: tuple(rest) for pk, *rest in rows}


def _dead_letters(store, count):
    jobs = store.enqueue_many(
        [JobSpec("tests.tasks.add", max_attempts=1, queue="emails") for _ in range(count)]
    )
    for claimed in store.claim("w", ["emails"], per_queue=count, lease_seconds=30):
        store.fail_if_leased(claimed.lease, Failure("ValueError", "boom"))
    return sorted(outcome.job.pk for outcome in jobs)


@pytest.mark.parametrize(
    ("action", "make"),
    [
        ("retry_now", "dead"),
        ("discard", "dead"),
        ("cancel", "pending"),
        ("cancel", "running"),
        ("run_now", "scheduled"),
        ("requeue_expired", "expired"),
    ],
)
def test_a_row_locked_by_a_worker_is_skipped_and_reported(
    client, operator, make_store, action, make
):
    store = make_store()
    if make == "dead":
        first, locked = _dead_letters(store, 2)
    else:
        later = timezone.now() + dt.timedelta(days=1) if make == "scheduled" else None
        first, locked = (
            outcome.job.pk
            for outcome in store.enqueue_many(
                [JobSpec("tests.tasks.add", available_at=later) for _ in range(2)]
            )
        )
        if make in ("expired", "running"):
            store.claim("w", ["default"], per_queue=2, lease_seconds=30)
        if make == "expired":
            store.runner.connection.execute(
                "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second'"
            )
    before = _state([first, locked])

    worker = make_store().runner.connection
    worker.execute("BEGIN")
    worker.execute("SELECT id FROM django_pgqueue_job WHERE id = %s FOR UPDATE", [locked])
    # A dead letter is in the history tier.
    worker.execute("SELECT id FROM django_pgqueue_job_history WHERE id = %s FOR UPDATE", [locked])
    try:
        response = post_action(client, INBOX, action, [first, locked])
    finally:
        worker.execute("ROLLBACK")

    assert response.status_code == 302
    after = _state([first, locked])
    assert after.get(locked) == before[locked]  # untouched
    assert after.get(first) != before[first]  # done
    # After the report of what was done (and, for a cancel of a running job, the note
    # that it was asked to stop), what was skipped.
    skipped = messages_of(response)[2 if make == "running" else 1]
    # Cancel and retry try a locked row again for about a second, then name it apart: a
    # lock that outlasts that is an open transaction (a running atomic task's, say).
    expected = (
        "Not changed, locked by an open transaction"
        if action in ("cancel", "retry_now")
        else "Skipped 1 job"
    )
    assert skipped.startswith(expected)
    assert f"#{locked}" in skipped

    # Once the worker let go, the same action applies.
    response = post_action(client, INBOX, action, [locked])
    assert _state([locked]).get(locked) != before[locked]


def test_a_late_completion_after_an_admin_retry_is_fenced(client, operator, store):
    # The worker that held the job before it was dead-lettered and retried has lost its
    # lease: its late completion changes nothing.
    job = store.enqueue(JobSpec("tests.tasks.add", max_attempts=2)).job
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    store.fail_if_leased(claimed.lease, Failure("ValueError", "boom", permanent=True))
    post_action(client, INBOX, "retry_now", [job.pk])
    with pytest.raises(LeaseLost):
        store.complete_if_leased(claimed.lease, "1")
    assert Job.objects.get(pk=job.pk).status == "pending"
