"""The metrics view: one scrape reports every queue's state, parsed by prometheus_client."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue import pause_queue
from django_pgqueue.store.reports import QueueCounts
from tests.admin_fixtures import (
    dead_letter,
    enqueue,
    login,
    running,
    scheduled,
    store,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

TOKEN = "s3cret-token-for-tests"
BEARER = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


def scrape(client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Fetch /metrics/ with the token; return {(sample name, labels): value}."""
    with override_settings(PGQUEUE_METRICS_TOKEN=TOKEN):
        response = client.get("/metrics/", **BEARER)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    assert response["Cache-Control"] == "no-store"
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    labels.setdefault("database", "default")
    return samples[name, frozenset(labels.items())]


def _register_worker(worker_id: str, queues: list[str], *, seen_seconds_ago: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_pgqueue_worker "
            "(id, status, hostname, pid, queues, concurrency, started_at, last_seen_at, metadata)"
            " VALUES (%s, 'alive', 'host', 1, %s::jsonb, 4, now(), "
            " now() - %s * interval '1 second', '{}')",
            [worker_id, json.dumps(queues), seen_seconds_ago],
        )


def test_scrape_reports_each_queue(client):
    dead_letter(queue="emails")
    dead_letter(queue="emails")
    running(queue="emails")
    running(queue="emails", expired=True)
    enqueue(queue="emails", available_at=timezone.now() - dt.timedelta(minutes=5))
    gate = enqueue(queue="emails")
    scheduled(queue="emails")
    enqueue(queue="unconfigured")
    enqueue(queue="emails", after=[gate.pk])
    store().record_queue_stats(
        [QueueCounts("emails", succeeded=30, failed=2, dead_lettered=1, wait_ms_max=900)]
    )
    _register_worker("web-1:1", ["emails", "default"], seen_seconds_ago=1)
    _register_worker("web-2:2", ["emails"], seen_seconds_ago=3600)
    pause_queue("emails", by="oncall")

    samples = scrape(client)

    emails = {"queue": "emails"}
    assert value(samples, "pgqueue_jobs", status="pending", **emails) == 3
    assert value(samples, "pgqueue_jobs", status="processing", **emails) == 2
    assert value(samples, "pgqueue_jobs", status="dead_letter", **emails) == 2
    assert value(samples, "pgqueue_jobs", status="blocked", **emails) == 1
    assert value(samples, "pgqueue_ready_jobs", **emails) == 2
    assert value(samples, "pgqueue_scheduled_jobs", **emails) == 1
    assert value(samples, "pgqueue_unknown_task_jobs", **emails) == 0
    assert value(samples, "pgqueue_expired_leases", **emails) == 1
    # The oldest ready job became ready five minutes ago (the transaction's clock: at most
    # the test's own duration more).
    assert 295 <= value(samples, "pgqueue_oldest_ready_age_seconds", **emails) < 360
    assert value(samples, "pgqueue_finished_jobs_5m", outcome="succeeded", **emails) == 30
    assert value(samples, "pgqueue_finished_jobs_5m", outcome="failed", **emails) == 2
    assert value(samples, "pgqueue_finished_jobs_1h", outcome="dead_lettered", **emails) == 1
    assert value(samples, "pgqueue_longest_wait_5m_seconds", **emails) == 0.9
    assert value(samples, "pgqueue_workers", state="live", **emails) == 1
    assert value(samples, "pgqueue_workers", state="silent", **emails) == 1
    assert value(samples, "pgqueue_workers", state="live", queue="default") == 1
    assert value(samples, "pgqueue_queue_paused", **emails) == 1
    assert value(samples, "pgqueue_queue_paused", queue="default") == 0
    # A queue no backend configures still shows up once it holds jobs.
    assert value(samples, "pgqueue_ready_jobs", queue="unconfigured") == 1
    # Configured queues with nothing in them report zeros rather than vanishing.
    assert value(samples, "pgqueue_ready_jobs", queue="low") == 0
    assert value(samples, "pgqueue_oldest_ready_age_seconds", queue="low") == 0
    assert value(samples, "pgqueue_count_limit") == 100_000
    assert value(samples, "pgqueue_job_table_bytes", part="total") > 0
    assert value(samples, "pgqueue_job_table_tuples", kind="dead") >= 0
    assert value(samples, "pgqueue_scrape_duration_seconds") > 0


def test_counts_stop_at_the_count_limit(client, monkeypatch):
    from django_pgqueue.metrics import collector

    monkeypatch.setattr(collector, "COUNT_LIMIT", 2)
    for _ in range(3):
        enqueue(queue="emails")
    samples = scrape(client)
    assert value(samples, "pgqueue_ready_jobs", queue="emails") == 2
    assert value(samples, "pgqueue_count_limit") == 2


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"HTTP_AUTHORIZATION": "Bearer wrong-token-of-some-length"},
        {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"},
    ],
)
def test_anonymous_and_wrong_tokens_are_refused(client, headers):
    with override_settings(PGQUEUE_METRICS_TOKEN=TOKEN):
        response = client.get("/metrics/", **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"pgqueue_" not in response.content


def test_without_a_token_setting_no_bearer_gets_in(client):
    response = client.get("/metrics/", HTTP_AUTHORIZATION="Bearer None")
    assert response.status_code == 401


def test_staff_users_may_open_it_and_others_may_not(client):
    client.force_login(_non_staff())
    assert client.get("/metrics/").status_code == 401
    login(client)
    response = client.get("/metrics/")
    assert response.status_code == 200
    assert b"pgqueue_ready_jobs" in response.content


def _non_staff():
    from django.contrib.auth.models import User

    return User.objects.create_user("visitor", password="secret")


def test_only_get_and_head(client):
    with override_settings(PGQUEUE_METRICS_TOKEN=TOKEN):
        assert client.post("/metrics/", **BEARER).status_code == 405
        assert client.head("/metrics/", **BEARER).status_code == 200


@pytest.mark.parametrize("token", ["short", 42, " padded-token-of-length "])
def test_a_bad_token_setting_is_a_configuration_error(token):
    from django_pgqueue.conf import conf
    from django_pgqueue.exceptions import ConfigurationError

    with (
        override_settings(PGQUEUE_METRICS_TOKEN=token),
        pytest.raises(ConfigurationError, match="PGQUEUE_METRICS_TOKEN"),
    ):
        conf.METRICS_TOKEN  # noqa: B018


def test_the_dashboard_and_alerts_use_only_metrics_that_exist(client):
    import re
    from pathlib import Path

    from django_pgqueue.metrics.worker import WorkerMetrics
    from tests.database import REPO

    enqueue(queue="emails")  # so that every per-queue family has a sample
    names = {name for name, _ in scrape(client)}
    worker = WorkerMetrics()
    for family in worker.registry.collect():
        names.update(sample.name for sample in family.samples)
        names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum", "_total"))
    used = set()
    for document in ("grafana-dashboard.json", "prometheus-alerts.yml"):
        text = (REPO / "docs" / "ops" / document).read_text()
        used |= set(re.findall(r"\bpgqueue_[a-z0-9_]+", text))
    assert used, "no metric found in the documents"
    assert used <= names, sorted(used - names)
    assert json.loads((REPO / "docs" / "ops" / "grafana-dashboard.json").read_text())["panels"]
    assert Path(REPO / "docs" / "ops" / "prometheus-alerts.yml").exists()
