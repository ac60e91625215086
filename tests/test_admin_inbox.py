"""The inbox: every job, its columns, filters, exact search and cheap counts."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.utils import timezone

from django_pgqueue.admin import pagination
from django_pgqueue.admin.jobs import ERROR_EXCERPT
from django_pgqueue.store.values import Failure
from tests.admin_fixtures import (
    ESCAPED_SCRIPT,
    SCRIPT,
    VIEW,
    cancelled,
    claim,
    dead_letter,
    enqueue,
    login,
    row_cells,
    row_ids,
    running,
    scheduled,
    store,
    succeeded,
    text_of,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

INBOX = "django_pgqueue_job_changelist"


@pytest.fixture
def jobs(client):
    """One job in every state, a superuser logged in."""
    login(client, superuser=True)
    dead = dead_letter("tests.tasks.always_fails", queue="emails")
    done = succeeded(queue="reports", result=5)
    stuck = running(expired=True, queue="high")
    live = running(queue="low")
    later = scheduled(partition_key="customer-7")
    ready = enqueue(idempotency_key="order-42")
    withdrawn = cancelled(queue="reports")
    return {
        "dead": dead.pk,
        "done": done.pk,
        "stuck": stuck.pk,
        "live": live.pk,
        "later": later.pk,
        "ready": ready.pk,
        "cancelled": withdrawn.pk,
    }


def test_lists_every_job_newest_first_with_its_columns(client, jobs):
    response = client.get(url(INBOX))
    assert response.status_code == 200
    assert row_ids(response) == sorted(jobs.values(), reverse=True)
    # What an on-call engineer needs, one short line each; the rest is on the job's page.
    columns = [c for c in response.context["cl"].list_display if c != "action_checkbox"]
    assert columns == ["id", "task", "status_display", "queue_name", "when", "error"]
    rows = row_cells(response)
    dead = rows[jobs["dead"]]
    # The function's name first, whole; the module after it, cut where narrow.
    assert text_of(dead["task"]) == "always_fails tests.tasks"
    assert 'title="tests.tasks.always_fails"' in dead["task"]
    assert text_of(dead["status_display"]) == "Dead letter"
    assert text_of(dead["queue_name"]) == "emails"
    assert text_of(dead["error"]) == "ValueError boom"
    assert "Queue lag" in response.text  # link to the lag page


# Each row's "when" is the moment that matters for its status, as a compact age whose
# tooltip names that moment and gives it to the second.
@pytest.mark.parametrize(
    ("job", "age", "label"),
    [
        ("dead", r"\d+s", "finished at"),
        ("done", r"\d+s", "finished at"),
        ("ready", r"\d+s", "ready since"),
        ("later", r"in 23h", "scheduled for"),
        ("live", r"\d+s", "claimed at"),
        ("stuck", r"1m", "lease expired at"),
        ("cancelled", r"\d+s", "finished at"),
    ],
)
def test_when_is_a_compact_age_with_the_exact_time_on_hover(client, jobs, job, age, label):
    cell = row_cells(client.get(url(INBOX)))[jobs[job]]["when"]
    match = re.search(r'<time datetime="[^"]+" title="([^"]+)">([^<]+)</time>', cell)
    assert match, cell
    title, text = match.groups()
    assert re.fullmatch(age, text), text
    assert re.fullmatch(rf"{label}: \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \w+", title), title
    assert ("pgq-expired" in cell) == (job == "stuck")


def test_a_retrying_job_shows_its_attempts_and_last_error(client):
    login(client, superuser=True)
    job = enqueue(max_attempts=3, available_at=timezone.now() - dt.timedelta(days=1))
    store().fail_if_leased(
        claim(job).lease, Failure("requests.exceptions.ReadTimeout", "api.example.com", "tb")
    )
    row = row_cells(client.get(url(INBOX)))[job.pk]
    assert text_of(row["status_display"]) == "Pending 1/3"
    # The class without its module leaves the width to the message; the tooltip has both.
    assert text_of(row["error"]) == "ReadTimeout api.example.com"
    assert 'title="requests.exceptions.ReadTimeout: api.example.com"' in row["error"]
    # Read from the database: only the start of a long message is.
    store().run_now([job.pk])
    long_message = "x" * 5000
    store().fail_if_leased(claim(job).lease, Failure("ValueError", long_message, "tb"))
    row = row_cells(client.get(url(INBOX)))[job.pk]
    assert text_of(row["error"]) == "ValueError " + "x" * ERROR_EXCERPT
    # Succeeding in the end leaves the error on the job's page, not in the listing.
    store().run_now([job.pk])
    store().complete_if_leased(claim(job).lease, "null")
    row = row_cells(client.get(url(INBOX)))[job.pk]
    assert text_of(row["status_display"]) == "Succeeded"
    assert row["error"] == ""


def test_no_error_is_an_empty_cell(client, jobs):
    rows = row_cells(client.get(url(INBOX)))
    assert rows[jobs["done"]]["error"] == ""
    assert rows[jobs["ready"]]["error"] == ""


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("pending", {"later", "ready"}),
        ("ready", {"ready"}),
        ("scheduled", {"later"}),
        ("processing", {"stuck", "live"}),
        ("expired", {"stuck"}),
        ("succeeded", {"done"}),
        ("dead_letter", {"dead"}),
        ("cancelled", {"cancelled"}),
        ("nonsense", set()),
    ],
)
def test_status_filter(client, jobs, status, expected):
    response = client.get(url(INBOX, status=status))
    assert response.status_code == 200
    assert set(row_ids(response)) == {jobs[name] for name in expected}


def test_queue_filter_lists_known_queues_and_filters(client, jobs):
    response = client.get(url(INBOX, queue="reports"))
    assert set(row_ids(response)) == {jobs["done"], jobs["cancelled"]}
    for queue in ("default", "emails", "reports", "high", "low"):
        assert f"?queue={queue}" in response.text


def test_task_and_partition_key_filters_match_exactly(client, jobs):
    response = client.get(url(INBOX, task="tests.tasks.always_fails"))
    assert row_ids(response) == [jobs["dead"]]
    assert not row_ids(client.get(url(INBOX, task="tests.tasks")))
    response = client.get(url(INBOX, partition_key="customer-7"))
    assert row_ids(response) == [jobs["later"]]
    # The text box keeps the other filters of the page.
    response = client.get(url(INBOX, partition_key="customer-7", status="pending"))
    assert 'type="hidden" name="status" value="pending"' in response.text


@pytest.mark.parametrize("term", ["{ready}", "#{ready}", "order-42"])
def test_search_by_id_or_idempotency_key(client, jobs, term):
    response = client.get(url(INBOX, q=term.format(**jobs)))
    assert row_ids(response) == [jobs["ready"]]


def test_search_by_partition_key_and_nothing_fuzzy(client, jobs):
    assert row_ids(client.get(url(INBOX, q="customer-7"))) == [jobs["later"]]
    assert row_ids(client.get(url(INBOX, q="order"))) == []
    assert row_ids(client.get(url(INBOX, q="99999999999999999999999"))) == []


def _range(field, start, end):
    return {
        f"{field}__range__gte_0": start.strftime("%Y-%m-%d"),
        f"{field}__range__gte_1": start.strftime("%H:%M:%S"),
        f"{field}__range__lte_0": end.strftime("%Y-%m-%d"),
        f"{field}__range__lte_1": end.strftime("%H:%M:%S"),
    }


def test_created_range_filter(client, jobs):
    now = timezone.now()
    recent = _range("created_at", now - dt.timedelta(hours=1), now + dt.timedelta(hours=1))
    assert set(row_ids(client.get(url(INBOX, **recent)))) == set(jobs.values())
    old = _range("created_at", now - dt.timedelta(days=3), now - dt.timedelta(days=2))
    assert row_ids(client.get(url(INBOX, **old))) == []


def test_available_range_filter(client, jobs):
    now = timezone.now()
    tomorrow = _range("available_at", now + dt.timedelta(hours=20), now + dt.timedelta(hours=30))
    assert row_ids(client.get(url(INBOX, **tomorrow))) == [jobs["later"]]


def test_finished_range_filter_lists_finished_jobs_by_finish_time(client, jobs):
    now = timezone.now()
    window = _range("finished_at", now - dt.timedelta(hours=1), now + dt.timedelta(hours=1))
    response = client.get(url(INBOX, **window))
    # Ordered by finished_at, newest first. The fixtures run in one transaction, where
    # now() stands still: the cancelled and dead jobs tie (newest id first), and the
    # succeeded job's finish is its real clock time (clock_timestamp()), later than both.
    assert row_ids(response) == [jobs["done"], jobs["cancelled"], jobs["dead"]]


def test_payload_text_in_the_listing_is_escaped(client):
    login(client, superuser=True)
    enqueue(SCRIPT, partition_key=SCRIPT)
    response = client.get(url(INBOX))
    assert SCRIPT not in response.text
    assert ESCAPED_SCRIPT in response.text


def test_large_counts_are_estimated_and_small_ones_exact(client, jobs, monkeypatch):
    response = client.get(url(INBOX, status="pending"))
    assert "about" not in response.text
    assert response.context["cl"].result_count == 2
    monkeypatch.setattr(pagination, "EXACT_LIMIT", 1)
    monkeypatch.setattr(
        pagination.EstimatedCountPaginator,
        "row_count",
        property(lambda self: pagination.count_rows(self.object_list, exact_limit=1)),
    )
    response = client.get(url(INBOX))
    assert response.context["cl"].paginator.estimated
    assert "(estimated)" in response.text


def test_view_only_users_see_the_inbox_without_actions(client, jobs):
    client.logout()
    login(client, *VIEW)
    response = client.get(url(INBOX))
    assert response.status_code == 200
    assert set(row_ids(response)) == set(jobs.values())
    assert 'name="action"' not in response.text
