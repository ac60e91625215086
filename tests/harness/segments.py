"""The job table as segments, by hand: the experiment behind performance.md's figures.

Not the product. A prototype of the layout the segmented job table will have, to measure
before building it: :func:`convert` makes the job table a partitioned table (``LIST`` on
a ``segment`` column) whose one partition is the old table, the way a migration would on
a live table (a column with a constant default, a unique index built concurrently, a
``CHECK`` that lets ``ATTACH PARTITION`` skip its scan, and one short transaction for the
swap). :class:`Rotator` attaches a new segment every few seconds, points new jobs at it
(the parent's default reads a sequence), and empties the older ones whole once their
jobs have left: ``DETACH`` and ``DROP`` if it gets the parent's lock within
``lock_timeout``, else ``TRUNCATE``. A segment keeping a job is left alone (a real
rotation must move such jobs on; this one only measures a drain, where none stay).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from tests.key_indexes import _without_backstop

JOB = "django_pgqueue_job"
STORAGE = (
    "fillfactor=75, autovacuum_vacuum_scale_factor=0.02, "
    "autovacuum_vacuum_insert_scale_factor=0.02, autovacuum_analyze_scale_factor=0.02, "
    "autovacuum_vacuum_cost_delay=0"
)

_INDEXES = """
SELECT index_class.relname, pg_get_indexdef(pg_index.indexrelid)
FROM pg_index
JOIN pg_class AS index_class ON index_class.oid = pg_index.indexrelid
WHERE pg_index.indrelid = %s::regclass AND NOT pg_index.indisunique
ORDER BY index_class.relname
"""


def convert(conn: psycopg.Connection[Any]) -> None:
    """Make the job table the first segment of a partitioned job table (autocommit)."""
    conn.execute(f"ALTER TABLE {JOB} ADD COLUMN segment integer NOT NULL DEFAULT 0")
    conn.execute(f"CREATE UNIQUE INDEX CONCURRENTLY pgq_job_s0_key ON {JOB} (id, segment)")
    conn.execute(
        f"ALTER TABLE {JOB} ADD CONSTRAINT pgq_job_segment_0 CHECK (segment = 0) NOT VALID"
    )
    conn.execute(f"ALTER TABLE {JOB} VALIDATE CONSTRAINT pgq_job_segment_0")
    indexes = conn.execute(_INDEXES, [JOB]).fetchall()
    triggers = conn.execute(
        "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
        "WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        [JOB],
    ).fetchall()
    view = conn.execute("SELECT pg_get_viewdef('django_pgqueue_job_all'::regclass)").fetchone()[0]
    conn.execute("CREATE SEQUENCE pgq_segment_seq MINVALUE 0 START 0")
    conn.execute("SELECT nextval('pgq_segment_seq')")
    conn.execute(
        "CREATE FUNCTION pgq_current_segment() RETURNS integer LANGUAGE sql STABLE "
        "AS $$ SELECT last_value::integer FROM pgq_segment_seq $$"
    )
    conn.execute(
        f"CREATE TABLE pgq_job_parent (LIKE {JOB} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        "INCLUDING COMMENTS INCLUDING IDENTITY) PARTITION BY LIST (segment)"
    )
    conn.execute("ALTER TABLE pgq_job_parent DROP CONSTRAINT pgq_job_segment_0")
    conn.execute(
        "ALTER TABLE pgq_job_parent ALTER COLUMN segment SET DEFAULT pgq_current_segment()"
    )
    conn.execute(
        "ALTER TABLE pgq_job_parent ADD CONSTRAINT pgq_job_parent_pkey PRIMARY KEY (id, segment)"
    )
    for name, definition in indexes:
        conn.execute(
            definition.replace(
                f"INDEX {name} ON public.{JOB} ", f"INDEX {name}_p ON ONLY pgq_job_parent "
            )
        )
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '5s'")
        started = time.monotonic()
        conn.execute(f"LOCK TABLE {JOB} IN ACCESS EXCLUSIVE MODE")
        last, called = conn.execute(f"SELECT last_value, is_called FROM {JOB}_id_seq").fetchone()
        conn.execute(
            "SELECT setval(pg_get_serial_sequence('pgq_job_parent', 'id'), %s, %s)", [last, called]
        )
        conn.execute(f"ALTER TABLE {JOB} ALTER COLUMN id DROP IDENTITY")
        conn.execute(f"ALTER TABLE {JOB} DROP CONSTRAINT {JOB}_pkey")
        conn.execute(
            f"ALTER TABLE {JOB} ADD CONSTRAINT {JOB}_s0_pkey PRIMARY KEY USING INDEX pgq_job_s0_key"
        )
        for name, _ in triggers:
            conn.execute(f"DROP TRIGGER {name} ON {JOB}")
        conn.execute(f"ALTER TABLE {JOB} RENAME TO {JOB}_s0")
        conn.execute(f"ALTER TABLE pgq_job_parent RENAME TO {JOB}")
        for name, _ in indexes:
            conn.execute(f"ALTER INDEX {name} RENAME TO {name}_s0")
            conn.execute(f"ALTER INDEX {name}_p RENAME TO {name}")
        conn.execute(f"ALTER INDEX pgq_job_parent_pkey RENAME TO {JOB}_pkey")
        conn.execute(f"ALTER SEQUENCE pgq_job_parent_id_seq RENAME TO {JOB}_id_seq")
        conn.execute(f"ALTER TABLE {JOB} ATTACH PARTITION {JOB}_s0 FOR VALUES IN (0)")
        for _, definition in triggers:
            conn.execute(definition)
        conn.execute(f"CREATE OR REPLACE VIEW django_pgqueue_job_all AS {view}")
        # Its result's row type is the job table's: the old one's, until made again.
        conn.execute(
            "DROP FUNCTION django_pgqueue_enqueue_coalesced(text, text, jsonb, jsonb, integer, "
            "integer, timestamptz, float8, text, text, integer, text, text, integer, integer, "
            "float8, text, text)"
        )
        conn.execute(_without_backstop())
        swap = time.monotonic() - started
    for name in ("pgq_job_idempotency_key", "pgq_job_coalesce_key"):
        conn.execute(f"DROP INDEX CONCURRENTLY {name}")
    print(f"converted: swap held the job table's lock {swap * 1000:.0f} ms", flush=True)


class Rotator(threading.Thread):
    """A new segment every ``every`` seconds; older ones emptied whole once drained."""

    def __init__(
        self, dsn: str, every: float, stop: threading.Event, *, ahead: bool = True
    ) -> None:
        super().__init__(daemon=True)
        self.dsn, self.every, self.stop, self.ahead = dsn, every, stop, ahead
        self.current = 0
        self.older: list[int] = []
        self.counts = dict.fromkeys(
            ("attached", "dropped", "truncated", "kept", "busy", "waited"), 0
        )

    def run(self) -> None:
        if not self.ahead:
            self.run_at_switch()
            return
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            # One segment ahead: a statement whose transaction took the parent's lock
            # before a segment was attached routes rows with the partitions it saw then,
            # so new jobs are pointed at a segment only once every writer older than its
            # ATTACH has ended (pg_locks), as CREATE INDEX CONCURRENTLY waits.
            attached_at = self.attach(conn, self.current + 1)
            while not self.stop.wait(self.every):
                if self.writers_before(conn, attached_at):
                    self.counts["waited"] += 1
                else:
                    self.switch(conn)
                    attached_at = self.attach(conn, self.current + 1)
                self.empty_older(conn)

    def writers_before(self, conn: psycopg.Connection[Any], moment: Any) -> int:
        return conn.execute(
            "SELECT count(*) FROM pg_locks AS lock JOIN pg_stat_activity AS activity "
            "ON activity.pid = lock.pid WHERE lock.relation = %s::regclass "
            "AND lock.mode = 'RowExclusiveLock' AND activity.xact_start < %s",
            [JOB, moment],
        ).fetchone()[0]

    def attach(self, conn: psycopg.Connection[Any], new: int) -> Any:
        table = f"{JOB}_s{new}"
        conn.execute(
            f"CREATE TABLE {table} (LIKE {JOB} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
            f"WITH ({STORAGE})"
        )
        for name, definition in conn.execute(_INDEXES, [JOB]).fetchall():
            conn.execute(
                definition.replace(
                    f"INDEX {name} ON ONLY public.{JOB} ", f"INDEX {name}_s{new} ON {table} "
                )
            )
        conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (id, segment)")
        conn.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT pgq_job_segment_{new} CHECK (segment = {new})"
        )
        conn.execute(f"ALTER TABLE {JOB} ATTACH PARTITION {table} FOR VALUES IN ({new})")
        self.counts["attached"] += 1
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]

    def empty(self, conn: psycopg.Connection[Any], segment: int) -> None:
        table = f"{JOB}_s{segment}"
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '50ms'")
                conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                if conn.execute(f"SELECT EXISTS (SELECT FROM {table})").fetchone()[0]:
                    self.counts["kept"] += 1
                    return
                conn.execute(f"TRUNCATE {table}")
        except psycopg.errors.LockNotAvailable:
            self.counts["busy"] += 1
            return
        self.counts["truncated"] += 1
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '50ms'")
                conn.execute(f"ALTER TABLE {JOB} DETACH PARTITION {table}")
                conn.execute(f"DROP TABLE {table}")
        except psycopg.errors.LockNotAvailable:
            return
        self.older.remove(segment)
        self.counts["dropped"] += 1

    def run_at_switch(self) -> None:
        """Attach each segment only when switching to it, then wait out older writers.

        No empty segment stands open between switches, so a statement that finds a job
        by id probes one segment fewer; the switch waits (polling pg_locks) for the
        transactions that took the parent's lock before the ATTACH.
        """
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(self.every):
                attached_at = self.attach(conn, self.current + 1)
                if self.writers_before(conn, attached_at):
                    self.counts["waited"] += 1
                    while self.writers_before(conn, attached_at):
                        if self.stop.wait(0.01):
                            return
                self.switch(conn)
                self.empty_older(conn)

    def switch(self, conn: psycopg.Connection[Any]) -> None:
        """Point new jobs at the next segment (attached, and no older writer left)."""
        conn.execute("SELECT setval('pgq_segment_seq', %s)", [self.current + 1])
        self.older.append(self.current)
        self.current += 1

    def empty_older(self, conn: psycopg.Connection[Any]) -> None:
        for segment in list(self.older):
            self.empty(conn, segment)
