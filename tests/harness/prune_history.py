"""Pruning a history partition of N rows, by hand: the figure of docs/explanation/performance.md.

Makes a database (dropped first if it exists) and migrates it, writes the retention
classes and partitions as housekeeping does, then for each size in ``--rows`` fills a
partition of succeeded jobs whose day ended 40 days ago with that many rows and times
housekeeping's prune (``django_pgqueue_prune_history``), with the WAL it writes. A
checkpoint comes before each prune, so the WAL figure includes the full-page images
the catalog changes cost, as it would in production.

usage: python tests/harness/prune_history.py ADMIN_DSN DBNAME [--rows 1000000 10000000]
"""

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[2]

args = argparse.ArgumentParser()
args.add_argument("admin_dsn")
args.add_argument("dbname")
args.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
opts = args.parse_args()

dsn = opts.admin_dsn.rsplit("/", 1)[0] + "/" + opts.dbname
with psycopg.connect(opts.admin_dsn, autocommit=True) as admin:
    admin.execute(f'DROP DATABASE IF EXISTS "{opts.dbname}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{opts.dbname}"')
env = {**os.environ, "DATABASE_URL": dsn, "DJANGO_SETTINGS_MODULE": "tests.settings"}
subprocess.run(
    [sys.executable, "-m", "tests.manage", "migrate", "-v", "0"], cwd=REPO, env=env, check=True
)
# Classes and partitions as the first housekeeping pass writes them.
subprocess.run(
    [
        sys.executable,
        "-c",
        "import django; django.setup()\n"
        "from django_pgqueue.models import Job\n"
        "from django_pgqueue.worker.history import maintain_history\n"
        "from django.db import transaction\n"
        "with transaction.atomic():\n"
        "    print(maintain_history(Job.objects.store()))\n",
    ],
    cwd=REPO,
    env=env,
    check=True,
)

FILL = """
INSERT INTO {partition} (id, queue, task_path, args, kwargs, priority, status, attempts,
    max_attempts, lease_generation, available_at, created_at, finished_at, errors,
    history_class)
SELECT g, 'default', 'tests.tasks.noop', '[]', '{{}}', 0, 'succeeded', 1, 5, 1,
    %(day)s, %(day)s, %(day)s + make_interval(secs => g %% 86000), '[]', %(cls)s
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""

with psycopg.connect(dsn, autocommit=True) as conn:
    (cls,) = conn.execute(
        "SELECT id FROM django_pgqueue_history_class WHERE status = 'succeeded' AND queue IS NULL"
    ).fetchone()
    # Succeeded jobs kept a day (PGQUEUE_RETENTION), as a setting would say.
    conn.execute(
        "UPDATE django_pgqueue_history_class SET keep_seconds = 86400 WHERE id = %s", [cls]
    )
    parent = f"django_pgqueue_job_history_c{cls}"
    first = 1
    for rows in opts.rows:
        (day,) = conn.execute("SELECT date_trunc('day', now()) - interval '40 days'").fetchone()
        partition = f"{parent}_prune_{rows}"
        conn.execute(f"CREATE TABLE {partition} (LIKE {parent} INCLUDING DEFAULTS)")
        end = day + timedelta(days=1)
        conn.execute(
            f"ALTER TABLE {parent} ATTACH PARTITION {partition} "
            f"FOR VALUES FROM ('{day.isoformat()}') TO ('{end.isoformat()}')"
        )
        started = time.monotonic()
        conn.execute(
            FILL.format(partition=partition),
            {"day": day, "cls": cls, "first": first, "last": first + rows - 1},
        )
        first += rows
        conn.execute(f"VACUUM ANALYZE {partition}")
        (size,) = conn.execute(
            "SELECT pg_size_pretty(pg_total_relation_size(%s::regclass))", [partition]
        ).fetchone()
        print(f"{rows:,} rows written in {time.monotonic() - started:.0f} s ({size})", flush=True)
        conn.execute("CHECKPOINT")
        (before,) = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '2s'")
            started = time.monotonic()
            pruned = conn.execute(
                "SELECT dropped, rows_estimate, deferred, deleted "
                "FROM django_pgqueue_prune_history(50, 0)"
            ).fetchone()
        took = time.monotonic() - started
        (wal,) = conn.execute(
            "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s))", [before]
        ).fetchone()
        print(
            f"  pruned (dropped, rows estimate, deferred, deleted) = {pruned}: "
            f"{took * 1000:.0f} ms including the commit, {wal} of WAL",
            flush=True,
        )
