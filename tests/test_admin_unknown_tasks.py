"""The admin shows jobs waiting for a worker that knows their task as their own kind.

Such a job is pending, given back by a worker that could not import its task, and marked
with ``unknown_task_since`` (and ``last_error_class`` ``UnknownTask``). The inbox says what
it waits for; the lag page counts it in its own column, neither ready nor scheduled.
"""

from __future__ import annotations

import html
import re

import pytest

from tests.admin_fixtures import claim, enqueue, login, scheduled, store, url

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

INBOX = "django_pgqueue_job_changelist"
LAG = url("django_pgqueue_lag")
WAITING = "waiting for a worker that knows this task"
MISSING = "tests.missing_module.vanished_task"


def _waiting_for_its_task(queue: str = "default"):
    """Return a job a worker gave back because it could not import its task."""
    job = enqueue(MISSING, queue=queue)
    claimed = claim(job, worker_id="old-release:1")
    # What a worker records for such a job (the kind the admin shows): the release of
    # worker/loop.py's _unknown_task_outcome.
    store().release_if_leased(
        claimed.lease,
        delay_seconds=30,
        reason="waiting for a worker that knows this task: "
        f"{MISSING!r} could not be imported by worker old-release:1 (No module named "
        "'tests.missing_module'); retrying in 30s",
        reason_class="django_pgqueue.exceptions.UnknownTask",
        unknown_since=claimed.available_at,
    )
    return job


def _row_text(text: str, job_id: int) -> str:
    """Return the inbox row of ``job_id`` as lower-case text without tags."""
    rows = re.findall(r"<tr[ >].*?</tr>", text, re.S)
    found = [
        row for row in rows if re.search(rf'class="field-id"><a href="[^"]*/{job_id}/change/', row)
    ]
    assert len(found) == 1, f"job {job_id} is not listed once"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found[0])).lower().split())


def test_the_inbox_says_the_job_waits_for_a_worker_that_knows_its_task(client):
    login(client, superuser=True)
    waiting = _waiting_for_its_task()
    plain = enqueue()
    later = scheduled()
    response = client.get(url(INBOX))
    assert response.status_code == 200
    row = _row_text(response.text, waiting.pk)
    assert WAITING in row, "the inbox row does not say what the job waits for"
    assert WAITING not in _row_text(response.text, plain.pk)
    assert WAITING not in _row_text(response.text, later.pk)


def _cells(text: str, queue: str) -> dict[str, str]:
    """Return the lag table's row of ``queue`` as {column header: cell text}."""
    table = re.search(r'<table id="pgq-queues"[^>]*>.*?</table>', text, re.S)
    assert table is not None
    headers = [
        html.unescape(re.sub(r"<[^>]+>", "", header)).strip()
        for header in re.findall(r"<th scope=\"col\"[^>]*>(.*?)</th>", table.group(0), re.S)
    ]
    row = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', table.group(0), re.S)
    assert row is not None
    cells = [
        html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
        for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row.group(1), re.S)
    ]
    return dict(zip(headers, cells, strict=True))


def test_the_lag_page_counts_them_in_their_own_column(client):
    login(client, superuser=True)
    _waiting_for_its_task(queue="emails")
    enqueue(queue="emails")
    scheduled(queue="emails")
    response = client.get(LAG)
    assert response.status_code == 200
    row = next(row for row in response.context["rows"] if row.lag.queue == "emails")
    assert (row.lag.ready, row.lag.scheduled) == (1, 1), "counted as ready or scheduled"
    cells = _cells(response.text, "emails")
    columns = [name for name in cells if re.search(r"unknown|know|wait|task", name, re.I)]
    assert len(columns) == 1, f"no column of its own among {list(cells)}"
    assert cells[columns[0]] == "1"
    # A queue without such jobs shows none.
    assert _cells(response.text, "default")[columns[0]] == "0"
