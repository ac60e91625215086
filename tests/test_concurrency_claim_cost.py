"""A claim's cost does not grow with jobs waiting on keys at their concurrency limit.

EXPLAIN (ANALYZE, BUFFERS) of the real claim statement, in a transaction rolled back:
100,000 jobs waiting on 10,000 keys at their limit (plus 20 keys with free slots), next
to 1,000 jobs on 100 keys. Buffers, not time: the pages a claim touches.
"""

from __future__ import annotations

import pytest

from django_pgqueue.store.sql import QUERIES
from tests.claim_params import claim_params
from tests.plans import claim_cost

pytestmark = pytest.mark.timeout(600)

OPEN_KEYS = 20

# Ten pending jobs per key, limit 2, plus the two running ones of each key at its limit.
FILL = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, concurrency_key, concurrency_limit
)
SELECT 'default', 'tests.tasks.noop', '[]', '{}', (g %% 7) - 3, 'pending', 0, 5, 0,
    now() - interval '1 minute', now(), '[]', 'tenant-' || (g %% %(keys)s), 2
FROM generate_series(1, %(rows)s + 2 * %(keys)s) AS g
"""

# Every key but the first OPEN_KEYS is at its limit: two of its jobs are processing.
BLOCK = """
UPDATE django_pgqueue_job AS job
SET status = 'processing', attempts = 1, lease_generation = 1, claimed_by = 'other',
    claimed_at = now(), lease_expires_at = now() + interval '1 hour'
WHERE job.id IN (
    SELECT ranked.id FROM (
        SELECT job.id, row_number() OVER (PARTITION BY job.concurrency_key ORDER BY job.id) AS n
        FROM django_pgqueue_job AS job
        WHERE substr(job.concurrency_key, 8)::integer >= %(open_keys)s
    ) AS ranked
    WHERE ranked.n <= 2
)
"""

REFRESH = """
SELECT django_pgqueue_refresh_concurrency(ARRAY(
    SELECT DISTINCT concurrency_key FROM django_pgqueue_job
), NULL)
"""

CLAIM = claim_params(20)


def _fill(conn, *, rows: int, keys: int) -> None:
    conn.execute(
        "TRUNCATE django_pgqueue_job, django_pgqueue_dependency, django_pgqueue_concurrency"
    )
    conn.execute(FILL, {"rows": rows, "keys": keys})
    conn.execute(BLOCK, {"open_keys": OPEN_KEYS})
    conn.execute(REFRESH)
    conn.execute("VACUUM ANALYZE django_pgqueue_job")
    conn.execute("VACUUM ANALYZE django_pgqueue_concurrency")


def test_claim_cost_is_the_same_with_100000_jobs_waiting_on_10000_keys(open_connection):
    conn = open_connection(prepare=False)
    _fill(conn, rows=1_000, keys=100)
    small, small_claimed, _ = claim_cost(conn, CLAIM)
    _fill(conn, rows=100_000, keys=10_000)
    (at_limit,) = conn.execute(
        "SELECT count(*) FROM django_pgqueue_concurrency WHERE in_flight >= max_in_flight"
    ).fetchone()
    assert at_limit == 10_000 - OPEN_KEYS
    big, big_claimed, big_indexes = claim_cost(conn, CLAIM)
    print(f"claim of 20: {small} buffers at 1,000 jobs, {big} at 100,000 waiting on limits")
    # Both claim a full batch from the keys with free slots (2 each of 20 keys).
    assert small_claimed == 20
    assert big_claimed == 20
    assert "pgq_concurrency_claim" in big_indexes
    assert big <= 2 * small + 500, (small, big)


def test_a_claim_never_fills_more_than_a_keys_free_slots(open_connection):
    conn = open_connection(prepare=False)
    _fill(conn, rows=1_000, keys=100)
    taken = 0
    while True:
        rows = conn.execute(QUERIES["claim_batch"].text, claim_params(500)).fetchall()
        got = [row for row in rows if row[0] is not None]
        if not got:
            break
        taken += len(got)
    # Only the OPEN_KEYS keys had room, two jobs each.
    assert taken == 2 * OPEN_KEYS
    flying = conn.execute(
        "SELECT concurrency_key, count(*) FROM django_pgqueue_job WHERE status = 'processing' "
        "GROUP BY 1 HAVING count(*) <> 2"
    ).fetchall()
    assert flying == []
    (mismatched,) = conn.execute(
        "SELECT count(*) FROM django_pgqueue_concurrency AS conc WHERE conc.in_flight <> ("
        "SELECT count(*) FROM django_pgqueue_job AS job "
        "WHERE job.concurrency_key = conc.concurrency_key AND job.status = 'processing')"
    ).fetchone()
    assert mismatched == 0
