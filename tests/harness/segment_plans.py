"""Every job-table statement's plan on the segmented layout: which segments it reads.

Not a test, and not the product: the review the segmented job table needs before it is
built (performance.md, "A job table in segments, tried by hand"). Usage::

    tests/harness/segment_plans.py ADMIN_DSN DBNAME [--segments N]

makes a database of that name (dropped first), migrates it with the test settings,
queues jobs of every kind (plain, partitioned, under a key, scheduled, running, expired)
in each of N segments (3 by default; ``tests/harness/segments.py`` converts the table and
attaches them), and then runs every statement of ``tests/test_indexes.py``'s list and the
bulk enqueue under ``EXPLAIN ANALYZE``, rolled back, as a worker's prepared statement
(generic plan) and with its parameters (custom plan). For each it prints the segments
whose scans ran, the ones pruned when the plan started, and any sequential scan of a
segment. A statement that finds jobs by id reads every segment's primary key: the id
alone does not say which segment holds the job.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SEGMENT = re.compile(r"^django_pgqueue_job_s(\d+)$")

SEED = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, lease_expires_at, available_at, created_at,
    errors, partition_key, partition_bucket, concurrency_key, concurrency_limit
)
SELECT 'default', 'tests.tasks.noop', '[]', '{}', 0,
    CASE WHEN g %% 10 = 0 THEN 'processing' ELSE 'pending' END,
    CASE WHEN g %% 10 = 0 THEN 1 ELSE 0 END, 5, CASE WHEN g %% 10 = 0 THEN 1 ELSE 0 END,
    CASE WHEN g %% 10 = 0 THEN 'w' END, CASE WHEN g %% 10 = 0 THEN now() END,
    CASE WHEN g %% 10 = 0 THEN now() + CASE WHEN g %% 20 = 0 THEN interval '-1 minute'
        ELSE interval '30 seconds' END END,
    now() + CASE WHEN g %% 7 = 0 THEN interval '1 hour' ELSE interval '0' END, now(), '[]',
    CASE WHEN g %% 3 = 1 THEN 'part-' || (g %% 50) END,
    CASE WHEN g %% 3 = 1 THEN (g %% 50) END,
    CASE WHEN g %% 3 = 2 THEN 'key-' || (g %% 50) END,
    CASE WHEN g %% 3 = 2 THEN 2 END
FROM generate_series(1, %(rows)s) AS g
"""


def segments_read(plan: dict[str, Any]) -> tuple[set[int], int, set[int]]:
    """(segments whose scans ran, subplans pruned at start-up, segments scanned in full)."""
    from tests.plans import walk

    ran: set[int] = set()
    sequential: set[int] = set()
    pruned = 0
    for node in walk(plan):
        pruned += node.get("Subplans Removed", 0)
        match = SEGMENT.match(str(node.get("Relation Name", "")))
        if match and node.get("Actual Loops", 0) > 0:
            ran.add(int(match.group(1)))
            if node["Node Type"] == "Seq Scan":
                sequential.add(int(match.group(1)))
    return ran, pruned, sequential


def make_database(admin_dsn: str, dbname: str) -> str:
    """Create ``dbname`` anew, migrate it with the test settings; return its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=dbname)
    env = {**os.environ, "DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run(
        [sys.executable, "-m", "tests.manage", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    return dsn


def segment(dsn: str, segments: int, rows: int) -> None:
    """Convert the job table and give it ``segments`` segments of ``rows`` jobs each."""
    from tests.harness.segments import Rotator, convert

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SEED, {"rows": rows})
        convert(conn)
        rotator = Rotator(dsn, 0, None)  # type: ignore[arg-type]
        for _ in range(segments - 1):
            rotator.attach(conn, rotator.current + 1)
            rotator.switch(conn)
            conn.execute(SEED, {"rows": rows})
        conn.execute("VACUUM ANALYZE django_pgqueue_job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("admin_dsn")
    parser.add_argument("dbname")
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--rows", type=int, default=3000, help="jobs per segment")
    opts = parser.parse_args()
    dsn = make_database(opts.admin_dsn, opts.dbname)
    segment(dsn, opts.segments, opts.rows)
    os.environ.update({"DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    import django

    django.setup()
    from django_pgqueue.store.sql import QUERIES
    from django_pgqueue.store.values import JobSpec
    from tests.claim_params import enqueue_many_params
    from tests.plans import explain
    from tests.test_indexes import PARAMS

    with psycopg.connect(dsn, autocommit=True) as conn:
        specs = [
            JobSpec("tests.tasks.noop"),
            JobSpec("tests.tasks.noop", partition_key="part-1"),
            JobSpec("tests.tasks.noop", concurrency_key="key-2", concurrency_limit=2),
        ]
        statements = {**PARAMS, "enqueue_many": enqueue_many_params(specs)}
        # The lists' statements by id name jobs 1 to 3: all in the first segment.
        print(f"{opts.segments} segments, {opts.rows} jobs each")
        print(f"{'statement':32} {'plan':8} {'segments read':16} {'pruned at start':16} seq scans")
        for name, params in statements.items():
            for generic in (True, False):
                try:
                    with conn.transaction(force_rollback=True):
                        plan = explain(
                            conn, QUERIES[name].text, params, generic=generic, analyze=True
                        )
                except psycopg.Error as error:
                    print(f"{name:32} {'generic' if generic else 'custom':8} failed: {error}")
                    continue
                ran, pruned, sequential = segments_read(plan)
                print(
                    f"{name:32} {'generic' if generic else 'custom':8} "
                    f"{','.join(map(str, sorted(ran))) or '-':16} {pruned:<16} "
                    f"{','.join(map(str, sorted(sequential))) or '-'}"
                )


if __name__ == "__main__":
    main()
