"""The upgrade to migration 0024 on a live partitioned queue: a rolling deploy.

The test database goes back to migration 0023. A worker running the previous release's
code (``git archive`` of the commit before 0024) drains partitioned jobs whose signals
name no job, while ``migrate`` runs; a worker of this release joins, producers of both
kinds keep enqueueing (the SQL function before and after the migration, and this
release's statements), the old worker leaves. At the end every job ran exactly once, and
in each partition one job at a time, in id order.
"""

from __future__ import annotations

import pytest

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import JobSpec
from tests.releases import (
    assert_each_ran_once,
    assert_logged_no_error,
    assert_partitions_in_order,
    hand_over,
    migrate_forward,
    old_worker_runs,
    rolling_deploy,
    stop,
)
from tests.workers import WorkerProcess

pytestmark = [pytest.mark.timeout(600), pytest.mark.soak]

PARTITIONS = 20
#: Jobs per batch; three batches: before the migration, during it, after it.
BATCH = 300
TASK = "tests.tasks.ledger_sleep"


def _enqueue_sql(conn, label: str) -> None:
    """BATCH jobs over PARTITIONS keys through the SQL function (either release's)."""
    conn.execute(
        "SELECT django_pgqueue_enqueue(%s, kwargs => jsonb_build_object('label', %s || g), "
        "partition_key => 'part-' || (g %% %s)) FROM generate_series(1, %s) AS g",
        [TASK, label, PARTITIONS, BATCH],
    )


def test_old_and_new_workers_keep_partition_order_across_migration_0024(db_url, open_connection):
    conn = open_connection()
    with rolling_deploy("0024_refresh_from_bounds") as old_tree:
        _enqueue_sql(conn, "before-")
        (signals,) = conn.execute("SELECT count(*) FROM django_pgqueue_partition_signal").fetchone()
        assert signals == BATCH
        old = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4", cwd=old_tree)
        new = None
        try:
            old_worker_runs(conn, TASK, old)
            migrated = migrate_forward(conn)
            # The SQL function now names each signal's job; the old worker folds
            # those signals with the functions it knows.
            _enqueue_sql(conn, "during-")
            new = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4")
            producer = QueueStore(PsycopgRunner(open_connection(), "default"))
            producer.enqueue_many(
                [
                    JobSpec(
                        TASK,
                        kwargs={"label": f"after-{n}"},
                        partition_key=f"part-{n % PARTITIONS}",
                    )
                    for n in range(BATCH)
                ]
            )
            hand_over(conn, TASK, old, new, both_after=BATCH + 30, total=3 * BATCH)
        finally:
            stop(old, new)
        assert_logged_no_error(old, new)
        ledger = assert_each_ran_once(conn, 3 * BATCH, [old, new], migrated=migrated)
        assert assert_partitions_in_order(conn, ledger) == {f"part-{n}" for n in range(PARTITIONS)}
