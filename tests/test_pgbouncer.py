"""Producers and a burst worker through a real PgBouncer in transaction mode."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.database import REPO
from tests.pgbouncer import binary, pgbouncer, transactions_served
from tests.workers import WorkerProcess

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        binary() is None,
        reason="the pgbouncer binary is missing: apt-get install pgbouncer (.ci/ensure-pgbouncer)",
    ),
]

ENQUEUE = """
from django_pgqueue.store.values import JobSpec
from django_pgqueue.models import Job
from tests import tasks

for index in range(20):
    tasks.add.enqueue(index, 1)
Job.objects.enqueue_many([JobSpec("tests.tasks.add", args=[index, 2]) for index in range(20)])
for index in range(10):
    tasks.add.using(idempotency_key=f"order-{index}").enqueue(index, 3)
    tasks.add.using(idempotency_key=f"order-{index}").enqueue(index, 3)
"""


def test_enqueue_and_a_burst_worker_through_pgbouncer(db_url, observer, monkeypatch):
    monkeypatch.setenv("PGQUEUE_TEST_PGBOUNCER", "1")
    with pgbouncer(db_url) as bouncer_url:
        env = {
            **os.environ,
            "DATABASE_URL": bouncer_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        }
        subprocess.run(
            [sys.executable, "-m", "tests.manage", "shell", "-c", ENQUEUE],
            cwd=REPO,
            env=env,
            check=True,
            timeout=60,
        )
        assert observer.execute("SELECT count(*) FROM django_pgqueue_job_all").fetchone()[0] == 50
        served = transactions_served(bouncer_url)
        worker = WorkerProcess(bouncer_url, "--burst", "--concurrency", "4")
        try:
            assert worker.wait(90) == 0, worker.output()
        finally:
            worker.stop()
        # The worker's statements went through the bouncer. How many depends on how
        # it batches (adaptive prefetch takes most of the 50 jobs in a few claims), but
        # a burst worker registers, claims, completes, finds nothing more and leaves.
        assert transactions_served(bouncer_url) >= served + 5
    statuses = dict(
        observer.execute(
            "SELECT status, count(*) FROM django_pgqueue_job_all GROUP BY status"
        ).fetchall()
    )
    assert statuses == {"succeeded": 50}
    results = observer.execute(
        "SELECT result::text FROM django_pgqueue_job_all WHERE idempotency_key = 'order-7'"
    ).fetchall()
    assert results == [("10",)]
