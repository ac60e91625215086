"""A metrics scrape reads a million-row job table through indexes only.

Seeded like the admin's index tests (tests/admin_seed.py: a million finished jobs, a
backlog of ready, scheduled and running jobs, expired leases). The statements of
sql/metrics.sql must not read the job table at all; every statement a real scrape sends
that does read it is EXPLAINed: none may scan it sequentially. Timing is not asserted
(``python -m tests.admin_timings`` measures the scrape with the admin pages).
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.store.sql import QUERIES
from tests.admin_seed import seed
from tests.test_admin_indexes import FINISHED_ROWS, JOB_TABLE, _job_table_scans

pytestmark = pytest.mark.timeout(900)

TOKEN = "token-of-the-index-test"

#: Each metrics query's parameters (none of them may read the job table).
METRICS_QUERIES = {
    "queue_finished_totals": {"queues": ["default", "emails", "reports"], "minutes": 60},
    "queue_workers": {"queues": ["default", "emails", "reports"], "timeout_seconds": 30.0},
}


def test_metrics_queries_do_not_read_the_job_table(open_connection):
    conn = open_connection(prepare=False)
    seed(conn, finished=FINISHED_ROWS)
    assert set(METRICS_QUERIES) == {n for n, q in QUERIES.items() if q.source == "metrics.sql"}
    for name, params in METRICS_QUERIES.items():
        assert _job_table_scans(conn, QUERIES[name].text, params) == [], name


def test_a_scrape_only_reads_the_job_table_through_indexes(client, open_connection):
    conn = open_connection(prepare=False)
    seed(conn, finished=FINISHED_ROWS)
    with (
        override_settings(PGQUEUE_METRICS_TOKEN=TOKEN),
        CaptureQueriesContext(connection) as captured,
    ):
        response = client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    # The seeded backlog is there, capped where it is large.
    ready = {s.labels["queue"]: s.value for s in families["pgqueue_ready_jobs"].samples}
    assert sum(ready.values()) == 20_000
    expired = sum(s.value for s in families["pgqueue_expired_leases"].samples)
    assert expired == 20

    statements = [q["sql"] for q in captured.captured_queries if JOB_TABLE in q["sql"]]
    reading = [s for s in statements if _job_table_scans(conn, s)]
    assert reading, "the scrape never read the job table"
    problems = []
    for statement in reading:
        scans = _job_table_scans(conn, statement)
        if any(node == "Seq Scan" for node, _ in scans):
            problems.append(f"{statement[:300]}\n    -> {scans}")
    assert not problems, "\n".join(problems)
