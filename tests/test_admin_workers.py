"""The worker registry page: statuses, silence, jobs in flight, partition buckets, read-only."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.admin_fixtures import SCRIPT, claim, enqueue, login, running, store, url

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
    assert client.post(url("django_pgqueue_worker_change", "web-1:10"), {}).status_code == 403
    assert client.get(url("django_pgqueue_worker_delete", "web-1:10")).status_code == 403


def test_worker_texts_are_escaped(client):
    login(client, superuser=True)
    _register("evil:1", queues=(SCRIPT,), owned={SCRIPT: 3})
    text = client.get(WORKERS).text
    assert "<script>alert" not in text
    assert "&lt;script&gt;" in text
