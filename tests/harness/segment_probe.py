"""A design probe, not product code: can a live job table kept in segments that are
emptied and truncated keep its dead tuples bounded while a snapshot is held?

VACUUM cannot remove a row version an open snapshot may still read; TRUNCATE of a table
gives all of it back at once. So the probe keeps a stand-in job table (claim, complete
and move to a history table, as the queue does) LIST-partitioned by a segment number:
producers insert into the newest segment (a column default), a rotator attaches a new
segment every few seconds (CREATE TABLE, then ATTACH PARTITION: no lock that waits for
the holder), moves the pending stragglers of old segments into the newest one, then
truncates each old segment once it is empty (under ACCESS EXCLUSIVE, after checking, with
a lock timeout) and, with --detach, detaches it CONCURRENTLY and drops it. A claim that
meets a row moved meanwhile gets a serialization failure and is retried.

"single" runs the same claims on one segment that is never rotated. Prints completed/s,
the dead tuples and size of the job partitions, and the rotator's counters per window.

usage: segment_probe.py MODE [--detach] --base S --hold S --after S (MODE: single | segments)
       [--dsn postgres://postgres@127.0.0.1:55432/] (the database segproto is recreated)
"""

import argparse
import contextlib
import threading
import time

import psycopg

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["single", "segments"])
ap.add_argument("--base", type=float, default=30)
ap.add_argument("--hold", type=float, default=60)
ap.add_argument("--after", type=float, default=20)
ap.add_argument("--workers", type=int, default=4)
ap.add_argument("--batch", type=int, default=100)
ap.add_argument("--rotate", type=float, default=5)
ap.add_argument("--keep", type=int, default=2, help="rotations before a segment is emptied")
ap.add_argument("--backlog", type=int, default=20000)
ap.add_argument("--holder-reads-job", action="store_true")
ap.add_argument("--detach", action="store_true")
ap.add_argument("--dsn", default="postgres://postgres@127.0.0.1:55432/")
o = ap.parse_args()

ADMIN = o.dsn + "postgres"
DSN = o.dsn + "segproto"
with psycopg.connect(ADMIN, autocommit=True) as c:
    c.execute("DROP DATABASE IF EXISTS segproto WITH (FORCE)")
    c.execute("CREATE DATABASE segproto")

SCHEMA = """
CREATE TABLE seg_state (id int PRIMARY KEY, current int NOT NULL);
INSERT INTO seg_state VALUES (1, 0);
CREATE FUNCTION seg_current() RETURNS int LANGUAGE sql STABLE
  AS 'SELECT current FROM seg_state WHERE id = 1';
CREATE SEQUENCE job_id;
CREATE TABLE job (
  id bigint NOT NULL DEFAULT nextval('job_id'),
  segment int NOT NULL DEFAULT seg_current(),
  queue text NOT NULL,
  priority int NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  status text NOT NULL DEFAULT 'pending',
  worker text,
  lease_expires_at timestamptz,
  attempts int NOT NULL DEFAULT 0,
  payload jsonb NOT NULL DEFAULT '{}',
  PRIMARY KEY (id, segment)
) PARTITION BY LIST (segment);
CREATE INDEX job_claim ON job (queue, priority, available_at, id) WHERE status = 'pending';
CREATE INDEX job_lease ON job (lease_expires_at) WHERE status = 'processing';
CREATE TABLE job_s0 PARTITION OF job FOR VALUES IN (0);
CREATE TABLE history (id bigint, queue text, finished_at timestamptz DEFAULT now());
CREATE TABLE other (x int);
INSERT INTO other VALUES (1);
"""
with psycopg.connect(DSN, autocommit=True) as c:
    c.execute(SCHEMA)

CLAIM = """
WITH c AS (
  SELECT id, segment FROM job
  WHERE queue = 'q' AND status = 'pending'
    AND (available_at, id) <= (now(), 9223372036854775807::bigint)
  ORDER BY priority, available_at, id
  LIMIT %(n)s FOR UPDATE SKIP LOCKED)
UPDATE job j SET status = 'processing', worker = %(w)s, attempts = attempts + 1,
  lease_expires_at = now() + interval '30 seconds'
FROM c WHERE j.id = c.id AND j.segment = c.segment
RETURNING j.id, j.segment
"""
COMPLETE = """
WITH d AS (
  DELETE FROM job
  WHERE (id, segment) IN (SELECT * FROM unnest(%(ids)s::bigint[], %(segs)s::int[]))
    AND worker = %(w)s AND status = 'processing'
  RETURNING id, queue)
INSERT INTO history (id, queue) SELECT id, queue FROM d
"""

stop = threading.Event()
errors = {"moved": 0, "other": 0}
lock = threading.Lock()


def session(conn):
    conn.execute("SET plan_cache_mode = force_generic_plan", prepare=False)
    conn.execute("SET jit = off", prepare=False)


def worker(n):
    with psycopg.connect(DSN, autocommit=True, prepare_threshold=0) as c:
        session(c)
        w = f"w{n}"
        while not stop.is_set():
            try:
                rows = c.execute(CLAIM, {"n": o.batch, "w": w}).fetchall()
            except psycopg.errors.SerializationFailure:
                with lock:
                    errors["moved"] += 1
                continue
            if not rows:
                time.sleep(0.01)
                continue
            ids, segments = [r[0] for r in rows], [r[1] for r in rows]
            c.execute(COMPLETE, {"ids": ids, "segs": segments, "w": w})


def completed(c):
    return c.execute(
        "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'history'"
    ).fetchone()[0]


def producer():
    with psycopg.connect(DSN, autocommit=True) as c:
        made = 0
        while not stop.is_set():
            if made - completed(c) < o.backlog:
                c.execute("INSERT INTO job (queue) SELECT 'q' FROM generate_series(1, 1000)")
                made += 1000
            else:
                time.sleep(0.02)


rot = {"segments": 1, "truncated": 0, "moved": 0, "truncate_blocked": 0, "lock_ms": 0.0}


def rotator():
    with psycopg.connect(DSN, autocommit=True) as c:
        c.execute("SET lock_timeout = '50ms'")
        live = [0]
        empty = []
        n = 0
        while not stop.wait(o.rotate):
            n += 1
            t0 = time.monotonic()
            c.execute(f"CREATE TABLE job_s{n} (LIKE job INCLUDING DEFAULTS)")
            while True:
                try:
                    c.execute(f"ALTER TABLE job ATTACH PARTITION job_s{n} FOR VALUES IN ({n})")
                    break
                except psycopg.errors.LockNotAvailable:
                    continue
            c.execute("UPDATE seg_state SET current = %s WHERE id = 1", (n,))
            rot["lock_ms"] = max(rot["lock_ms"], (time.monotonic() - t0) * 1000)
            live.append(n)
            rot["segments"] += 1
            # Stragglers of old segments move to the newest; then empty segments go.
            for s in [s for s in live if s <= n - o.keep]:
                while True:
                    cur = c.execute(
                        f"""UPDATE job SET segment = %s WHERE (id, segment) IN (
                              SELECT id, segment FROM job_s{s} WHERE status = 'pending'
                              LIMIT 5000 FOR UPDATE SKIP LOCKED)""",
                        (n,),
                    )
                    rot["moved"] += cur.rowcount
                    if cur.rowcount < 5000:
                        break
                try:
                    with c.transaction():
                        c.execute(f"LOCK TABLE job_s{s} IN ACCESS EXCLUSIVE MODE")
                        if c.execute(f"SELECT 1 FROM job_s{s} LIMIT 1").fetchone() is None:
                            c.execute(f"TRUNCATE job_s{s}")
                            rot["truncated"] += 1
                            live.remove(s)
                            if o.detach:
                                empty.append(s)
                except psycopg.errors.LockNotAvailable:
                    rot["truncate_blocked"] += 1
            # Truncated segments leave the parent, so the claim's Merge Append stays short.
            for s in list(empty):
                try:
                    t1 = time.monotonic()
                    c.execute("SET lock_timeout = '200ms'")
                    c.execute(f"ALTER TABLE job DETACH PARTITION job_s{s} CONCURRENTLY")
                    c.execute(f"DROP TABLE job_s{s}")
                    empty.remove(s)
                    rot["detached"] = rot.get("detached", 0) + 1
                    rot["detach_ms"] = max(rot.get("detach_ms", 0), (time.monotonic() - t1) * 1000)
                except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as e:
                    rot["detach_failed"] = rot.get("detach_failed", 0) + 1
                    rot["detach_err"] = str(e)[:60]
                    with contextlib.suppress(psycopg.Error):
                        c.execute(f"ALTER TABLE job DETACH PARTITION job_s{s} FINALIZE")
                finally:
                    c.execute("SET lock_timeout = '50ms'")


def dead(c):
    return c.execute(
        "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(pg_total_relation_size(relid)), 0)"
        " FROM pg_stat_user_tables WHERE relname LIKE 'job%%'"
    ).fetchone()


threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(o.workers)]
threads.append(threading.Thread(target=producer, daemon=True))
if o.mode == "segments":
    threads.append(threading.Thread(target=rotator, daemon=True))
for t in threads:
    t.start()

rates = {}
with psycopg.connect(DSN, autocommit=True) as mon:
    holder = None
    for phase, secs in (("base", o.base), ("hold", o.hold), ("after", o.after)):
        if phase == "hold":
            holder = psycopg.connect(DSN)
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            table = "job" if o.holder_reads_job else "other"
            holder.execute(f"SELECT count(*) FROM {table}").fetchone()
        if phase == "after" and holder:
            holder.rollback()
            holder.close()
        end = time.monotonic() + secs
        while time.monotonic() < end:
            a = completed(mon)
            t = time.monotonic()
            time.sleep(min(10, max(0.1, end - t)))
            r = (completed(mon) - a) / (time.monotonic() - t)
            rates.setdefault(phase, []).append(r)
            d, size = dead(mon)
            print(
                f"{phase:5} {r:8.0f}/s dead {d:>10} size {float(size) / 1e6:7.1f} MB",
                rot,
                errors,
                flush=True,
            )
stop.set()
for phase, rs in rates.items():
    print(phase, "mean", round(sum(rs) / len(rs)))
