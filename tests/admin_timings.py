"""Time the admin pages and the metrics scrape on a million-row job table (not a test).

Usage, against a scratch database (created and migrated if needed, seeded if empty)::

    DATABASE_URL=postgresql://.../pgq_admin_timings python -m tests.admin_timings [--runs 7]

Each page is fetched with the Django test client ``--runs`` times after one warm-up;
the median, fastest and slowest wall-clock times and the number of SQL queries are
printed. Nothing is asserted: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import django
import psycopg

#: (label, URL name, URL arguments or None, query string).
PAGES: list[tuple[str, str, tuple[Any, ...] | None, str]] = [
    ("inbox", "admin:django_pgqueue_job_changelist", None, ""),
    ("inbox, page 20", "admin:django_pgqueue_job_changelist", None, "p=20"),
    ("metrics scrape (all queues)", "pgqueue-metrics", None, ""),
    ("inbox, status=pending", "admin:django_pgqueue_job_changelist", None, "status=pending"),
    ("inbox, status=ready", "admin:django_pgqueue_job_changelist", None, "status=ready"),
    ("inbox, status=scheduled", "admin:django_pgqueue_job_changelist", None, "status=scheduled"),
    ("inbox, status=expired", "admin:django_pgqueue_job_changelist", None, "status=expired"),
    ("inbox, status=succeeded", "admin:django_pgqueue_job_changelist", None, "status=succeeded"),
    ("inbox, status=cancelled", "admin:django_pgqueue_job_changelist", None, "status=cancelled"),
    ("inbox, queue=emails", "admin:django_pgqueue_job_changelist", None, "queue=emails"),
    ("inbox, queue=low (rare)", "admin:django_pgqueue_job_changelist", None, "queue=low"),
    (
        "inbox, task (rare)",
        "admin:django_pgqueue_job_changelist",
        None,
        "task=maintenance.tasks.rebuild_search_index",
    ),
    (
        "inbox, partition key",
        "admin:django_pgqueue_job_changelist",
        None,
        "partition_key=customer-75",
    ),
    ("inbox, search id", "admin:django_pgqueue_job_changelist", None, "q={job_id}"),
    ("inbox, search key", "admin:django_pgqueue_job_changelist", None, "q=order-3"),
    ("inbox, created 1 h, 40 h ago", "admin:django_pgqueue_job_changelist", None, "{created}"),
    ("inbox, finished 1 h, 40 h ago", "admin:django_pgqueue_job_changelist", None, "{finished}"),
    ("job detail (dead letter)", "admin:django_pgqueue_job_change", ("{dead_id}",), ""),
    ("job detail (partitioned)", "admin:django_pgqueue_job_change", ("{partitioned_id}",), ""),
    ("dead letters", "admin:django_pgqueue_deadletter_changelist", None, ""),
    (
        "dead letters, queue=reports",
        "admin:django_pgqueue_deadletter_changelist",
        None,
        "queue=reports",
    ),
    ("dead letters, grouped", "admin:django_pgqueue_deadletter_groups", None, ""),
    ("lag", "admin:django_pgqueue_lag", None, ""),
    ("workers", "admin:django_pgqueue_worker_changelist", None, ""),
]


def main() -> None:
    """Seed if needed, then time every page."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--only", default="", help="Time only the pages whose label has this.")
    options = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("Set DATABASE_URL to a scratch database (it is migrated and seeded).")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()

    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    from tests.admin_seed import seed

    url = os.environ["DATABASE_URL"]
    call_command("migrate", verbosity=0)
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT NOT EXISTS (SELECT FROM django_pgqueue_job_all)").fetchone()[0]:
            print(f"seeding {options.finished:,} finished jobs...", flush=True)
            seed(conn, finished=options.finished)
        rows = conn.execute("SELECT count(*) FROM django_pgqueue_job_all").fetchone()[0]
        dead_id = conn.execute(
            "SELECT max(id) FROM django_pgqueue_job_all WHERE status = 'dead_letter'"
        ).fetchone()[0]
        partitioned_id = conn.execute(
            "SELECT max(id) FROM django_pgqueue_job_all "
            "WHERE status = 'pending' AND partition_key IS NOT NULL"
        ).fetchone()[0]
        job_id = conn.execute("SELECT max(id) - 500000 FROM django_pgqueue_job_all").fetchone()[0]
    print(f"{rows:,} jobs in the table; PostgreSQL {connection.pg_version}", flush=True)

    user, _ = User.objects.get_or_create(
        username="timings", defaults={"is_staff": True, "is_superuser": True}
    )
    setup_test_environment()
    settings.DEBUG = True  # count queries
    client = Client()
    client.force_login(user)
    ago = time.gmtime(time.time() - 40 * 3600)
    date, hour = time.strftime("%Y-%m-%d", ago), time.strftime("%H:00:00", ago)
    end = time.strftime("%H:59:59", ago)
    ranges = {
        field: f"{field}__range__gte_0={date}&{field}__range__gte_1={hour}"
        f"&{field}__range__lte_0={date}&{field}__range__lte_1={end}"
        for field in ("created_at", "finished_at")
    }
    values = {
        "job_id": job_id,
        "dead_id": dead_id,
        "partitioned_id": partitioned_id,
        "created": ranges["created_at"],
        "finished": ranges["finished_at"],
    }

    print(f"\n{'page':34} {'median':>8} {'min':>8} {'max':>8} {'queries':>8}")
    for label, name, args, query in PAGES:
        if options.only not in label:
            continue
        path = reverse(name, args=[str(a).format(**values) for a in args] if args else None)
        target = f"{path}?{query.format(**values)}" if query else path
        samples = []
        queries = 0
        for run in range(options.runs + 1):
            reset_queries()
            start = time.perf_counter()
            response = client.get(target)
            elapsed = time.perf_counter() - start
            if response.status_code != 200:
                sys.exit(f"{label}: HTTP {response.status_code} for {target}")
            if run:  # the first fetch warms caches and is not counted
                samples.append(elapsed * 1000)
            queries = len(connection.queries)
        print(
            f"{label:34} {statistics.median(samples):7.1f}ms {min(samples):7.1f}ms "
            f"{max(samples):7.1f}ms {queries:8d}",
            flush=True,
        )


if __name__ == "__main__":
    main()
