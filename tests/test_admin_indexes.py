"""The admin reads a million-row job table through indexes only.

Seeded with tests/admin_seed.py: a million finished jobs (2% dead letters, some
cancelled, a rare queue), a backlog of ready, scheduled and partitioned jobs, running
jobs and expired leases. Then:

* every query of sql/admin.sql is EXPLAINed with the parameters the pages use: none may
  scan the job table sequentially, and each uses the index its description names;
* every admin page (and an action's confirmation and execution) is fetched with the test
  client, every statement it sent that reads the job table is EXPLAINed the same way.

Timing is not asserted here (see tests/admin_timings.py for the measurements).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_pgqueue.store.sql import QUERIES
from tests.admin_fixtures import login, post_action, url
from tests.admin_seed import seed
from tests.plans import walk

pytestmark = pytest.mark.timeout(900)

FINISHED_ROWS = 1_000_000
JOB_TABLE = "django_pgqueue_job"
PRIMARY_KEY = "django_pgqueue_job_pkey"

#: Each admin query's parameters, and the indexes it must use (all of them).
ADMIN_QUERIES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "estimated_job_count": ({}, set()),
    "job_table_health": ({}, set()),
    "vacuum_horizon": ({}, set()),
    "known_queues": (
        {"configured": ["default", "emails"]},
        {"pgq_job_pending", "pgq_job_dead_queue", "pgq_job_lease"},
    ),
    "queue_lag": (
        {"queues": ["default", "emails", "reports", "high", "low", "none"], "count_limit": 10000},
        {"pgq_job_pending", "pgq_job_lease", "pgq_job_dead_queue"},
    ),
    "queue_minutes": ({"queues": ["default", "emails", "reports"], "minutes": 60}, set()),
    # pgq_job_dead as an index-only scan once vacuum has set the visibility map; until
    # then reading the dead letters through pgq_job_revivable is as good (see ALTERNATIVES).
    "dead_letter_groups": ({"limit": 500}, {"pgq_job_dead", PRIMARY_KEY}),
    "partition_blocker": (
        {"job_id": "{partitioned}", "partition_key": "tenant-2"},
        {"pgq_job_part_processing", "pgq_job_part_pending"},
    ),
    "partition_waiting": (
        {
            "job_id": "{partitioned}",
            "partition_key": "tenant-2",
            "include_older": False,
            "limit": 21,
        },
        {"pgq_job_part_pending"},
    ),
    "jobs_in_flight": ({"worker_ids": ["web-1:1000", "web-9:4242"]}, {"pgq_job_lease"}),
    "stuck_work": (
        {
            "queues": ["default", "emails", "reports", "high", "low", "none"],
            "timeout_seconds": 60,
            "count_limit": 10000,
            "row_limit": 20,
        },
        {"pgq_job_lease", "pgq_job_pending", "pgq_job_conc_pending"},
    ),
}


#: Indexes that may replace an expected one: {query: {expected: substitute}}.
ALTERNATIVES = {"dead_letter_groups": {"pgq_job_dead": "pgq_job_revivable"}}


def _job_table_scans(conn, statement: str, params: Any = None) -> list[tuple[str, str | None]]:
    """The scans of the job table and of the history's partitions that hold rows (an
    empty partition is rightly read sequentially)."""
    rows = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()[0]
    plan = (json.loads(rows) if isinstance(rows, str) else rows)[0]["Plan"]
    empty = {
        row[0]
        for row in conn.execute(
            "SELECT cls.relname FROM pg_partition_tree('django_pgqueue_job_history') AS tree "
            "JOIN pg_class AS cls ON cls.oid = tree.relid WHERE tree.isleaf "
            "AND pg_relation_size(cls.oid) = 0"
        )
    }
    return [
        (node["Node Type"], node.get("Index Name"))
        for node in walk(plan)
        if (
            str(node.get("Relation Name", "")).startswith(JOB_TABLE)
            and node.get("Relation Name") not in empty
        )
        # Bitmap index scans name only their index.
        or str(node.get("Index Name", "")).startswith(("pgq_job_", f"{JOB_TABLE}_"))
    ]


@pytest.fixture
def seeded(open_connection):
    conn = open_connection(prepare=False)
    seed(conn, finished=FINISHED_ROWS)
    partitioned = conn.execute(
        "SELECT max(id) FROM django_pgqueue_job_all "
        "WHERE status = 'pending' AND partition_key = 'tenant-2'"
    ).fetchone()[0]
    dead = conn.execute(
        "SELECT max(id) FROM django_pgqueue_job_all WHERE status = 'dead_letter'"
    ).fetchone()[0]
    return conn, {"partitioned": partitioned, "dead": dead}


def test_admin_queries_use_their_indexes(seeded):
    conn, ids = seeded
    assert set(ADMIN_QUERIES) == {name for name, q in QUERIES.items() if q.source == "admin.sql"}
    problems = []
    for name, (params, expected) in ADMIN_QUERIES.items():
        bound = {
            key: int(value.format(**ids)) if isinstance(value, str) and "{" in value else value
            for key, value in params.items()
        }
        scans = _job_table_scans(conn, QUERIES[name].text, bound)
        used = {index for _, index in scans if index}
        for expected_index, substitute in ALTERNATIVES.get(name, {}).items():
            if substitute in used:
                used.add(expected_index)
        if any(node == "Seq Scan" for node, _ in scans):
            problems.append(f"{name} scans the job table sequentially: {scans}")
        if not expected <= used:
            problems.append(f"{name} does not use {sorted(expected - used)}: {scans}")
        if not expected and scans:
            problems.append(f"{name} reads the job table: {scans}")
    assert not problems, "\n".join(problems)


def _range(field: str, start: str, end: str) -> dict[str, str]:
    day_start, time_start = start.split(" ")
    day_end, time_end = end.split(" ")
    return {
        f"{field}__range__gte_0": day_start,
        f"{field}__range__gte_1": time_start,
        f"{field}__range__lte_0": day_end,
        f"{field}__range__lte_1": time_end,
    }


def test_admin_pages_only_read_the_job_table_through_indexes(client, seeded):
    conn, ids = seeded
    login(client, superuser=True)
    window = conn.execute(
        "SELECT to_char(now() - interval '40 hours', 'YYYY-MM-DD HH24:00:00'), "
        "to_char(now() - interval '40 hours', 'YYYY-MM-DD HH24:59:59')"
    ).fetchone()
    inbox = "django_pgqueue_job_changelist"
    dead_letters = "django_pgqueue_deadletter_changelist"
    pages = [
        url(inbox),
        url(inbox, p=20),
        *(
            url(inbox, status=status)
            for status in (
                "pending",
                "ready",
                "scheduled",
                "processing",
                "expired",
                "succeeded",
                "dead_letter",
                "cancelled",
            )
        ),
        url(inbox, queue="emails"),
        url(inbox, queue="low"),
        url(inbox, queue="reports", status="scheduled"),
        url(inbox, task="maintenance.tasks.rebuild_search_index"),
        url(inbox, partition_key="customer-75"),
        url(inbox, q=str(ids["dead"])),
        url(inbox, q="order-3"),
        url(inbox, q="customer-75"),
        url(inbox, **_range("created_at", *window)),
        url(inbox, **_range("available_at", *window)),
        url(inbox, **_range("finished_at", *window)),
        url("django_pgqueue_job_change", ids["dead"]),
        url("django_pgqueue_job_change", ids["partitioned"]),
        url(dead_letters),
        url(dead_letters, queue="reports"),
        url(dead_letters, task="shop.tasks.send_receipt", error_class="KeyError"),
        url("django_pgqueue_deadletter_groups"),
        url("django_pgqueue_lag"),
        url("django_pgqueue_worker_changelist"),
        url("django_pgqueue_worker_change", "web-1:1000"),
        # A worker's jobs in flight, as its page links to them.
        url(inbox, status="processing", claimed_by="web-1:1000"),
        url(inbox, status="expired", claimed_by="web-9:4242"),
    ]
    problems = []
    with CaptureQueriesContext(connection) as captured:
        for page in pages:
            assert client.get(page).status_code == 200, page
        # An action over a whole filtered set: its count, its chunks and the update.
        response = post_action(
            client,
            url(dead_letters),
            "retry_now",
            [ids["dead"]],
            confirmed=False,
            select_across=True,
        )
        assert response.status_code == 200
        response = post_action(
            client, url(dead_letters, queue="low"), "retry_now", [ids["dead"]], select_across=True
        )
        assert response.status_code == 302
    statements = [
        query["sql"]
        for query in captured.captured_queries
        if JOB_TABLE in query["sql"] and not query["sql"].startswith("EXPLAIN")
    ]
    assert len(statements) > len(pages)
    # The catalog queries name the table without reading it; every other one reads it.
    assert sum(bool(_job_table_scans(conn, statement)) for statement in statements) > len(pages)
    for statement in statements:
        scans = _job_table_scans(conn, statement)
        if any(node == "Seq Scan" for node, _ in scans):
            problems.append(f"{statement[:300]}\n    -> {scans}")
    assert not problems, "\n".join(problems)
