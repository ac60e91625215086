"""The upgrade to migration 0025 on a live queue of concurrency keys: a rolling deploy.

The test database goes back to migration 0024. A worker and a producer running the
previous release's code (``git archive`` of the commit before 0025) drain and enqueue
jobs under concurrency keys while ``migrate`` runs (0025 and every later migration, as
a user upgrading from that release does). The old producer's signals name no job, so
after the migration the folds of both releases must look each key's best ready job up;
a worker of this release joins, this release's producer enqueues too, and the old
worker leaves. At the end every job ran exactly once, no key ran more than its limit at
once, and both workers ran jobs after the migration without an error logged.
"""

from __future__ import annotations

from collections import defaultdict

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

KEYS = 20
LIMIT = 2
#: Jobs per batch; three batches: before the migration, during it, after it.
BATCH = 300
TASK = "tests.tasks.ledger_sleep"
#: Each job's run: long enough for a key's runs to overlap if its limit were not kept.
SECONDS = 0.05

#: The previous release's producer: on each line ``label``, BATCH jobs spread over the
#: keys, enqueued with that release's statements (a signal naming no job per key).
OLD_PRODUCER = f"""
import sys
import django
django.setup()
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
print("ready", flush=True)
for line in sys.stdin:
    label = line.strip()
    Job.objects.enqueue_many([
        JobSpec({TASK!r}, kwargs={{"label": f"{{label}}{{n}}", "seconds": {SECONDS}}},
                concurrency_key=f"key-{{n % {KEYS}}}", concurrency_limit={LIMIT})
        for n in range({BATCH})
    ])
    print("done", flush=True)
"""


def _most_at_once(runs: list[tuple[object, object]]) -> int:
    """The most runs that overlapped at one moment (an end before a start at a tie)."""
    events = sorted([(start, 1) for start, _ in runs] + [(end, -1) for _, end in runs])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def test_old_and_new_workers_keep_key_limits_across_migration_0025(db_url, open_connection):
    conn = open_connection()
    with rolling_deploy("0025_fold_keys_by_claim_order") as old_tree:
        producer = LineProducer(db_url, old_tree, OLD_PRODUCER)
        old = new = None
        try:
            producer.enqueue("before-")
            old = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4", cwd=old_tree)
            old_worker_runs(conn, TASK, old)
            migrated = migrate_forward(conn)
            # Signals naming no job, folded by the old worker's two-argument call
            # and by the new worker's, once it starts.
            producer.enqueue("during-")
            new = WorkerProcess(db_url, "--queue", "default", "--concurrency", "4")
            this_release = QueueStore(PsycopgRunner(open_connection(), "default"))
            this_release.enqueue_many(
                [
                    JobSpec(
                        TASK,
                        kwargs={"label": f"after-{n}", "seconds": SECONDS},
                        concurrency_key=f"key-{n % KEYS}",
                        concurrency_limit=LIMIT,
                    )
                    for n in range(BATCH)
                ]
            )
            hand_over(conn, TASK, old, new, both_after=BATCH + 30, total=3 * BATCH)
        finally:
            stop(producer, old, new)
        assert_logged_no_error(old, new)
        ledger = assert_each_ran_once(conn, 3 * BATCH, [old, new], migrated=migrated)
        starts = [entry for entry in ledger if entry["event"] == "start"]
        key_of = dict(
            conn.execute(
                "SELECT id, concurrency_key FROM django_pgqueue_job_all WHERE task_path = %s",
                [TASK],
            ).fetchall()
        )
        ends = {entry["job_id"]: entry["at"] for entry in ledger if entry["event"] == "end"}
        runs: dict[str, list[tuple[object, object]]] = defaultdict(list)
        for entry in starts:
            runs[key_of[entry["job_id"]]].append((entry["at"], ends[entry["job_id"]]))
        assert set(runs) == {f"key-{n}" for n in range(KEYS)}
        for key, key_runs in runs.items():
            assert _most_at_once(key_runs) <= LIMIT, f"{key} ran more than {LIMIT} at once"
