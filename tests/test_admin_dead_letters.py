"""The dead letters: only dead letters, grouped by task and error, retried or discarded by group."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.utils import timezone

from tests.admin_fixtures import (
    ESCAPED_SCRIPT,
    SCRIPT,
    dead_letter,
    enqueue,
    login,
    messages_of,
    post_action,
    row_ids,
    statuses,
    succeeded,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

LISTING = "django_pgqueue_deadletter_changelist"
GROUPS = "django_pgqueue_deadletter_groups"


@pytest.fixture
def failures(client):
    login(client, superuser=True)
    timeouts = [
        dead_letter("shop.sync", error_class="TimeoutError", message=f"slow {n}").pk
        for n in range(3)
    ]
    declined = dead_letter("shop.charge", error_class="CardDeclined", queue="emails").pk
    sync_declined = dead_letter("shop.sync", error_class="CardDeclined").pk
    return {"timeouts": timeouts, "declined": declined, "sync_declined": sync_declined}


def test_lists_dead_letters_only(client, failures):
    enqueue()
    succeeded()
    response = client.get(url(LISTING))
    assert response.status_code == 200
    expected = [*failures["timeouts"], failures["declined"], failures["sync_declined"]]
    assert row_ids(response) == sorted(expected, reverse=True)
    assert "TimeoutError" in response.text
    assert "slow 2" in response.text


def test_filters_by_queue_task_and_error_class(client, failures):
    assert row_ids(client.get(url(LISTING, queue="emails"))) == [failures["declined"]]
    assert row_ids(client.get(url(LISTING, task="shop.charge"))) == [failures["declined"]]
    response = client.get(url(LISTING, task="shop.sync", error_class="CardDeclined"))
    assert row_ids(response) == [failures["sync_declined"]]


def test_time_range_filters(client, failures):
    now = timezone.now()
    today = {
        f"{field}__range__{end}_{part}": moment.strftime(fmt)
        for field in ("finished_at", "created_at")
        for end, moment in (
            ("gte", now - dt.timedelta(hours=1)),
            ("lte", now + dt.timedelta(hours=1)),
        )
        for part, fmt in ((0, "%Y-%m-%d"), (1, "%H:%M:%S"))
    }
    assert len(row_ids(client.get(url(LISTING, **today)))) == 5
    last_year = {
        "finished_at__range__lte_0": (now - dt.timedelta(days=365)).strftime("%Y-%m-%d"),
        "finished_at__range__lte_1": "00:00:00",
    }
    assert row_ids(client.get(url(LISTING, **last_year))) == []


def test_groups_by_task_and_error_class_largest_first(client, failures):
    response = client.get(url(GROUPS))
    assert response.status_code == 200
    groups = [row["group"] for row in response.context["rows"]]
    assert [(g.task_path, g.last_error_class, g.jobs) for g in groups] == [
        ("shop.sync", "TimeoutError", 3),
        ("shop.charge", "CardDeclined", 1),
        ("shop.sync", "CardDeclined", 1),
    ]
    newest = groups[0]
    assert newest.sample_job_id == max(failures["timeouts"])
    assert newest.sample_error == "slow 2"
    # Each group links to its jobs.
    response = client.get(response.context["rows"][0]["url"])
    assert sorted(row_ids(response)) == failures["timeouts"]


def test_retry_a_whole_group_and_only_that_group(client, failures):
    group_url = client.get(url(GROUPS)).context["rows"][0]["url"]
    sample = max(failures["timeouts"])
    response = post_action(
        client, group_url, "retry_now", [sample], confirmed=False, select_across=True
    )
    assert "will go through 3 jobs" in response.text
    response = post_action(client, group_url, "retry_now", [sample], select_across=True)
    assert messages_of(response) == ["Retried 3 jobs."]
    assert set(statuses(failures["timeouts"]).values()) == {"pending"}
    others = [failures["declined"], failures["sync_declined"]]
    assert set(statuses(others).values()) == {"dead_letter"}


def test_discard_a_whole_group(client, failures):
    groups = client.get(url(GROUPS)).context["rows"]
    charge = next(row for row in groups if row["group"].task_path == "shop.charge")
    post_action(client, charge["url"], "discard", [failures["declined"]], select_across=True)
    assert statuses([failures["declined"]]) == {}
    assert len(statuses(failures["timeouts"])) == 3


def test_retry_every_dead_letter_matching_the_filters(client, failures):
    filtered = url(LISTING, task="shop.sync")
    post_action(client, filtered, "retry_now", [failures["sync_declined"]], select_across=True)
    assert set(statuses([*failures["timeouts"], failures["sync_declined"]]).values()) == {"pending"}
    assert statuses([failures["declined"]]) == {failures["declined"]: "dead_letter"}


def test_dead_letters_without_an_error_class_form_their_own_group(client):
    login(client, superuser=True)
    job = dead_letter(error_class="")
    with_class = dead_letter()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_pgqueue_job_history SET last_error_class = NULL WHERE id = %s", [job.pk]
        )
    rows = client.get(url(GROUPS)).context["rows"]
    no_class = next(row for row in rows if row["group"].last_error_class is None)
    assert "error_class=-" in no_class["url"]
    post_action(client, no_class["url"], "retry_now", [job.pk], select_across=True)
    assert statuses([job.pk, with_class.pk]) == {job.pk: "pending", with_class.pk: "dead_letter"}


def test_group_texts_are_escaped(client):
    login(client, superuser=True)
    dead_letter(SCRIPT, error_class=SCRIPT, message=SCRIPT)
    for name in (GROUPS, LISTING):
        response = client.get(url(name))
        assert "<script>alert" not in response.text
        assert ESCAPED_SCRIPT in response.text


def test_groups_show_the_newest_as_a_compact_age(client, failures):
    response = client.get(url(GROUPS))
    newest = str(response.context["rows"][0]["newest"])
    assert re.fullmatch(
        r'<time datetime="[^"]+" title="newest dead letter: [^"]+">\d+s</time>', newest
    )
    assert newest in response.text
