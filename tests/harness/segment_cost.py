"""What a job costs on the plain and the segmented job table, one connection, no noise
from workers: the figures performance.md compares across PostgreSQL 15 and 18.

Not a test, and not the product. Usage::

    tests/harness/segment_cost.py [ADMIN_DSN] [--segments 3] [--rounds 6]

(without ``ADMIN_DSN``, the test suite's embedded PostgreSQL, started if needed). Two
databases are made and migrated: one with the plain job table, one converted to
``--segments`` segments (``tests/harness/segments.py``). Each gets a backlog of 20,000
ready jobs. Then rounds alternate between them (plain, segmented, segmented, plain,
...): each round is a process of its own that opens a connection as a worker does
(``store/pgconn.py``: prepared statements, generic plans) and repeats, ``--iterations``
times, what a worker and a producer send per batch: the plain claim of ``--batch``
jobs, their completion, and the bulk enqueue of as many new ones. It prints the client's
wall time per job for each kind of statement; the client's own work is the same for
both layouts, so the difference is the server's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BACKLOG = 20_000


def measure(iterations: int, batch: int) -> None:
    """One round, in this process, on DATABASE_URL's database: print µs per job."""
    import django

    django.setup()
    from django_pgqueue.store.pgconn import connect
    from django_pgqueue.store.queue import QueueStore
    from django_pgqueue.store.runners import PsycopgRunner
    from django_pgqueue.store.values import JobSpec

    store = QueueStore(PsycopgRunner(connect("default"), "default"))
    spent = {"claim": 0.0, "complete": 0.0, "enqueue": 0.0}
    jobs = 0
    for iteration in range(iterations + 20):
        if iteration == 20:  # the first ones prepare the statements
            spent = dict.fromkeys(spent, 0.0)
            jobs = 0
        started = time.perf_counter()
        claimed = store.claim_round("w", ["default"], per_queue=batch, lease_seconds=30, plain=True)
        took = time.perf_counter()
        store.complete_many_if_leased("w", [(job.lease, "null") for job in claimed.jobs])
        done = time.perf_counter()
        store.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(batch)])
        spent["claim"] += took - started
        spent["complete"] += done - took
        spent["enqueue"] += time.perf_counter() - done
        jobs += len(claimed.jobs)
    assert jobs == iterations * batch, jobs
    print(" ".join(f"{kind}={seconds * 1e6 / jobs:.1f}" for kind, seconds in spent.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("admin_dsn", nargs="?")
    parser.add_argument("--segments", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.measure:
        measure(opts.iterations, opts.batch)
        return
    import psycopg

    from tests.harness.segment_plans import make_database, segment

    admin_dsn = opts.admin_dsn
    if admin_dsn is None:
        from tests.database import database_url, embedded_server

        embedded_server()
        admin_dsn = database_url()
    dsns = {
        "plain": make_database(admin_dsn, "segcost_plain"),
        "segmented": make_database(admin_dsn, "segcost_segmented"),
    }
    segment(dsns["segmented"], opts.segments, 0)
    for dsn in dsns.values():
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT django_pgqueue_enqueue('tests.tasks.noop') FROM generate_series(1, %s)",
                [BACKLOG],
            )
            conn.execute("VACUUM ANALYZE django_pgqueue_job")
            (version,) = conn.execute("SHOW server_version").fetchone()
    print(f"PostgreSQL {version}; {opts.segments} segments; batches of {opts.batch}")
    results: dict[str, list[dict[str, float]]] = {layout: [] for layout in dsns}
    order = ["plain", "segmented", "segmented", "plain"]
    for round_ in range(opts.rounds):
        layout = order[round_ % len(order)]
        env = {
            **os.environ,
            "DATABASE_URL": dsns[layout],
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        }
        output = subprocess.run(
            [
                sys.executable,
                __file__,
                "--measure",
                "--iterations",
                str(opts.iterations),
                "--batch",
                str(opts.batch),
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        figures = {kind: float(value) for kind, value in (item.split("=") for item in output)}
        results[layout].append(figures)
        print(f"round {round_ + 1}: {layout:9} µs per job: {figures}", flush=True)
    for layout, rounds in results.items():
        medians = {kind: statistics.median(r[kind] for r in rounds) for kind in rounds[0]}
        shown = ", ".join(f"{kind} {value:.1f}" for kind, value in medians.items())
        print(f"{layout:9} medians, µs per job: {shown}; total {sum(medians.values()):.1f}")


if __name__ == "__main__":
    main()
