"""The upgrade to migration 0028 on a live queue of idempotent jobs: a rolling deploy.

The test database goes back to migration 0027. A worker and a producer running the
previous release's code (``git archive`` of the commit before 0028) run and enqueue
jobs with idempotency keys, each key given twice, while ``migrate`` replaces the trigger
that takes a new job's key; a worker of this release joins, this release's producer
enqueues too, and the old worker leaves. Every key got one job, every job ran exactly
once, both workers ran jobs after the migration, and neither logged an error.
"""

from __future__ import annotations

import pytest

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.values import JobSpec
from tests.releases import (
    LineProducer,
    assert_each_ran_once,
    assert_logged_no_error,
    hand_over,
    migrate_forward,
    old_worker_runs,
    rolling_deploy,
    stop,
)
from tests.workers import WorkerProcess

pytestmark = [pytest.mark.timeout(600), pytest.mark.soak]

#: Keys per batch, each enqueued twice; three batches: before, during and after.
BATCH = 200
TASK = "tests.tasks.ledger_sleep"
#: Each job's run: long enough for both workers to take jobs after the migration.
SECONDS = 0.02

#: The previous release's producer: on each line ``label``, every key of the batch twice.
OLD_PRODUCER = f"""
import sys
import django
django.setup()
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
print("ready", flush=True)
for line in sys.stdin:
    label = line.strip()
    for _ in range(2):
        Job.objects.enqueue_many([
            JobSpec({TASK!r}, kwargs={{"label": f"{{label}}{{n}}", "seconds": {SECONDS}}},
                    idempotency_key=f"{{label}}{{n}}")
            for n in range({BATCH})
        ])
    print("done", flush=True)
"""


def _enqueue(store: QueueStore, label: str) -> None:
    """This release's producer: every key of the batch ``label`` once."""
    store.enqueue_many(
        [
            JobSpec(
                TASK,
                kwargs={"label": f"{label}{n}", "seconds": SECONDS},
                idempotency_key=f"{label}{n}",
            )
            for n in range(BATCH)
        ]
    )


def test_old_and_new_releases_keep_one_job_per_key_across_migration_0028(db_url, open_connection):
    conn = open_connection()
    with rolling_deploy("0028_claim_key_lets_moves_through") as old_tree:
        producer = LineProducer(db_url, old_tree, OLD_PRODUCER)
        old = new = None
        try:
            producer.enqueue("before-")
            old = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4", cwd=old_tree)
            old_worker_runs(conn, TASK, old)
            migrated = migrate_forward(conn)
            producer.enqueue("during-")
            new = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4")
            this_release = QueueStore(PsycopgRunner(open_connection(), "default"))
            for _ in range(2):
                _enqueue(this_release, "after-")
            # Keys the old producer took before the migration, given again by both.
            producer.enqueue("before-")
            _enqueue(this_release, "during-")
            hand_over(conn, TASK, old, new, both_after=BATCH + 30, total=3 * BATCH)
        finally:
            stop(producer, old, new)
        assert_logged_no_error(old, new)
        assert_each_ran_once(conn, 3 * BATCH, [old, new], migrated=migrated)
        keys = conn.execute(
            "SELECT count(DISTINCT idempotency_key), count(*) FROM django_pgqueue_job_all "
            "WHERE task_path = %s",
            [TASK],
        ).fetchone()
        assert keys == (3 * BATCH, 3 * BATCH)
