"""'Which jobs are stuck, and since when?': expired leases, silent workers, queues no live
worker serves and full concurrency limits, on the lag page and above the inbox.

The situations are made as workers would make them (enqueue, claim, a registry row that
stopped heartbeating), inside the test's transaction, and read through the queue
manager's ``stuck_work`` and the pages.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.utils import timezone

from django_pgqueue.features.pausing import pause_queue
from django_pgqueue.store.reports import StuckKind
from tests.admin_fixtures import CHANGE, VIEW, enqueue, login, running, store, url

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]

LAG = url("django_pgqueue_lag")
INBOX = url("django_pgqueue_job_changelist")
QUEUES = ["default", "emails", "reports"]


def _worker(worker_id: str, queues: list[str], *, silent_for: float = 0.0) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgqueue_worker (id, status, hostname, pid, queues, "
            "concurrency, started_at, last_seen_at, metadata) VALUES (%s, 'alive', 'web-1', "
            "%s, %s, 4, now() - interval '1 hour', now() - make_interval(secs => %s), '{}')",
            [worker_id, int(worker_id.rsplit(":", 1)[1]), json.dumps(queues), silent_for],
        )


def _stuck():
    return {
        (item.kind, item.subject): item
        for item in store().stuck_work(QUEUES, timeout_seconds=60, count_limit=100)
    }


def test_nothing_is_stuck_while_live_workers_serve_every_queue():
    _worker("web-1:101", QUEUES)
    enqueue(queue="emails")
    running(queue="reports")
    assert _stuck() == {}


def test_an_expired_lease_is_stuck_since_it_expired():
    _worker("web-1:101", QUEUES)
    job = running(queue="reports", expired=True)
    item = _stuck()[StuckKind.EXPIRED_LEASE, "reports"]
    assert item.jobs == 1
    assert item.since == job.lease_expires_at


def test_a_worker_that_stopped_heartbeating_is_stuck_even_holding_no_lease():
    # SIGSTOP: the row says alive, the heartbeat stopped; it holds nothing, so no lease
    # will ever expire to tell.
    _worker("web-1:101", QUEUES)
    _worker("web-1:102", QUEUES, silent_for=600)
    stuck = _stuck()
    item = stuck[StuckKind.STALLED_WORKER, "web-1:102"]
    assert item.jobs == 0
    assert timezone.now() - item.since > dt.timedelta(seconds=590)
    assert (StuckKind.STALLED_WORKER, "web-1:101") not in stuck


def test_a_queue_no_live_worker_serves_is_stuck_since_its_oldest_ready_job():
    _worker("web-1:101", ["default"])
    _worker("web-1:102", ["reports"], silent_for=600)  # silent: serves nothing
    oldest = enqueue(queue="reports", available_at=timezone.now() - dt.timedelta(minutes=5))
    enqueue(queue="reports")
    enqueue(queue="emails", available_at=timezone.now() + dt.timedelta(hours=1))  # not ready
    stuck = _stuck()
    item = stuck[StuckKind.UNSERVED_QUEUE, "reports"]
    assert item.jobs == 2
    assert item.since == oldest.available_at
    assert (StuckKind.UNSERVED_QUEUE, "emails") not in stuck
    assert (StuckKind.UNSERVED_QUEUE, "default") not in stuck
    pause_queue("reports")  # stopped on purpose: the banner says so, not this
    assert (StuckKind.UNSERVED_QUEUE, "reports") not in _stuck()


def test_a_key_at_its_limit_with_ready_jobs_waiting_is_stuck():
    _worker("web-1:101", QUEUES)
    first = enqueue(
        concurrency_key="api",
        concurrency_limit=1,
        available_at=timezone.now() - dt.timedelta(minutes=9),
    )
    waiting = enqueue(
        concurrency_key="api",
        concurrency_limit=1,
        available_at=timezone.now() - dt.timedelta(minutes=3),
    )
    claimed = store().claim("web-1:101", ["default"], per_queue=5, lease_seconds=30)
    assert [job.id for job in claimed] == [first.pk]
    item = _stuck()[StuckKind.FULL_KEY, "api"]
    assert (item.jobs, item.max_in_flight, item.queue) == (1, 1, "default")
    assert item.since == waiting.available_at


def test_the_lag_page_and_the_inbox_list_each_one_with_a_link(client):
    login(client, *CHANGE, "view_concurrencykey")
    _worker("web-1:101", ["default"])
    _worker("web-1:102", ["default"], silent_for=600)
    running(queue="default", expired=True)
    enqueue(queue="reports")
    for page in (LAG, INBOX):
        html = client.get(page).content.decode()
        assert 'id="pgq-stuck"' in html
        assert "Stuck now" in html
        assert html.count('<li data-kind="') == 3
        assert f"{INBOX}?status=expired&amp;queue=default" in html
        assert url("django_pgqueue_worker_change", "web-1_3A102") in html
        assert f"{INBOX}?status=ready&amp;queue=reports" in html
        assert "no live worker serves the queue" in html


def test_nothing_stuck_says_so(client):
    login(client, *VIEW)
    _worker("web-1:101", QUEUES)
    html = client.get(LAG).content.decode()
    assert "Nothing is stuck" in html
    assert "Nothing is stuck" in client.get(INBOX).content.decode()
    # The dead letters are not where one looks for this.
    assert (
        "pgq-stuck" not in client.get(url("django_pgqueue_deadletter_changelist")).content.decode()
    )


def test_the_job_page_links_claimed_by_to_the_workers_page(client):
    login(client, *VIEW)
    _worker("web-1:100", QUEUES)
    job = running(queue="default")  # claimed by web-1:100
    html = client.get(url("django_pgqueue_job_change", job.pk)).content.decode()
    worker_page = url("django_pgqueue_worker_change", "web-1_3A100")
    assert f'<a id="pgq-claimed-by" href="{worker_page}"' in html
    assert client.get(worker_page).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_pgqueue_worker")  # housekeeping forgot it
    html = client.get(url("django_pgqueue_job_change", job.pk)).content.decode()
    assert 'id="pgq-claimed-by"' not in html
    assert "no longer in the worker registry" in html


def test_the_panel_shows_three_lines_of_a_kind_and_how_many_more(client):
    login(client, *CHANGE, "view_concurrencykey")
    _worker("web-1:101", QUEUES)
    for tenant in range(5):
        enqueue(concurrency_key=f"tenant:{tenant}", concurrency_limit=1)
        enqueue(concurrency_key=f"tenant:{tenant}", concurrency_limit=1)
    store().claim("web-1:101", ["default"], per_queue=10, lease_seconds=30)
    html = client.get(LAG).content.decode()
    assert html.count('<li data-kind="full_key">') == 4
    assert "and 2 more keys at their limit" in html
    assert url("django_pgqueue_concurrencykey_changelist") in html
