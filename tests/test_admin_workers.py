"""The worker registry page: statuses, silence, jobs in flight, partition buckets, read-only."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection

from django_pgqueue.models import Job
from tests.admin_fixtures import (
    SCRIPT,
    claim,
    enqueue,
    login,
    messages_of,
    row_cells,
    row_ids,
    running,
    store,
    text_of,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

WORKERS = url("django_pgqueue_worker_changelist")


def _register(worker_id, *, queues=("default",), owned=None, status=None):
    registry = store()
    assert registry.register_worker(
        worker_id,
        hostname=worker_id.split(":")[0],
        pid=int(worker_id.split(":")[1]),
        queues=queues,
        concurrency=8,
        metadata={"owned_buckets": owned or {}},
        timeout_seconds=30,
    )
    if status:
        registry.set_worker_status(worker_id, status)


@pytest.fixture
def registry(client):
    login(client, superuser=True)
    _register("web-1:10", queues=("default", "emails"), owned={"default": 512, "emails": 1024})
    _register("web-1:11", status="draining")
    _register("web-2:12", status="dead")
    _register("web-3:13")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_pgqueue_worker SET last_seen_at = now() - interval '5 minutes' "
            "WHERE id = 'web-3:13'"
        )
    for _ in range(3):
        claim(enqueue(), worker_id="web-1:10")
    running(expired=True, queue="emails")  # claimed by web-1:100, not listed


def test_lists_workers_with_their_state(client, registry):
    response = client.get(WORKERS)
    assert response.status_code == 200
    text = response.text
    for worker_id in ("web-1:10", "web-1:11", "web-2:12", "web-3:13"):
        assert worker_id in text
    assert "Draining" in text
    assert "Dead" in text
    assert "Alive, silent" in text  # web-3:13 stopped heartbeating
    assert "default, emails" in text
    assert "default: 512/1024" in text
    assert "emails: 1024/1024" in text


def test_jobs_in_flight_per_worker(client, registry):
    response = client.get(WORKERS)
    rows = {worker.id: worker for worker in response.context["cl"].result_list}
    assert rows["web-1:10"].in_flight_load.jobs == 3
    assert rows["web-1:11"].in_flight_load is None


def test_status_and_host_filters(client, registry):
    response = client.get(WORKERS + "?status__exact=dead")
    assert [worker.id for worker in response.context["cl"].result_list] == ["web-2:12"]
    response = client.get(WORKERS + "?hostname__exact=web-1")
    assert {worker.id for worker in response.context["cl"].result_list} == {"web-1:10", "web-1:11"}


def test_read_only(client, registry):
    response = client.get(url("django_pgqueue_worker_change", "web-1:10"))
    assert response.status_code == 200
    assert 'name="_save"' not in response.text
    assert client.post(url("django_pgqueue_worker_change", "web-1:10"), {}).status_code == 405
    assert client.get(url("django_pgqueue_worker_delete", "web-1:10")).status_code == 403


def test_worker_texts_are_escaped(client):
    login(client, superuser=True)
    _register("evil:1", queues=(SCRIPT,), owned={SCRIPT: 3})
    text = client.get(WORKERS).text
    assert "<script>alert" not in text
    assert "&lt;script&gt;" in text


def _link(cell_html: str, index: int = 0) -> str:
    return html.unescape(re.findall(r'href="([^"]+)"', cell_html)[index])


def test_jobs_in_flight_link_to_those_jobs(client, registry):
    claimed = sorted(
        Job.objects.filter(claimed_by="web-1:10", status="processing").values_list("pk", flat=True)
    )
    cells = row_cells(client.get(WORKERS))
    assert text_of(cells["web-1:10"]["in_flight"]) == "3 / 8"
    response = client.get(_link(cells["web-1:10"]["in_flight"]))
    assert response.status_code == 200
    assert sorted(row_ids(response)) == claimed
    # An idle worker has nothing to link to.
    assert text_of(cells["web-1:11"]["in_flight"]) == "0 / 8"
    assert "href" not in cells["web-1:11"]["in_flight"]


def test_expired_leases_link_to_those_jobs(client):
    login(client, superuser=True)
    _register("web-4:14")
    live = enqueue()
    claim(live, worker_id="web-4:14")
    stuck = enqueue()
    claim(stuck, worker_id="web-4:14")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 minute' "
            "WHERE id = %s",
            [stuck.pk],
        )
    cell = row_cells(client.get(WORKERS))["web-4:14"]["in_flight"]
    assert text_of(cell) == "2 / 8 (1 expired)"
    assert sorted(row_ids(client.get(_link(cell, 0)))) == [live.pk, stuck.pk]
    assert row_ids(client.get(_link(cell, 1))) == [stuck.pk]


def test_no_link_for_a_user_who_cannot_see_jobs(client, registry):
    client.logout()
    login(client, "view_worker")
    cell = row_cells(client.get(WORKERS))["web-1:10"]["in_flight"]
    assert text_of(cell) == "3 / 8"
    assert "href" not in cell


def test_worker_page_is_a_readable_summary(client, registry):
    response = client.get(url("django_pgqueue_worker_change", "web-1:10"))
    assert response.status_code == 200
    page = text_of(response.text.split('id="content-main"', 1)[1])
    # No form: every fact as text, times to the second with the zone, relative too.
    assert "<input" not in response.text.split('id="content-main"', 1)[1]
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+ \(\d+ (s|ms) ago; up ", page)
    assert re.search(r"last heartbeat \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+ \(", page)
    assert "host web-1" in page
    assert "queues default, emails" in page
    assert "partition buckets default: 512/1024, emails: 1024/1024" in page
    in_flight = response.context["in_flight_html"]
    assert text_of(in_flight) == "3 / 8"
    assert _link(in_flight) == _link(row_cells(client.get(WORKERS))["web-1:10"]["in_flight"])


def test_a_silent_worker_page_says_what_will_happen(client, registry):
    response = client.get(url("django_pgqueue_worker_change", "web-3:13"))
    assert "Alive, silent" in response.text
    assert "housekeeping will mark it dead" in response.text


def test_a_forgotten_worker_sends_back_to_the_list(client, registry):
    response = client.get(url("django_pgqueue_worker_change", "web-9:99"), follow=True)
    assert response.redirect_chain[-1][0] == WORKERS
    assert messages_of(response) == ["Worker web-9:99 is not in the registry any more."]
