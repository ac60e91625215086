"""A claim's cost does not grow with partition backlog depth or blocked partitions.

EXPLAIN (ANALYZE, BUFFERS) of the real claim statement, run in a transaction that is
rolled back, on 1,000,000 pending partitioned jobs in 10,000 partitions, next to the
same claim on 1,000 jobs in 100 partitions. Buffers, not time: they count the pages a
claim touches, whatever else the machine is doing.
"""

from __future__ import annotations

import pytest

from django_pgqueue.store.sql import QUERIES
from tests.claim_params import claim_params
from tests.plans import claim_cost

pytestmark = pytest.mark.timeout(600)

FILL = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, partition_key, partition_bucket
)
SELECT 'default', 'tests.tasks.noop', '[]', '{}',
    -- Rows behind each head have higher priorities than the heads, and the heads of
    -- partitions numbered ...5 are backing off: the shapes that hid heads from the old
    -- scan window.
    CASE WHEN g <= %(partitions)s THEN 0 ELSE 10 END,
    'pending', 0, 5, 0,
    CASE WHEN g <= %(partitions)s AND g %% 10 = 5 THEN now() + interval '1 hour'
         ELSE now() - interval '1 minute' END,
    now(), '[]',
    'tenant-' || (g %% %(partitions)s), (g %% %(partitions)s) %% 1024
FROM generate_series(1, %(rows)s) AS g
"""

# The even-numbered half of the partitions is busy: their head is processing.
BLOCK = """
UPDATE django_pgqueue_job AS job
SET status = 'processing', attempts = 1, lease_generation = 1, claimed_by = 'other',
    claimed_at = now(), lease_expires_at = now() + interval '1 hour'
WHERE job.id IN (
    SELECT min(head.id) FROM django_pgqueue_job AS head
    WHERE head.partition_key IS NOT NULL
      AND mod(substr(head.partition_key, 8)::integer, 2) = 0
    GROUP BY head.partition_key
)
"""

REFRESH = """
SELECT django_pgqueue_refresh_partitions(ARRAY(
    SELECT DISTINCT partition_key FROM django_pgqueue_job WHERE partition_key IS NOT NULL
))
"""

CLAIM = claim_params(20)


def _fill(conn, *, rows: int, partitions: int) -> None:
    conn.execute("TRUNCATE django_pgqueue_job, django_pgqueue_dependency, django_pgqueue_partition")
    conn.execute(FILL, {"rows": rows, "partitions": partitions})
    conn.execute(BLOCK)
    conn.execute(REFRESH)
    conn.execute("VACUUM ANALYZE django_pgqueue_job")
    conn.execute("VACUUM ANALYZE django_pgqueue_partition")


def test_claim_cost_is_the_same_at_a_million_partitioned_jobs(open_connection):
    conn = open_connection(prepare=False)
    _fill(conn, rows=1_000, partitions=100)
    small, small_claimed, _ = claim_cost(conn, CLAIM)
    _fill(conn, rows=1_000_000, partitions=10_000)
    big, big_claimed, big_indexes = claim_cost(conn, CLAIM)
    print(f"claim of 20: {small} buffers at 1,000 jobs, {big} at 1,000,000")
    # Both claim a full batch: ready heads are found whatever lies behind them.
    assert small_claimed == 20
    assert big_claimed == 20
    assert "pgq_partition_claim" in big_indexes
    # Deeper B-trees cost a page or two per probe; a scan of the backlog would cost
    # thousands of pages.
    assert big <= 2 * small + 500, (small, big)


def test_a_partition_whose_head_is_ready_is_in_the_next_claim(open_connection):
    conn = open_connection(prepare=False)
    _fill(conn, rows=200_000, partitions=2_000)
    # Take every idle partition's head, as workers would, until none is left.
    claimed = 0
    while True:
        rows = conn.execute(QUERIES["claim_batch"].text, claim_params(500)).fetchall()
        got = [row for row in rows if row[0] is not None]
        if not got:
            break
        claimed += len(got)
    # 1,000 partitions were idle; the heads of 200 of them are backing off for an hour.
    assert claimed == 800
    # A backing-off head becomes ready: its partition is claimable at once, however many
    # rows of higher priority are queued behind heads everywhere.
    (key,) = conn.execute(
        "SELECT partition_key FROM django_pgqueue_partition "
        "WHERE running_id IS NULL AND head_available_at > now() ORDER BY partition_key LIMIT 1"
    ).fetchone()
    conn.execute(
        "UPDATE django_pgqueue_job SET available_at = now() WHERE id = "
        "(SELECT head_id FROM django_pgqueue_partition WHERE partition_key = %s)",
        [key],
    )
    conn.execute(QUERIES["fold_signals"].text, {"batch_size": 1000})
    rows = conn.execute(QUERIES["claim_batch"].text, CLAIM).fetchall()
    assert [row[10] for row in rows if row[0] is not None] == [key]
