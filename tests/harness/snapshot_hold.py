"""Drain under a held snapshot, by hand: the figures of docs/explanation/performance.md.

Workers started as users start them (the shared benchmark's Django project, BENCH_DIR,
default ../shared/bench beside the checkout), a producer that keeps a backlog topped up
(jobs flow at the drain rate), and an idle REPEATABLE READ transaction held open for a
phase. Prints one line per window: completed/s, the job table's dead tuples, the claim
index's size, and the statements running longer than 100 ms.

usage: snapshot_hold.py ADMIN_DSN DBNAME --base S --hold S --after S [--workers 2]
       [--conc 10] [--backlog 20000] [--window 10] [--partitions N | --keys N] [--code PATH]
       [--segments SECONDS [--no-ahead] | --product-segments] [--setting NAME=VALUE ...]
       [--statements]
(the database DBNAME is dropped and created again; --statements needs pg_stat_statements
in the server's shared_preload_libraries)
"""

import argparse
import ast
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

BENCH = os.environ.get("BENCH_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "bench"))
PROJ = f"{BENCH}/systems/django_pgqueue/proj"

args = argparse.ArgumentParser()
args.add_argument("admin_dsn")
args.add_argument("dbname")
args.add_argument("--base", type=float, default=60)
args.add_argument("--hold", type=float, default=120)
args.add_argument("--after", type=float, default=30)
args.add_argument("--workers", type=int, default=2)
args.add_argument("--conc", type=int, default=10)
args.add_argument("--flags", default="")
args.add_argument("--backlog", type=int, default=20000)
args.add_argument("--window", type=float, default=10)
# Jobs spread over this many partition keys (0: plain jobs): the claim then reads
# pgq_partition_claim, whose dead entries a held snapshot keeps too.
args.add_argument("--partitions", type=int, default=0)
# ... or over this many concurrency keys (limit 2 each): pgq_concurrency_claim.
args.add_argument("--keys", type=int, default=0)
args.add_argument("--code", default=str(Path(__file__).resolve().parents[2]))
# The job table in segments (tests/harness/segments.py), a new one every this many
# seconds (0: the table as the migrations leave it).
args.add_argument("--segments", type=float, default=0)
# Attach each segment only at its switch (no empty segment open ahead of the current one).
args.add_argument("--no-ahead", action="store_true")
# The product's segmented job table: manage.py pgqueuesegments enable, then the
# workers' housekeeping rotates it (PGQUEUE_SEGMENT_JOBS, default 100,000).
args.add_argument("--product-segments", action="store_true")
# A Django setting for the workers and the producer, over the benchmark project's
# (PGQUEUE_SEGMENT_JOBS=1000000, say); repeatable. Values are Python literals.
args.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE")
# Where the server's time goes: pg_stat_statements reset as each phase starts, and its
# heaviest statements printed as it ends, per job completed in it.
args.add_argument("--statements", action="store_true")
opts = args.parse_args()

dsn = opts.admin_dsn.rsplit("/", 1)[0] + "/" + opts.dbname
env = dict(os.environ)
env["BENCH_DSN"] = dsn
paths = [opts.code, f"{BENCH}/lib", PROJ]
env["DJANGO_SETTINGS_MODULE"] = "benchproj.settings"
if opts.setting:
    overrides = tempfile.mkdtemp(prefix="snapbench-settings-")
    lines = ["from benchproj.settings import *  # noqa: F403"]
    for item in opts.setting:
        name, _, value = item.partition("=")
        lines.append(f"{name} = {ast.literal_eval(value)!r}")
    Path(overrides, "snapbench_settings.py").write_text("\n".join(lines) + "\n")
    paths.insert(0, overrides)
    env["DJANGO_SETTINGS_MODULE"] = "snapbench_settings"
env["PYTHONPATH"] = ":".join(paths)

with psycopg.connect(opts.admin_dsn, autocommit=True) as admin:
    admin.execute(f'DROP DATABASE IF EXISTS "{opts.dbname}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{opts.dbname}"')
subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=PROJ, env=env, check=True)
if opts.product_segments:
    subprocess.run(
        [sys.executable, "manage.py", "pgqueuesegments", "enable"], cwd=PROJ, env=env, check=True
    )

os.environ.update(env)
sys.path[:0] = paths
import django  # noqa: E402

django.setup()
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
from tests.harness.segments import Rotator, convert  # noqa: E402

if opts.segments:
    with psycopg.connect(dsn, autocommit=True) as setup:
        convert(setup)
from benchtasks.tasks import noop  # noqa: E402

from django_pgqueue.models import Job  # noqa: E402
from django_pgqueue.store.values import JobSpec  # noqa: E402

NOOP_PATH = "benchtasks.tasks.noop"

backend = noop.get_backend()
stop = threading.Event()
enqueued = 0
COMPLETED_SQL = (
    "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables"
    " WHERE relname LIKE 'django_pgqueue_job_history%%'"
)


def completed(conn: psycopg.Connection) -> int:
    return int(conn.execute(COMPLETED_SQL).fetchone()[0])


#: The newest finished job (pgq_hist_id): fresh, where the statistics views lag (a busy
#: backend reports its counts every second, an idle one only after ten).
LAST_FINISHED_SQL = "SELECT coalesce(max(id), 0) FROM django_pgqueue_job_history"


def producer() -> None:
    """Keep about ``--backlog`` jobs outstanding: newest enqueued id minus newest finished.

    Counting finished jobs through the statistics views throttled the producer to one
    backlog per ten seconds whenever the workers' backends reported late (2,100 jobs/s
    with the default backlog), and the drain measured the producer, not the workers.
    """
    global enqueued  # noqa: PLW0603 - one producer thread; read by nobody else
    from django.db import connection

    newest = 0
    with psycopg.connect(dsn, autocommit=True) as fresh:
        while not stop.is_set():
            (finished,) = fresh.execute(LAST_FINISHED_SQL).fetchone()
            if newest - finished < opts.backlog:
                if opts.partitions:
                    specs = [
                        JobSpec(NOOP_PATH, partition_key=f"p{(enqueued + n) % opts.partitions}")
                        for n in range(1000)
                    ]
                    newest = max(job.pk for job in Job.objects.enqueue_many(specs))
                elif opts.keys:
                    specs = [
                        JobSpec(
                            NOOP_PATH,
                            concurrency_key=f"k{(enqueued + n) % opts.keys}",
                            concurrency_limit=2,
                        )
                        for n in range(1000)
                    ]
                    newest = max(job.pk for job in Job.objects.enqueue_many(specs))
                else:
                    results = backend.enqueue_many(noop, [((), {})] * 1000)
                    newest = max(int(result.id) for result in results)
                enqueued += 1000
            else:
                time.sleep(0.02)
    connection.close()


logs = []
workers = []
for n in range(opts.workers):
    # Closed when the process ends: the workers write to them until the very end.
    log = open(f"/tmp/snapbench-worker{n}.log", "w")  # noqa: SIM115
    logs.append(log)
    workers.append(
        subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runqueueworker",
                "--concurrency",
                str(opts.conc),
                *opts.flags.split(),
            ],
            cwd=PROJ,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    )
thread = threading.Thread(target=producer, daemon=True)
thread.start()
rotator = Rotator(dsn, opts.segments, stop, ahead=not opts.no_ahead) if opts.segments else None
if rotator is not None:
    rotator.start()

SAMPLE_SQL = """
SELECT coalesce(sum(stat.n_dead_tup), 0)::bigint, coalesce(sum(stat.n_live_tup), 0)::bigint,
       coalesce(sum(pg_relation_size(stat.relid)), 0)::bigint,
       (SELECT coalesce(sum(pg_relation_size(claim.indexrelid)), 0)::bigint
        FROM pg_index AS claim WHERE claim.indexrelid = 'pgq_job_claim'::regclass
           OR claim.indexrelid IN (SELECT relid FROM pg_partition_tree('pgq_job_claim'))),
       (SELECT count(*) FROM pg_stat_activity WHERE backend_xmin IS NOT NULL)
FROM pg_stat_user_tables AS stat
WHERE stat.relid = 'django_pgqueue_job'::regclass
   OR stat.relid IN (SELECT relid FROM pg_partition_tree('django_pgqueue_job'))
"""

STATEMENTS_SQL = """
SELECT calls, total_exec_time, total_plan_time, shared_blks_hit + shared_blks_read,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 90)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
ORDER BY total_exec_time + total_plan_time DESC LIMIT 20
"""


def print_statements(conn: psycopg.Connection, phase: str, jobs: int) -> None:
    """The heaviest statements since the reset: server µs and buffers per job completed."""
    rows = conn.execute(STATEMENTS_SQL, [opts.dbname]).fetchall()
    total = sum(execute + plan for _, execute, plan, _, _ in rows)
    print(f"STATEMENTS {phase} over {jobs} jobs: {1000 * total / max(jobs, 1):.1f} us/job in these")
    for calls, execute, plan, buffers, text in rows:
        print(
            f"  {1000 * execute / max(jobs, 1):7.1f} us/job exec {1000 * plan / max(jobs, 1):5.1f}"
            f" plan {buffers / max(jobs, 1):6.1f} buf/job {calls:8d} calls  {text}"
        )


holder = None
phases = [("base", opts.base), ("hold", opts.hold), ("after", opts.after)]
rates: dict[str, list[float]] = {}
try:
    with psycopg.connect(dsn, autocommit=True) as stats:
        # warm up: wait until the first jobs complete
        deadline = time.monotonic() + 60
        while completed(stats) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        if opts.statements:
            stats.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            stats.execute("SELECT pg_stat_statements_reset()")
        last_done, last_t = completed(stats), time.monotonic()
        first_done = last_done
        measured = "base"
        for phase, seconds in phases:
            if phase == "hold":
                holder = psycopg.connect(dsn)
                holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
            if phase == "after" and holder is not None:
                holder.rollback()
                holder.close()
                holder = None
            if not seconds:
                continue
            if opts.statements and phase != "base":
                print_statements(stats, measured, last_done - first_done)
                stats.execute("SELECT pg_stat_statements_reset()")
                first_done = last_done
            measured = phase
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(min(opts.window, max(0.0, end - time.monotonic())))
                done, now = completed(stats), time.monotonic()
                rate = (done - last_done) / (now - last_t)
                last_done, last_t = done, now
                dead, live, table, index, xmins = stats.execute(SAMPLE_SQL).fetchone()
                rates.setdefault(phase, []).append(rate)
                slow = stats.execute(
                    "SELECT round(extract(epoch FROM clock_timestamp() - query_start)::numeric, 2),"
                    " coalesce(wait_event_type || ':' || wait_event, 'cpu'),"
                    " left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_activity"
                    " WHERE state = 'active' AND pid <> pg_backend_pid()"
                    " AND clock_timestamp() - query_start > interval '100 ms'"
                ).fetchall()
                for seconds_, waiting, text in slow:
                    print(f"      slow {seconds_}s {waiting} {text}", flush=True)
                if opts.partitions or opts.keys:
                    table_name = (
                        "django_pgqueue_partition"
                        if opts.partitions
                        else "django_pgqueue_concurrency"
                    )
                    (part_dead,) = stats.execute(
                        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s",
                        [table_name],
                    ).fetchone()
                    print(f"      {table_name} rows dead={part_dead}", flush=True)
                if rotator is not None:
                    print(f"      segments {rotator.counts} open={len(rotator.older) + 1}")
                if opts.product_segments:
                    (attached, current) = stats.execute(
                        "SELECT count(*), (SELECT pgq_current_segment()) FROM pg_inherits "
                        "WHERE inhparent = 'django_pgqueue_job'::regclass"
                    ).fetchone()
                    print(f"      segments attached={attached} current={current}", flush=True)
                print(
                    f"{phase:5s} t={now:9.1f} completed/s={rate:8.0f} dead={dead:9d} "
                    f"live={live:8d} table={table / 2**20:7.1f}MB "
                    f"claim_index={index / 2**20:6.1f}MB",
                    flush=True,
                )
        if opts.statements:
            print_statements(stats, measured, last_done - first_done)
    for phase, values in rates.items():
        mean, median = statistics.mean(values), statistics.median(values)
        print(
            f"SUMMARY {phase}: completed/s mean {mean:.0f}, median {median:.0f}, "
            f"{len(values)} windows"
        )
finally:
    stop.set()
    if holder is not None:
        holder.close()
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
