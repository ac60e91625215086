"""The job table into segments and back, on a live table: prepare, enable, disable."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db.migrations.loader import MigrationLoader
from psycopg import sql

from django_pgqueue.store.schema import APP_LABEL
from django_pgqueue.store.segments.catalog import (
    CURRENT,
    FIRST_KEY,
    IDEMPOTENCY,
    JOB_TABLE,
    PARENT,
    PARKED,
    PARKED_TABLE,
    PLAIN_KEY,
    RETIRED,
    SAVED,
    SEGMENTS,
    SEQUENCE,
    UNIQUE_KEYS,
    VIEW,
    SegmentLayoutError,
    SwapReport,
    copy_index_comment,
    functions_of_row_type,
    has_column,
    has_constraint,
    index_definition,
    invalid_indexes,
    jobs_per_segment,
    layout,
    one_row,
    plain_indexes,
    relkind,
    retarget_index,
    save_definition,
    saved_definitions,
    segment_table,
    sql_literal,
    trigger_definitions,
    unique_indexes,
    view_definition,
)
from django_pgqueue.store.segments.functions import make_layout_free
from django_pgqueue.store.segments.locking import (
    Patience,
    alter,
    build_concurrently,
    require_autocommit,
    swap,
)
from django_pgqueue.store.segments.privileges import (
    copy_table_extras,
    function_grants,
    grant,
    identity_sequence_grants,
    recreate_function,
)
from django_pgqueue.store.segments.rotation import make_segment, rotate
from django_pgqueue.store.statements.base import HOUSEKEEPING_LOCK_KEY

logger = logging.getLogger("django_pgqueue.segments")


class _Resumed(Exception):
    """prepare() found a table in segments that disable() had begun to bring down."""


def enable(
    conn: psycopg.Connection[Any],
    *,
    lock_timeout: float = 0.5,
    tries: int = 120,
    pause: Callable[[float], None] = time.sleep,
) -> SwapReport:
    """Make the job table segment 0 of a partitioned job table, on a live table.

    ``conn`` must be in autocommit mode (the indexes are built concurrently). Runs
    :func:`prepare` (a no-op when it ran before), then the swap. Every statement that
    needs the job table's exclusive lock waits at most ``lock_timeout`` seconds for it,
    ``tries`` times, pausing between tries; :class:`SegmentLayoutError` if it never gets
    it (the steps before are kept; running ``enable`` again finishes the conversion).
    """
    patience = Patience(lock_timeout, tries, pause)
    try:
        prepare(conn, lock_timeout=lock_timeout, tries=tries, pause=pause)
    except _Resumed:
        conn.execute(f"DELETE FROM {SAVED} WHERE kind = 'state'")
        logger.info("%s stays in segments: rotation resumes", JOB_TABLE)
        return SwapReport(0.0, 0)
    report = swap(conn, _enable_swap, patience)
    for name in UNIQUE_KEYS:
        conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    logger.info(
        "%s is now in segments: the swap held its lock %.0f ms (try %d)",
        JOB_TABLE,
        report.lock_held_ms,
        report.tries,
    )
    return report


def prepare(
    conn: psycopg.Connection[Any],
    *,
    lock_timeout: float = 0.5,
    tries: int = 120,
    pause: Callable[[float], None] = time.sleep,
) -> None:
    """The long steps of :func:`enable`, before its swap; each is skipped once done.

    They leave the job table a plain table every statement works on: a ``segment``
    column (a constant default, so no rewrite), two indexes built concurrently (segment
    0's primary key, and the plain index of idempotency keys), a ``CHECK (segment =
    0)`` validated under a lock that lets writes go on, and the partitioned table, built
    empty under a name of its own. Run alone, it moves the slow part of a conversion to
    a quiet hour.
    """
    patience = Patience(lock_timeout, tries, pause)
    require_autocommit(conn)
    _require_latest_migration(conn)
    if relkind(conn, JOB_TABLE) == "p":
        if saved_definitions(conn, "state"):
            raise _Resumed
        raise SegmentLayoutError(f"{JOB_TABLE} is in segments already")
    unknown = [name for name in unique_indexes(conn, JOB_TABLE) if name not in _CARRIED]
    if unknown:
        raise SegmentLayoutError(
            f"{JOB_TABLE} has unique indexes a partitioned table cannot carry: "
            + ", ".join(unknown)
        )
    # A constant default: no rewrite. Then segment 0's primary key and the plain index
    # the key look-ups will read, and the CHECK that lets ATTACH skip its scan, validated
    # under a lock that lets writes go on.
    if not has_column(conn, JOB_TABLE, "segment"):
        alter(
            conn,
            f"ALTER TABLE {JOB_TABLE} ADD COLUMN segment integer NOT NULL DEFAULT 0",
            patience,
        )
    build_concurrently(
        conn,
        FIRST_KEY,
        f"CREATE UNIQUE INDEX CONCURRENTLY {FIRST_KEY} ON {JOB_TABLE} (id, segment)",
    )
    build_concurrently(
        conn,
        IDEMPOTENCY,
        f"CREATE INDEX CONCURRENTLY {IDEMPOTENCY} ON {JOB_TABLE} (idempotency_key) "
        "WHERE idempotency_key IS NOT NULL",
    )
    if not has_constraint(conn, JOB_TABLE, "pgq_job_segment_0"):
        alter(
            conn,
            f"ALTER TABLE {JOB_TABLE} ADD CONSTRAINT pgq_job_segment_0 "
            "CHECK (segment = 0) NOT VALID",
            patience,
        )
    if not has_constraint(conn, JOB_TABLE, "pgq_job_segment_0", validated=True):
        conn.execute(f"ALTER TABLE {JOB_TABLE} VALIDATE CONSTRAINT pgq_job_segment_0")
    conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE} AS integer MINVALUE 0 START 0")
    # Any role that may insert a job reads the segment number (the column default):
    # a number, nothing to hide. Called, so that it reads 0 from the start.
    conn.execute(f"GRANT SELECT ON SEQUENCE {SEQUENCE} TO PUBLIC")
    conn.execute(f"SELECT setval('{SEQUENCE}', 0, true)")
    # One expression without FROM, VOLATILE like pg_sequence_last_value: PostgreSQL
    # inlines it into the default, a C call per row (0.3 µs) where a SQL function's
    # query over the sequence cost 2 µs per job enqueued. NULL (a not-null violation)
    # only for a role refused the sequence, which PostgreSQL 17 and later report so.
    conn.execute(
        f"CREATE OR REPLACE FUNCTION {CURRENT}() RETURNS integer LANGUAGE sql VOLATILE "
        f"AS $$ SELECT pg_sequence_last_value('{SEQUENCE}'::regclass)::integer $$"
    )
    conn.execute(f"COMMENT ON FUNCTION {CURRENT}() IS {sql_literal(_CURRENT_COMMENT)}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {SAVED} (kind text NOT NULL, name text NOT NULL, "
        "definition text NOT NULL, PRIMARY KEY (kind, name))"
    )
    conn.execute(f"COMMENT ON TABLE {SAVED} IS {sql_literal(_SAVED_COMMENT)}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {SEGMENTS} (segment integer PRIMARY KEY, "
        "attached_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "switched_at timestamptz, first_id bigint)"
    )
    conn.execute(f"COMMENT ON TABLE {SEGMENTS} IS {sql_literal(_SEGMENTS_COMMENT)}")
    # The first run's definitions are the ones to restore: a run after a failed swap
    # finds the same ones, and one after the swap never gets here.
    for name in UNIQUE_KEYS:
        definition = index_definition(conn, name)
        if definition is not None:
            save_definition(conn, "index", name, definition)
            (comment,) = one_row(conn, "SELECT obj_description(%s::regclass, 'pg_class')", [name])
            if comment is not None:
                save_definition(conn, "index comment", name, comment)
    functions = functions_of_row_type(conn, JOB_TABLE)
    for signature, definition in functions:
        save_definition(conn, "function", signature, definition)
    if functions:
        make_layout_free(conn, functions)
    _build_parent(conn)
    # Left by a run whose swap failed: never attached, never written.
    conn.execute(f"DROP TABLE IF EXISTS {PARKED_TABLE}")
    make_segment(conn, PARKED, storage_of=JOB_TABLE)


def disable(
    conn: psycopg.Connection[Any],
    *,
    lock_timeout: float = 0.5,
    tries: int = 120,
    pause: Callable[[float], None] = time.sleep,
    wait: float = 600.0,
) -> SwapReport:
    """Make the job table a plain table again, as migrated, on a live table.

    First the segments are brought down to one: rotation stops attaching, and every
    job that can move goes to the current segment (running jobs and coalesced pending
    ones leave on their own, by finishing or being claimed); the others are emptied and
    dropped. This waits up to ``wait`` seconds, then :class:`SegmentLayoutError` names
    the segments still holding jobs (running ``disable`` again goes on; ``enable``
    resumes rotation instead). Then the segment's table becomes the job table: its
    indexes take their migrated names, the unique key indexes :func:`enable` dropped
    are built again (concurrently, before the swap), and the coalesced enqueue gets its
    backstop back. The same lock arguments and errors as :func:`enable`.
    """
    patience = Patience(lock_timeout, tries, pause)
    require_autocommit(conn)
    current = layout(conn)
    if not current.segmented:
        if relkind(conn, SAVED) is None:
            raise SegmentLayoutError(f"{JOB_TABLE} is not in segments")
        # A prepare never followed by its swap, or a disable stopped after its swap.
        _tidy_plain(conn, patience)
        return SwapReport(0.0, 0)
    save_definition(conn, "state", "disabling", "on")
    number = _down_to_one(conn, patience, wait)
    table = segment_table(number)
    build_concurrently(
        conn, PLAIN_KEY, f"CREATE UNIQUE INDEX CONCURRENTLY {PLAIN_KEY} ON {table} (id)"
    )
    _build_saved_indexes(conn, table)
    report = swap(conn, lambda cur: _disable_swap(cur, number), patience)
    _tidy_plain(conn, patience)
    logger.info(
        "%s is a plain table again: the swap held its lock %.0f ms (try %d)",
        JOB_TABLE,
        report.lock_held_ms,
        report.tries,
    )
    return report


def _down_to_one(conn: psycopg.Connection[Any], patience: Patience, wait: float) -> int:
    """Rotation steps (under housekeeping's lock, as a worker's) until the current
    segment is the only one holding jobs and the others are gone; return its number."""
    deadline = time.monotonic() + wait
    while True:
        with conn.transaction():
            locked = one_row(conn, "SELECT pg_try_advisory_xact_lock(%s)", [HOUSEKEEPING_LOCK_KEY])
            if locked == (True,):
                rotate(
                    conn,
                    jobs_per_segment=1,
                    max_holding=1,
                    lock_wait=patience.lock_timeout,
                    move_limit=10_000,
                )
        current = layout(conn)
        assert current.current is not None
        parked_empty = not current.parked or one_row(
            conn, f"SELECT NOT EXISTS (SELECT FROM {PARKED_TABLE})"
        ) == (True,)
        if current.segments == (current.current,) and parked_empty:
            return current.current
        if time.monotonic() > deadline:
            left = {number: jobs for number, jobs in jobs_per_segment(conn).items() if jobs}
            left.pop(current.current, None)
            raise SegmentLayoutError(
                f"after {wait:.0f} s, segments other than the current one ({current.current}) "
                f"remain: {', '.join(f'{n} ({jobs} jobs)' for n, jobs in left.items())}"
                " (running jobs, or pending ones holding a coalesce key, leave on their own); "
                "run disable again to go on, or enable to resume rotation"
            )
        patience.pause(0.2)


def _build_saved_indexes(conn: psycopg.Connection[Any], table: str) -> None:
    for name, definition in saved_definitions(conn, "index"):
        build_concurrently(conn, name, retarget_index(definition, name, table, concurrently=True))
    for name, comment in saved_definitions(conn, "index comment"):
        conn.execute(
            sql.SQL("COMMENT ON INDEX {} IS {}").format(sql.Identifier(name), sql.Literal(comment))
        )


def _tidy_plain(conn: psycopg.Connection[Any], patience: Patience) -> None:
    """Take a plain job table back to its migrated schema: what prepare added goes, what
    it dropped or rewrote comes back. Each step is skipped once done."""
    _build_saved_indexes(conn, JOB_TABLE)
    if has_column(conn, JOB_TABLE, "segment"):
        if has_constraint(conn, JOB_TABLE, "pgq_job_segment_0"):
            alter(conn, f"ALTER TABLE {JOB_TABLE} DROP CONSTRAINT pgq_job_segment_0", patience)
        conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {FIRST_KEY}")
        alter(conn, f"ALTER TABLE {JOB_TABLE} DROP COLUMN segment", patience)
    # The job table's row type is the migrated one again: the functions can name it.
    saved = saved_definitions(conn, "function")
    with conn.transaction():
        for signature, definition in saved:
            grants = function_grants(conn, signature)
            conn.execute(f"DROP FUNCTION IF EXISTS {signature}")
            recreate_function(conn, signature, definition, grants)
    conn.execute(f"DROP TABLE IF EXISTS {PARENT}")
    conn.execute(f"DROP TABLE IF EXISTS {PARKED_TABLE}")
    # pgq_coalesced_job stays: a coalesced enqueue that began before the function was
    # made again still runs the layout-free one, whose variable has that type ("type
    # does not exist" otherwise). Unused from then on; prepare makes it anew if the job
    # table's columns changed since.
    conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {IDEMPOTENCY}")
    conn.execute(f"DROP FUNCTION IF EXISTS {CURRENT}()")
    conn.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
    conn.execute(f"DROP TABLE IF EXISTS {SEGMENTS}")
    conn.execute(f"DROP TABLE IF EXISTS {SAVED}")


# --- the two swaps ------------------------------------------------------------------

# Indexes enable knows what to do with: the primary key becomes (id, segment), segment
# 0's key is that index, the key indexes are dropped (key tables decide since 0026).
_CARRIED = (f"{JOB_TABLE}_pkey", FIRST_KEY, *UNIQUE_KEYS)

_CURRENT_COMMENT = (
    "django-pgqueue: the segment new jobs go to (the job table's segment column default)."
)
_SEGMENTS_COMMENT = (
    "django-pgqueue: the job table's segments: when each was attached, when new jobs "
    "were first pointed at it, and the job id sequence's value then."
)
_SAVED_COMMENT = (
    "django-pgqueue: what putting the job table in segments dropped, for making it plain "
    "again (index and function definitions)."
)


def _build_parent(conn: psycopg.Connection[Any]) -> None:
    """The partitioned table, with the job table's columns, checks, comments, identity,
    grants and (on ONLY itself) non-unique indexes, under a name of its own."""
    # Left by a run whose swap failed: never attached, never written.
    conn.execute(f"DROP TABLE IF EXISTS {PARENT}")
    conn.execute(
        f"CREATE TABLE {PARENT} (LIKE {JOB_TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        "INCLUDING COMMENTS INCLUDING IDENTITY INCLUDING STORAGE INCLUDING STATISTICS) "
        "PARTITION BY LIST (segment)"
    )
    conn.execute(f"ALTER TABLE {PARENT} DROP CONSTRAINT pgq_job_segment_0")
    conn.execute(f"ALTER TABLE {PARENT} ALTER COLUMN segment SET DEFAULT {CURRENT}()")
    conn.execute(f"ALTER TABLE {PARENT} ADD CONSTRAINT {PARENT}_pkey PRIMARY KEY (id, segment)")
    for name, definition in plain_indexes(conn, JOB_TABLE):
        conn.execute(retarget_index(definition, f"{name}_p", PARENT, only=True))
        copy_index_comment(conn, name, f"{name}_p")
    copy_table_extras(conn, JOB_TABLE, PARENT)


def _enable_swap(cur: psycopg.Cursor[Any]) -> None:
    cur.execute(f"LOCK TABLE {JOB_TABLE} IN ACCESS EXCLUSIVE MODE")
    # Built before the lock: a column, an index or a grant that changed since is found
    # here, and the conversion stops rather than losing it.
    _require_same_shape(cur, JOB_TABLE, PARENT)
    (last, called) = one_row(cur, f"SELECT last_value, is_called FROM {JOB_TABLE}_id_seq")
    cur.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)", [PARENT, last, called])
    view = view_definition(cur)
    triggers = trigger_definitions(cur, JOB_TABLE)
    indexes = [name for name, _ in plain_indexes(cur, JOB_TABLE)]
    named = [signature for signature, _ in functions_of_row_type(cur, JOB_TABLE)]
    if named:
        raise SegmentLayoutError(
            f"functions name {JOB_TABLE}'s row type since prepare ran (a migration?): "
            + ", ".join(named)
            + "; run it again"
        )
    cur.execute(f"ALTER TABLE {JOB_TABLE} ALTER COLUMN id DROP IDENTITY")
    cur.execute(f"ALTER TABLE {JOB_TABLE} DROP CONSTRAINT {JOB_TABLE}_pkey")
    cur.execute(
        f"ALTER TABLE {JOB_TABLE} ADD CONSTRAINT {JOB_TABLE}_s0_pkey "
        f"PRIMARY KEY USING INDEX {FIRST_KEY}"
    )
    for name, _ in triggers:
        cur.execute(f"DROP TRIGGER {name} ON {JOB_TABLE}")
    cur.execute(f"ALTER TABLE {JOB_TABLE} RENAME TO {segment_table(0)}")
    cur.execute(f"ALTER TABLE {PARENT} RENAME TO {JOB_TABLE}")
    for name in indexes:
        cur.execute(f"ALTER INDEX {name} RENAME TO {name}_s0")
        cur.execute(f"ALTER INDEX {name}_p RENAME TO {name}")
    cur.execute(f"ALTER INDEX {PARENT}_pkey RENAME TO {JOB_TABLE}_pkey")
    cur.execute(f"ALTER SEQUENCE {PARENT}_id_seq RENAME TO {JOB_TABLE}_id_seq")
    cur.execute(f"ALTER TABLE {JOB_TABLE} ATTACH PARTITION {segment_table(0)} FOR VALUES IN (0)")
    cur.execute(f"ALTER TABLE {JOB_TABLE} ATTACH PARTITION {PARKED_TABLE} FOR VALUES IN ({PARKED})")
    for _, definition in triggers:
        cur.execute(definition)
    # The view read the old table by its identity: made again, it reads the new one.
    cur.execute(f"CREATE OR REPLACE VIEW {VIEW} AS {view}")
    cur.execute(f"SELECT setval('{SEQUENCE}', 0, true)")
    cur.execute(
        f"INSERT INTO {SEGMENTS} (segment, switched_at, first_id) VALUES (0, now(), 0) "
        "ON CONFLICT (segment) DO NOTHING"
    )
    invalid = invalid_indexes(cur, JOB_TABLE)
    if invalid:
        raise SegmentLayoutError(
            "these indexes of the partitioned table found no match in segment 0: "
            + ", ".join(invalid)
        )


def _disable_swap(cur: psycopg.Cursor[Any], number: int) -> None:
    table = segment_table(number)
    cur.execute(f"LOCK TABLE {JOB_TABLE} IN ACCESS EXCLUSIVE MODE")
    if relkind(cur, PARKED_TABLE) is not None:
        if cur.execute(f"SELECT EXISTS (SELECT FROM {PARKED_TABLE})").fetchone() != (False,):
            raise SegmentLayoutError("the parked segment holds jobs again: run disable again")
        cur.execute(f"ALTER TABLE {JOB_TABLE} DETACH PARTITION {PARKED_TABLE}")
        cur.execute(f"DROP TABLE {PARKED_TABLE}")
    (last, called) = one_row(cur, f"SELECT last_value, is_called FROM {JOB_TABLE}_id_seq")
    (identity,) = one_row(
        cur,
        "SELECT attidentity FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'id'",
        [JOB_TABLE],
    )
    view = view_definition(cur)
    triggers = trigger_definitions(cur, JOB_TABLE)
    # Each of the segment's indexes takes the name of the parent's index it is attached to.
    renames = cur.execute(
        "SELECT child.relname, parent.relname, obj_description(parent.oid, 'pg_class') "
        "FROM pg_inherits "
        "JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid "
        "JOIN pg_class AS parent ON parent.oid = pg_inherits.inhparent "
        "JOIN pg_index ON pg_index.indexrelid = child.oid "
        "WHERE pg_index.indrelid = %s::regclass AND NOT pg_index.indisprimary",
        [table],
    ).fetchall()
    sequence_grants = identity_sequence_grants(cur, JOB_TABLE)
    copy_table_extras(cur, JOB_TABLE, table, sequence=False)
    cur.execute(f"ALTER TABLE {JOB_TABLE} DETACH PARTITION {table}")
    cur.execute(f"ALTER TABLE {JOB_TABLE} RENAME TO {RETIRED}")
    cur.execute(f"ALTER TABLE {table} RENAME TO {JOB_TABLE}")
    cur.execute(f"CREATE OR REPLACE VIEW {VIEW} AS {view}")
    cur.execute(f"DROP TABLE {RETIRED}")
    cur.execute(f"ALTER TABLE {JOB_TABLE} DROP CONSTRAINT {table}_pkey")
    cur.execute(
        f"ALTER TABLE {JOB_TABLE} ADD CONSTRAINT {JOB_TABLE}_pkey "
        f"PRIMARY KEY USING INDEX {PLAIN_KEY}"
    )
    cur.execute(f"ALTER TABLE {JOB_TABLE} DROP CONSTRAINT IF EXISTS pgq_job_segment_{number}")
    cur.execute(f"ALTER TABLE {JOB_TABLE} DROP COLUMN segment")
    kind = "ALWAYS" if identity == "a" else "BY DEFAULT"
    cur.execute(
        f"ALTER TABLE {JOB_TABLE} ALTER COLUMN id ADD GENERATED {kind} AS IDENTITY "
        f"(SEQUENCE NAME {JOB_TABLE}_id_seq)"
    )
    cur.execute(f"SELECT setval('{JOB_TABLE}_id_seq', %s, %s)", [last, called])
    grant(cur, sequence_grants, "SEQUENCE", sql.Identifier(f"{JOB_TABLE}_id_seq"))
    for child, parent, comment in renames:
        if child != parent:
            cur.execute(f"ALTER INDEX {child} RENAME TO {parent}")
        cur.execute(
            sql.SQL("COMMENT ON INDEX {} IS {}").format(
                sql.Identifier(parent), sql.Literal(comment)
            )
        )
    for _, definition in triggers:
        cur.execute(definition)
    cur.execute(f"DROP FUNCTION {CURRENT}()")
    cur.execute(f"DROP SEQUENCE {SEQUENCE}")


def _require_latest_migration(conn: psycopg.Connection[Any]) -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    leaves = [name for app, name in loader.graph.leaf_nodes(APP_LABEL) if app == APP_LABEL]
    applied = {
        name
        for (name,) in conn.execute(
            "SELECT name FROM django_migrations WHERE app = %s", [APP_LABEL]
        ).fetchall()
    }
    missing = [name for name in leaves if name not in applied]
    if missing:
        raise SegmentLayoutError(
            f"the database lacks this release's migrations ({', '.join(missing)}): "
            "run migrate first"
        )


def _require_same_shape(cur: psycopg.Cursor[Any], table: str, parent: str) -> None:
    """The parent built before the lock still has the table's columns and indexes."""
    columns = (
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attname"
    )
    if cur.execute(columns, [table]).fetchall() != cur.execute(columns, [parent]).fetchall():
        raise SegmentLayoutError(
            f"{table}'s columns changed while the conversion ran (a migration?): run it again"
        )
    mine = {name for name, _ in plain_indexes(cur, table)}
    theirs = {name.removesuffix("_p") for name, _ in plain_indexes(cur, parent)}
    if mine != theirs:
        raise SegmentLayoutError(
            f"{table}'s indexes changed while the conversion ran (a migration?): run it again"
        )
