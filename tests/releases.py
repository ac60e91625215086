"""An earlier release's code, for rolling-deploy tests: its workers run from a checkout.

Also what every rolling-deploy test asserts of the workers of both releases.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import psycopg
from django.core.management import call_command
from django.db import connections

from tests.database import REPO
from tests.ledger import entries
from tests.workers import WorkerProcess, wait_for


def previous_release(migration: str) -> str:
    """The commit before the one that added ``migration`` (HEAD if it is not committed)."""
    added = subprocess.run(
        [
            "git",
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            f"django_pgqueue/migrations/{migration}.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


def checkout(commit: str, into: Path) -> None:
    """Extract the package and the tests of ``commit`` into ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "django_pgqueue", "tests"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


@contextmanager
def rolling_deploy(migration: str) -> Iterator[Path]:
    """The test database migrated back to before ``migration``, and the release before
    it checked out: yield the checkout, whose workers and producers then run while the
    test calls :func:`migrate_forward`. Whatever happens, the database is migrated to
    this release again on the way out, for the tests after."""
    call_command("migrate", "django_pgqueue", f"{int(migration[:4]) - 1:04d}", verbosity=0)
    try:
        with tempfile.TemporaryDirectory(prefix="pgqueue-previous-") as tree:
            checkout(previous_release(migration), Path(tree))
            yield Path(tree)
    finally:
        connections.close_all()
        call_command("migrate", "django_pgqueue", verbosity=0)


def migrate_forward(conn: psycopg.Connection[Any]) -> datetime:
    """Run this release's migrations, as a deploy does while the old workers run; return
    the database's clock after them (both releases' workers must run jobs after it)."""
    call_command("migrate", "django_pgqueue", verbosity=0)
    connections.close_all()
    (migrated,) = conn.execute("SELECT clock_timestamp()").fetchone()
    assert isinstance(migrated, datetime)
    return migrated


def stop(*parts: WorkerProcess | LineProducer | None) -> None:
    """Stop the workers and close the producers of a rolling deploy that were started."""
    for part in parts:
        if isinstance(part, LineProducer):
            part.close()
        elif part is not None:
            part.stop()


def succeeded(conn: psycopg.Connection[Any], task: str) -> int:
    """How many jobs of ``task`` succeeded, in either tier."""
    (count,) = conn.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE task_path = %s AND status = 'succeeded'",
        [task],
    ).fetchone()
    return int(count)


def old_worker_runs(conn: psycopg.Connection[Any], task: str, old: WorkerProcess) -> None:
    """Wait until the previous release's worker has run some jobs of ``task``."""
    wait_for(
        lambda: succeeded(conn, task) > 30,
        timeout=120,
        message=f"the old worker to run jobs\n{old.output()}",
    )


def hand_over(
    conn: psycopg.Connection[Any],
    task: str,
    old: WorkerProcess,
    new: WorkerProcess,
    *,
    both_after: int,
    total: int,
) -> None:
    """The end of a rolling deploy: once more than ``both_after`` jobs of ``task``
    succeeded (both workers running), the old worker leaves, and the new one runs the
    rest of the ``total``."""
    wait_for(
        lambda: succeeded(conn, task) > both_after,
        timeout=120,
        message=f"both workers to run jobs\n{old.output()}\n{new.output()}",
    )
    old.stop()
    wait_for(
        lambda: succeeded(conn, task) == total,
        timeout=300,
        message=f"every job to succeed\n{new.output()}",
    )


def python(db_url: str, tree: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """Run ``script`` with the checkout in ``tree`` (its package and test settings), with
    pipes for its input and output."""
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class LineProducer:
    """A producer of an earlier release: a subprocess running ``script``, which prints
    "ready", then for each line it reads (a label) enqueues a batch and prints "done"."""

    def __init__(self, db_url: str, tree: Path, script: str) -> None:
        self.process = python(db_url, tree, script)
        self._expect("ready")

    def _expect(self, word: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != word:
            self.process.kill()
            _, stderr = self.process.communicate(timeout=30)
            raise AssertionError(f"the previous release's producer said {line!r}:\n{stderr}")

    def enqueue(self, label: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{label}\n")
        self.process.stdin.flush()
        self._expect("done")

    def close(self) -> None:
        """End the producer (its input closes) and close its pipes."""
        try:
            self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate(timeout=30)


def assert_logged_no_error(*workers: WorkerProcess | None) -> None:
    """A failed statement (a function or column a migration changed, say) is logged and
    retried, not fatal: the logs of the workers of both releases must show none."""
    for worker in workers:
        if worker is not None:
            assert " ERROR " not in worker.output(), worker.output()


def assert_each_started_once(conn: psycopg.Connection[Any], jobs: int) -> list[dict[str, Any]]:
    """Every one of ``jobs`` jobs started once, by the ledger; return the ledger."""
    ledger = entries(conn)
    starts = [entry for entry in ledger if entry["event"] == "start"]
    assert len(starts) == jobs
    assert len({entry["job_id"] for entry in starts}) == jobs, "a job ran twice"
    return ledger


def assert_partitions_in_order(
    conn: psycopg.Connection[Any], ledger: list[dict[str, Any]]
) -> set[str]:
    """Each partition's jobs in the ledger ran in id order, one at a time; return the
    partition keys."""
    partition_of = dict(
        conn.execute(
            "SELECT id, partition_key FROM django_pgqueue_job_all WHERE partition_key IS NOT NULL"
        ).fetchall()
    )
    ends = {entry["job_id"]: entry["at"] for entry in ledger if entry["event"] == "end"}
    runs: dict[str, list[tuple[Any, Any, int]]] = defaultdict(list)
    for entry in ledger:
        job = entry["job_id"]
        if entry["event"] == "start" and job in partition_of:
            runs[partition_of[job]].append((entry["at"], ends[job], job))
    for key, partition_runs in runs.items():
        partition_runs.sort()
        order = [job for _, _, job in partition_runs]
        assert order == sorted(order), f"partition {key} ran out of id order: {order}"
        for (_, ended, _), (started, _, _) in itertools.pairwise(partition_runs):
            assert started >= ended, f"partition {key} ran two jobs at once"
    return set(runs)


def assert_each_ran_once(
    conn: psycopg.Connection[Any],
    jobs: int,
    workers: Sequence[WorkerProcess],
    *,
    migrated: datetime,
) -> list[dict[str, Any]]:
    """Every one of ``jobs`` jobs started once (the ledger), and each of ``workers``
    started some after ``migrated``; return the ledger."""
    ledger = assert_each_started_once(conn, jobs)
    starts = [entry for entry in ledger if entry["event"] == "start"]
    assert {entry["worker_pid"] for entry in starts if entry["at"] > migrated} == {
        worker.pid for worker in workers
    }, "the old and the new worker both ran jobs after the migration"
    return ledger
