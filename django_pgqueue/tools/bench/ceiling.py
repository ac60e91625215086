"""The raw-SQL figures a run compares with: an INSERT floor and claim/complete ceilings."""

from __future__ import annotations

import time
from typing import Any

from django.db import connections

from django_pgqueue.store.pgconn import connect
from django_pgqueue.tools.bench.config import BenchConfig
from django_pgqueue.tools.bench.tasks import BenchmarkError


def insert_floor(config: BenchConfig) -> float:
    """Return single-row INSERTs per second, autocommit, on the Django connection."""
    if not config.single_enqueues:
        return 0.0
    with connections[config.database].cursor() as cursor:
        started = time.perf_counter()
        for _ in range(config.single_enqueues):
            cursor.execute(_FLOOR_INSERT, [config.queue])
        elapsed = time.perf_counter() - started
        cursor.execute(
            "DELETE FROM django_pgqueue_job WHERE queue = %s AND task_path = 'floor'",
            [config.queue],
        )
    return config.single_enqueues / elapsed


_FLOOR_INSERT = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors
)
VALUES (%s, 'floor', '[]', '{}', 0, 'pending', 0, 1, 0, now(), now(), '[]')
"""


#: The raw-SQL ceilings' rows: enough for the claim's index, nothing a worker would run.
_CEILING_FILL = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors
)
SELECT %(queue)s, 'ceiling', '[]', '{}', 0, 'pending', 0, 1, 0, now(), now(), '[]'
FROM generate_series(1, %(rows)s)
"""

#: The claim reduced to what no claim can skip: the same index (pgq_job_claim) and
#: order, SKIP LOCKED, and the lease columns. None of claim_batch's pause, partition
#: and limit checks, and no decoding of the rows.
_CEILING_CLAIM = """
WITH picked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.status = 'pending'
      AND job.partition_key IS NULL
      AND job.concurrency_key IS NULL
      AND job.queue = %(queue)s
      AND job.available_at <= now()
    ORDER BY job.priority DESC, job.available_at, job.id
    LIMIT %(limit)s
    FOR UPDATE OF job SKIP LOCKED
)
UPDATE django_pgqueue_job AS job
SET status = 'processing',
    attempts = job.attempts + 1,
    lease_generation = job.lease_generation + 1,
    claimed_by = 'queuebench ceiling',
    claimed_at = now(),
    started_at = now(),
    lease_expires_at = now() + interval '5 minutes'
WHERE job.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING job.id, job.lease_generation
"""

#: A completion fenced per job as the worker's is (id, lease generation, holder,
#: status) that moves the row to the history as the worker's does (a DELETE and an
#: INSERT into the class's partition), without its lock ordering, its partition and
#: limit refreshes, its keys and its dependents.
_CEILING_COMPLETE = """
WITH gone AS (
    DELETE FROM django_pgqueue_job AS job
    USING unnest(%(ids)s::bigint[], %(generations)s::bigint[]) AS done (id, lease_generation)
    WHERE job.id = done.id
      AND job.lease_generation = done.lease_generation
      AND job.claimed_by = 'queuebench ceiling'
      AND job.status = 'processing'
    RETURNING job.*
)
INSERT INTO django_pgqueue_job_history (
    id, queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, available_at, created_at, started_at,
    finished_at, errors, result, has_dependents, awaited, snoozes, history_class
)
SELECT gone.id, gone.queue, gone.task_path, gone.args, gone.kwargs, gone.priority,
    'succeeded', gone.attempts, gone.max_attempts, gone.lease_generation, gone.claimed_by,
    gone.claimed_at, gone.available_at, gone.created_at, gone.started_at, now(),
    gone.errors, 'null', gone.has_dependents, gone.awaited, gone.snoozes,
    django_pgqueue_history_class_of('succeeded', gone.queue)
FROM gone
"""


def ceilings(config: BenchConfig) -> dict[str, float]:
    """Return what the server allows on this table: jobs per second, one connection.

    Each ceiling claims ``config.ceiling_jobs`` fresh rows with hand-written SQL in a
    loop (10 or 100 per statement; the last one also completes each batch), so the
    drain can be read against what the same server and table allow in the same run.
    The connection prepares its statements, as a worker's does.
    """
    with connect(config.database, application_name="queuebench ceilings") as conn:
        return _ceiling_rates(conn, config)


def _ceiling_rates(conn: Any, config: BenchConfig) -> dict[str, float]:
    rates = {}
    for name, limit, complete in (
        ("claim_10", 10, False),
        ("claim_100", 100, False),
        ("claim_complete_100", 100, True),
    ):
        conn.execute(_CEILING_FILL, {"queue": config.queue, "rows": config.ceiling_jobs})
        conn.execute("VACUUM ANALYZE django_pgqueue_job")
        claimed = 0
        started = time.perf_counter()
        while rows := conn.execute(
            _CEILING_CLAIM, {"queue": config.queue, "limit": limit}
        ).fetchall():
            claimed += len(rows)
            if complete:
                conn.execute(
                    _CEILING_COMPLETE,
                    {"ids": [row[0] for row in rows], "generations": [row[1] for row in rows]},
                )
        elapsed = time.perf_counter() - started
        for table in ("django_pgqueue_job", "django_pgqueue_job_history"):
            conn.execute(
                f"DELETE FROM {table} WHERE queue = %s AND task_path = 'ceiling'",
                [config.queue],
            )
        if claimed != config.ceiling_jobs:
            raise BenchmarkError(
                f"the {name} ceiling claimed {claimed} of {config.ceiling_jobs} rows"
            )
        rates[name] = claimed / elapsed
    return rates
