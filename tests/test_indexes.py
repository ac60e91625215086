"""The hot queries keep using their partial indexes beside a million finished jobs.

The finished jobs are in the history tier, where the workers leave them; the job table
holds a realistic backlog (20,000 ready jobs, and 20,000 in 100 deep partitions) and 200
running jobs. A statement that reads the history must use its indexes too (a scan of
every partition of the history would read the million rows).

A claim that falls back to a sequential scan works on an empty table and dies on a real
one, so the plans are checked with EXPLAIN against a big table, with custom and generic
(prepared-statement) plans.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest

from django_pgqueue.store.pgconn import CLAIM_SESSION
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.worker import Worker, WorkerOptions
from tests.plans import explain, walk

pytestmark = pytest.mark.timeout(600)

FINISHED_ROWS = 1_000_000

SEED = """
INSERT INTO django_pgqueue_job_history (
    id, queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, available_at, created_at, started_at, finished_at,
    errors, result, history_class
)
SELECT nextval(pg_get_serial_sequence('django_pgqueue_job', 'id')), 'default',
    'tests.tasks.noop', '[]', '{}', 0, 'succeeded', 1, 5, 1, 'seed',
    now() - interval '2 hours', now() - interval '2 hours', now() - interval '2 hours',
    now() - interval '2 hours' + g * interval '1 millisecond', '[]', 'null', 1
FROM generate_series(1, %(rows)s) AS g
"""

#: Every tenth finished job was enqueued with a key, which stays taken.
SEED_KEYS = """
UPDATE django_pgqueue_job_history SET idempotency_key = 'seed-' || id WHERE id % 10 = 0;
INSERT INTO django_pgqueue_job_key (idempotency_key)
SELECT idempotency_key FROM django_pgqueue_job_history WHERE idempotency_key IS NOT NULL
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

#: A backlog without partitioned jobs (statistics that have never seen one).
PENDING_PLAIN = PENDING.replace("CASE WHEN g % 2 = 0 THEN 'key-' || (g % 100) END", "NULL").replace(
    "CASE WHEN g % 2 = 0 THEN (g % 100) END", "NULL"
)

_RETRY = {"retry_base": 1.0, "retry_max": 60.0, "retry_jitter": 0.1}
_LEASE = {"job_id": 1, "lease_generation": 1, "worker_id": "w"}
_MANY = {"leases": "[[1, 1], [2, 1], [3, 1]]", "worker_id": "w"}

#: Parameters for every statement that touches the job table.
PARAMS: dict[str, dict[str, Any]] = {
    "claim_batch": {
        "queues": ["default", "emails"],
        "bucket_masks": [None, "1" * 1024],
        "queue_limits": [100, 50],
        # The first queue from its head, the second from a floor: every branch planned.
        "floor_priorities": [None, 0],
        "floor_available_ats": [None, datetime(2026, 1, 1, tzinfo=UTC)],
        "floor_ids": [None, 1],
        "part_floor_priorities": [None, 0],
        "part_floor_available_ats": [None, datetime(2026, 1, 1, tzinfo=UTC)],
        "part_floor_ids": [None, 1],
        "key_floor_priorities": [None, 0],
        "key_floor_available_ats": [None, datetime(2026, 1, 1, tzinfo=UTC)],
        "key_floor_ids": [None, 1],
        "worker_id": "w",
        "lease_seconds": 30.0,
        "total_limit": 100,
    },
    "reap_expired": {
        "limit": 1000,
        "job_ids": None,
        "expired_since": None,
        "lease_channel": "l",
        **_RETRY,
    },
    "expired_job_ids": {"limit": 1000},
    "prune_finished": {"retention_seconds": 3600.0, "limit": 1000},
    "prune_dead_letters": {"retention_seconds": 3600.0, "limit": 1000},
    "complete_if_leased": {**_LEASE, "result": "null", "flow_channel": "f"},
    "complete_many_if_leased": {
        "completions": "[[1, 1, null], [2, 1, 3]]",
        "worker_id": "w",
        "flow_channel": "f",
    },
    "fail_if_leased": {
        **_LEASE,
        **_RETRY,
        "permanent": False,
        "error_class": "E",
        "message": "m",
        "traceback": "t",
        "flow_channel": "f",
    },
    "extend_lease_if_leased": {**_LEASE, "lease_seconds": 30.0},
    "extend_leases_if_leased": {**_MANY, "lease_seconds": 30.0},
    "release_if_leased": {
        **_LEASE,
        "delay_seconds": 0.0,
        "reason": None,
        "reason_class": None,
        "unknown_since": None,
        "channel": "c",
        "flow_channel": "f",
    },
    "claim_batch_mates": {
        "worker_id": "w",
        "queue": "default",
        "task_path": "tests.tasks.noop",
        "limit": 10,
        "scan_limit": 100,
        "lease_seconds": 30.0,
        "floor_priority": None,
        "floor_available_at": None,
        "floor_id": None,
    },
    "snooze_if_leased": {
        **_LEASE,
        "delay_seconds": 0.0,
        "max_snoozes": 5,
        "limit_class": "E",
        "channel": "c",
        "flow_channel": "f",
    },
    "release_many_if_leased": {**_MANY, "reason": None, "channel": "c", "flow_channel": "f"},
    "succeeded_under_leases": _MANY,
    "set_step_if_leased": {**_LEASE, "step": "s"},
    "retry_jobs": {"job_ids": [1, 2], "channel": "c", "flow_channel": "f"},
    "run_jobs_now": {"job_ids": [1, 2], "channel": "c", "flow_channel": "f"},
    "cancel_jobs": {"job_ids": [1, 2], "reason": None, "flow_channel": "f", "lease_channel": "l"},
    "discard_jobs": {"job_ids": [1, 2]},
    "select_by_idempotency_keys": {"idempotency_keys": ["a", "b"]},
    "jobs_by_keys": {"keys": ["a", "b"]},
    "partitions_out_of_date": {"after_key": "", "scan_limit": 1000},
    # Dependencies: the job rows by primary key, edges by pgq_dep_blocker/pgq_dep_job.
    "lock_blockers": {"blocker_ids": [1, 2]},
    "enqueue_after": {
        "queue": "default",
        "task_path": "t",
        "args": "[]",
        "kwargs": "{}",
        "priority": 0,
        "status": "blocked",
        "max_attempts": 3,
        "available_at": None,
        "last_error": None,
        "partition_key": None,
        "partition_bucket": None,
        "traceparent": None,
        "on_failure": "cancel",
        "channel": "c",
        "flow_channel": "f",
        "cancelled_by": None,
        "blocker_ids": [1, 2],
        "concurrency_key": None,
        "concurrency_limit": None,
        "rate_limit": None,
        "rate_period": None,
    },
    "revive_dependents": {"job_ids": [1, 2]},
    "cancelled_dependents": {"job_ids": [1, 2]},
    "mark_awaited": {"job_id": 1},
    # The history tier (history.sql, and operator.sql's bring_back).
    "bring_back": {"job_ids": [1, 2], "with_dependents": True},
    "move_finished": {"limit": 1000},
    "free_idempotency_keys": {"keys": ["a", "b"]},
    # Coalesce keys (maintenance.sql).
    "free_coalesce_keys": {"keys": ["a", "b"]},
}

# The plain claim is the claim without its key branches: same parameters.
PARAMS["claim_batch_plain"] = PARAMS["claim_batch"]

PRIMARY_KEY = {"django_pgqueue_job_pkey"}
#: A finished job read by id: pgq_hist_id in each partition of the history.
HISTORY_ID = {"pgq_hist_id"}
BY_ID = {*PRIMARY_KEY, *HISTORY_ID}
EXPECTED_INDEXES = {
    # Partitioned jobs are found through the partition table (pgq_partition_claim) and
    # then read by primary key.
    "claim_batch": {
        "pgq_job_claim",
        "pgq_job_part_pending",
        "pgq_job_part_processing",
        # Jobs under a concurrency limit: the key's ready jobs, and its next job.
        "pgq_job_conc_pending",
        *PRIMARY_KEY,
    },
    # Without the partitions' and concurrency keys' branches: plain jobs only.
    "claim_batch_plain": {"pgq_job_claim", *PRIMARY_KEY},
    # A batch's mates: the queue's next plain jobs (bounded), then by primary key.
    "claim_batch_mates": {"pgq_job_claim", *PRIMARY_KEY},
    "partitions_out_of_date": {"pgq_job_part_pending", *PRIMARY_KEY},
    "reap_expired": {"pgq_job_lease", *PRIMARY_KEY},
    "expired_job_ids": {"pgq_job_lease"},
    "prune_finished": {"pgq_job_finished", *PRIMARY_KEY},
    # Either partial index holds exactly the dead letters; the planner picks by size.
    "prune_dead_letters": {
        "pgq_job_finished",
        "pgq_job_dead",
        "pgq_job_dead_queue",
        *PRIMARY_KEY,
    },
    # The ids, through the primary key or an index of the finished jobs left in the job
    # table (pgq_job_finished holds only those: a few, moved out by housekeeping), and
    # the history's id index (blockers and dependents that finished).
    "retry_jobs": {"pgq_job_revivable", "pgq_job_finished", *BY_ID},
    "revive_dependents": {"pgq_job_revivable", "pgq_job_finished", *BY_ID},
    "cancelled_dependents": {"pgq_job_revivable", "pgq_job_finished", *BY_ID},
    "discard_jobs": {"pgq_job_finished", "django_pgqueue_job_key_pkey", *BY_ID},
    "lock_blockers": BY_ID,
    "enqueue_after": BY_ID,
    "mark_awaited": BY_ID,
    "succeeded_under_leases": {"pgq_job_finished", *BY_ID},
    "bring_back": BY_ID,
    "select_by_idempotency_keys": {"pgq_job_idempotency_key", "pgq_hist_idempotency_key"},
    "jobs_by_keys": {"pgq_job_idempotency_key", "pgq_hist_idempotency_key"},
    "free_idempotency_keys": {
        "django_pgqueue_job_key_pkey",
        "pgq_job_idempotency_key",
        "pgq_hist_idempotency_key",
    },
    # The locked rows, and each one's job by primary key.
    "free_coalesce_keys": {"django_pgqueue_coalesce_key_pkey", *PRIMARY_KEY},
    # Rows a release before 0020 left finished in the job table, oldest first.
    "move_finished": {"pgq_job_finished", *PRIMARY_KEY},
}
ANY_OF = {
    "prune_dead_letters",
    "retry_jobs",
    "revive_dependents",
    "cancelled_dependents",
    "discard_jobs",
    "lock_blockers",
    "enqueue_after",
    "mark_awaited",
    "succeeded_under_leases",
    "bring_back",
    "free_idempotency_keys",
    "free_coalesce_keys",
}

#: The history's partitions' indexes are named after their partition; the parent
#: (partitioned) index's name says which one it is.
_HISTORY_INDEX = {
    "_id_idx": "pgq_hist_id",
    "_idempotency_key_idx": "pgq_hist_idempotency_key",
    "_task_path_last_error_class_id_idx": "pgq_hist_dead",
    "_created_at_idx": "pgq_hist_created_brin",
    "_queue_task_path_partition_key_idx": "pgq_hist_filter_brin",
}


def _index_name(name: str | None) -> str | None:
    if name and name.startswith("django_pgqueue_job_history_"):
        for suffix, parent in _HISTORY_INDEX.items():
            if name.endswith(suffix):
                return parent
    return name


def test_every_job_table_statement_is_covered():
    writes_jobs = {
        name
        for name, query in QUERIES.items()
        # The admin's read-only queries have their own plan test (test_admin_indexes.py).
        if query.source != "admin.sql"
        and re.search(r"django_pgqueue_job(_all|_history)?\s", query.text)
    }
    # The enqueue statements (and the schedules' fire and run-now) insert rows: nothing
    # to scan but the conflict check.
    inserts = {
        "enqueue",
        "enqueue_at",
        "enqueue_idempotent",
        "enqueue_many",
        "enqueue_coalesced",
        "fire_schedule",
        "run_schedule_now",
    }
    assert writes_jobs - inserts == set(PARAMS)


#: The statements a worker's claiming connections send (CLAIM_SESSION).
CLAIMS = ("claim_batch", "claim_batch_plain", "claim_batch_mates")


def _plan(conn, name: str, *, generic: bool) -> dict[str, Any]:
    """Return the plan of ``name``; a generic one as a worker's prepared statement gets,
    in the session of the connection that sends it (the claims: CLAIM_SESSION)."""
    session = CLAIM_SESSION if name in CLAIMS else ""
    return explain(conn, QUERIES[name].text, PARAMS[name], generic=generic, session=session)


def _empty_partitions(conn) -> set[str]:
    """The history's partitions that hold no row (no page at all): scanning them reads nothing,
    and a sequential scan is the planner's right choice there."""
    return {
        row[0]
        for row in conn.execute(
            "SELECT cls.relname FROM pg_partition_tree('django_pgqueue_job_history') AS tree "
            "JOIN pg_class AS cls ON cls.oid = tree.relid WHERE tree.isleaf "
            "AND pg_relation_size(cls.oid) = 0"
        )
    }


def _job_table_scans(conn, name: str, *, generic: bool) -> list[tuple[str, str | None]]:
    empty = _empty_partitions(conn)
    return [
        (node["Node Type"], _index_name(node.get("Index Name")))
        for node in walk(_plan(conn, name, generic=generic))
        if (
            str(node.get("Relation Name", "")).startswith("django_pgqueue_job")
            and node.get("Relation Name") not in empty
        )
        # Bitmap index scans name only their index.
        or str(node.get("Index Name", "")).startswith(("pgq_job_", "django_pgqueue_job_"))
    ]


def _problems(conn, names: Iterable[str] = PARAMS) -> list[str]:
    problems = []
    for generic in (False, True):
        mode = "generic" if generic else "custom"
        for name in names:
            scans = _job_table_scans(conn, name, generic=generic)
            used = {index for _, index in scans if index}
            if any(node == "Seq Scan" for node, _ in scans):
                problems.append(f"{mode}: {name} scans the job table sequentially: {scans}")
            allowed = EXPECTED_INDEXES.get(name, PRIMARY_KEY)
            if used - allowed:
                problems.append(f"{mode}: {name} uses {sorted(used - allowed)}: {scans}")
            required = allowed - PRIMARY_KEY if name in EXPECTED_INDEXES else allowed
            if name not in ANY_OF and not required <= used:
                problems.append(f"{mode}: {name} misses {sorted(required - used)}: {scans}")
    return problems


def test_hot_queries_use_their_indexes_with_a_million_finished_rows(open_connection):
    conn = open_connection(prepare=False)
    conn.execute(SEED, {"rows": FINISHED_ROWS})
    conn.execute(SEED_KEYS)
    conn.execute(PENDING)
    conn.execute(PROCESSING)
    conn.execute("ANALYZE django_pgqueue_job")
    conn.execute("ANALYZE django_pgqueue_job_history")
    conn.execute("ANALYZE django_pgqueue_job_key")
    problems = _problems(conn)
    assert not problems, "\n".join(problems)


#: Ten thousand partition rows, half of them marked running (the partition claim cost
#: test's shape): statistics that make "is its running job still processing?" look like
#: a join better done by hashing the whole job table.
RUNNING_PARTITIONS = """
INSERT INTO django_pgqueue_partition (
    partition_key, queue, partition_bucket, head_id, head_priority, head_available_at,
    running_id, refreshed_at
)
SELECT 'part-' || g, 'default', g % 1024, g, 0, now(), CASE WHEN g % 2 = 0 THEN g END, now()
FROM generate_series(1, 10000) AS g
"""


def test_hot_queries_use_their_indexes_with_thousands_of_running_partitions(open_connection):
    conn = open_connection(prepare=False)
    conn.execute(SEED, {"rows": FINISHED_ROWS})
    conn.execute(SEED_KEYS)
    conn.execute(PENDING)
    conn.execute(PROCESSING)
    conn.execute(RUNNING_PARTITIONS)
    for table in ("job", "job_history", "job_key", "partition"):
        conn.execute(f"ANALYZE django_pgqueue_{table}")
    problems = _problems(conn)
    assert not problems, "\n".join(problems)


def test_generic_plans_made_on_an_empty_queue_stay_safe(open_connection):
    # Statistics taken while no partitioned job existed: a worker that starts now caches
    # generic plans from them, and must still probe partitions through their own indexes.
    conn = open_connection(prepare=False)
    conn.execute(SEED, {"rows": FINISHED_ROWS})
    conn.execute(SEED_KEYS)
    # The job table holds the work in flight only (finished jobs are in the history):
    # a backlog, none of it partitioned or running yet.
    conn.execute(PENDING_PLAIN)
    conn.execute("ANALYZE django_pgqueue_job")
    conn.execute("ANALYZE django_pgqueue_job_history")
    conn.execute("ANALYZE django_pgqueue_job_key")
    problems = _problems(conn)
    assert not problems, "\n".join(problems)


def test_generic_plans_made_on_a_new_database_stay_safe(open_connection):
    # Workers started on a new database cache their plans while the job tables are
    # empty and have never been analyzed (PostgreSQL then costs a table at ten pages):
    # the plans must still read through their indexes once the tables hold millions.
    conn = open_connection(prepare=False)
    # Autovacuum analyzes the job table soon after a test empties it: an ANALYZE between
    # the TRUNCATE and the plans would plan an analyzed-empty table with the column
    # statistics of rows gone (a case of its own, see the note in performance.md), not a
    # new database. Plans made while that happened are made again.
    for _attempt in range(5):
        conn.execute(
            "TRUNCATE django_pgqueue_job, django_pgqueue_job_history, django_pgqueue_job_key"
        )
        if _never_analyzed(conn) != 2:
            continue
        problems = [problem for problem in _problems(conn) if problem.startswith("generic")]
        if _never_analyzed(conn) == 2:
            break
    else:
        pytest.fail("autovacuum analyzed the job tables during every attempt")
    assert not problems, "\n".join(problems)


def _never_analyzed(conn) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_class WHERE relname IN "
        "('django_pgqueue_job', 'django_pgqueue_job_key') AND reltuples < 0"
    ).fetchone()[0]


@pytest.mark.parametrize("analyzed", [True, False], ids=["analyzed-empty", "never-analyzed"])
def test_generic_plans_made_on_an_empty_table_survive_a_backlog(open_connection, analyzed):
    # The most common start of a worker: the queue is idle (its table vacuumed down to
    # nothing, or new), then a burst arrives before any ANALYZE. The plan cached from the
    # empty table's statistics must claim through pgq_job_claim, not read every ready job
    # of the queue through pgq_job_pending and sort them on every claim.
    conn = open_connection(prepare=False)
    conn.execute("TRUNCATE django_pgqueue_job, django_pgqueue_job_history, django_pgqueue_job_key")
    if analyzed:
        conn.execute("ANALYZE django_pgqueue_job")
    conn.execute(PENDING_PLAIN)
    problems = [problem for problem in _problems(conn) if problem.startswith("generic")]
    assert not problems, "\n".join(problems)


def test_claims_keep_their_index_when_index_scans_look_dear(open_connection):
    # Under a long-held snapshot pgq_job_claim grows to hundreds of megabytes of dead
    # entries while few jobs are live, and a plan made after the next ANALYZE may cost
    # reading it above a bitmap scan of pgq_job_filter_brin, whose summaries match every
    # block range of a busy queue: a benchmark's claims then read the whole 3.9 GB table,
    # 3.3 s each, for a minute at a time, until another ANALYZE (performance.md). The
    # claiming connections plan with bitmap scans off; a high random_page_cost stands in
    # here for the bloated index. Without CLAIM_SESSION all three take the bitmap.
    assert set(CLAIMS) <= set(PARAMS)
    conn = open_connection(prepare=False)
    conn.execute(PENDING_PLAIN)
    conn.execute("ANALYZE django_pgqueue_job")
    conn.execute("SET random_page_cost = 1000")
    try:
        problems = [problem for problem in _problems(conn, CLAIMS) if problem.startswith("generic")]
    finally:
        conn.execute("RESET random_page_cost")
    assert not problems, "\n".join(problems)


def test_a_worker_session_never_compiles_its_statements(open_connection):
    # With sequential scans off, PostgreSQL before 18 adds their penalty to the plan's
    # cost, past every JIT threshold: a statement that still has to scan a table (here
    # every history partition) would compile on each run, a quarter of a second.
    conn = open_connection()  # as a worker's: prepared statements, GENERIC_PLAN_SESSION
    plan = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id, status FROM django_pgqueue_job_history"
    ).fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    assert "JIT" not in plan[0], plan[0]["JIT"]


def test_only_a_workers_claiming_connections_plan_without_bitmap_scans(db_url):
    # Only those: with bitmap scans off on every connection of the workers, a held
    # snapshot's benchmark drained at 57% of its rate (performance.md).
    worker = Worker(WorkerOptions.from_settings(burst=True, handle_signals=False))
    slots = {
        "dispatcher": worker._slot,
        "batches": worker._batcher.slot,
        "recorder": worker._recorder_slot,
        "heartbeat": worker._control,
        "steps": worker._steps,
    }
    try:
        settings = {
            name: slot.connection.execute("SHOW enable_bitmapscan").fetchone()[0]
            for name, slot in slots.items()
        }
    finally:
        for slot in slots.values():
            slot.close()
    assert settings == {
        "dispatcher": "off",
        "batches": "off",
        "recorder": "on",
        "heartbeat": "on",
        "steps": "on",
    }
