"""The hot queries keep using their partial indexes on a table of a million finished jobs.

The table also holds a realistic backlog (20,000 ready jobs, and 20,000 in 100 deep
partitions) and 200 running jobs.

A claim that falls back to a sequential scan works on an empty table and dies on a real
one, so the plans are checked with EXPLAIN against a big table, with custom and generic
(prepared-statement) plans.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_pgqueue.sql import QUERIES

pytestmark = pytest.mark.timeout(600)

FINISHED_ROWS = 1_000_000

SEED = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, available_at, created_at, started_at, finished_at,
    errors, result
)
SELECT 'default', 'tests.tasks.noop', '[]', '{}', 0, 'succeeded', 1, 5, 1, 'seed',
    now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
    now() - interval '2 days' + g * interval '1 millisecond', '[]', 'null'
FROM generate_series(1, %(rows)s) AS g
"""

PENDING = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, partition_key, partition_bucket
)
SELECT 'default', 'tests.tasks.noop', '[]', '{}', 0, 'pending', 0, 5, 0, now(), now(), '[]',
    CASE WHEN g % 2 = 0 THEN 'key-' || (g % 100) END,
    CASE WHEN g % 2 = 0 THEN (g % 100) END
FROM generate_series(1, 40000) AS g
"""

PROCESSING = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, lease_expires_at, available_at, created_at, errors
)
SELECT 'default', 'tests.tasks.noop', '[]', '{}', 0, 'processing', 1, 5, 1, 'w', now(),
    now() + interval '30 seconds', now(), now(), '[]'
FROM generate_series(1, 200) AS g
"""

PARAMS: dict[str, dict[str, Any]] = {
    "claim_batch": {
        "queues": ["default", "emails"],
        "bucket_masks": [None, "1" * 1024],
        "per_queue": 100,
        "worker_id": "w",
        "lease_seconds": 30.0,
        "partition_scan_limit": 1000,
    },
    "reap_expired": {
        "limit": 1000,
        "job_ids": None,
        "retry_base": 1.0,
        "retry_max": 60.0,
        "retry_jitter": 0.1,
    },
    "prune_finished": {"retention_seconds": 3600.0, "limit": 1000},
    "prune_dead_letters": {"retention_seconds": 3600.0, "limit": 1000},
}

EXPECTED_INDEXES = {
    "claim_batch": {
        "pgq_job_claim",
        "pgq_job_claim_part",
        "pgq_job_part_pending",
        "pgq_job_part_processing",
    },
    "reap_expired": {"pgq_job_lease"},
    "prune_finished": {"pgq_job_finished"},
    # Either partial index holds exactly the dead letters; the planner picks by size.
    "prune_dead_letters": {"pgq_job_finished", "pgq_job_dead"},
}
ANY_OF = {"prune_dead_letters"}


def _walk(plan: dict[str, Any]):
    yield plan
    for child in plan.get("Plans", []):
        yield from _walk(child)


def _job_table_scans(conn, name: str) -> list[tuple[str, str | None]]:
    rows = conn.execute("EXPLAIN (FORMAT JSON) " + QUERIES[name].text, PARAMS[name]).fetchone()[0]
    plan = (json.loads(rows) if isinstance(rows, str) else rows)[0]["Plan"]
    return [
        (node["Node Type"], node.get("Index Name"))
        for node in _walk(plan)
        if node.get("Relation Name") == "django_pgqueue_job"
    ]


def test_hot_queries_use_their_indexes_with_a_million_finished_rows(open_connection):
    conn = open_connection(prepare=False)
    conn.execute(SEED, {"rows": FINISHED_ROWS})
    conn.execute(PENDING)
    conn.execute(PROCESSING)
    conn.execute("ANALYZE django_pgqueue_job")
    problems = []
    for plan_mode in ("auto", "force_generic_plan"):
        conn.execute(f"SET plan_cache_mode = {plan_mode}")
        for name, expected in EXPECTED_INDEXES.items():
            scans = _job_table_scans(conn, name)
            used = {index for _, index in scans if index}
            sequential = [node for node, _ in scans if node == "Seq Scan"]
            if sequential:
                problems.append(f"{plan_mode}: {name} scans the job table sequentially: {scans}")
            satisfied = bool(expected & used) if name in ANY_OF else expected <= used
            if not satisfied:
                problems.append(
                    f"{plan_mode}: {name} uses {sorted(used)}, expected {sorted(expected)}"
                )
    assert not problems, "\n".join(problems)
