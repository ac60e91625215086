"""What the catalog says of the job table in segments, and the names of what makes it up."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from django_pgqueue.exceptions import PgQueueError

JOB_TABLE = "django_pgqueue_job"
VIEW = "django_pgqueue_job_all"
SEQUENCE = "pgq_segment_seq"
CURRENT = "pgq_current_segment"
SAVED = "pgq_segment_saved"
SEGMENTS = "pgq_segment"  # one row per segment attached: when, and from which job id
PARENT = "pgq_job_parent"  # the partitioned table while enable builds it
RETIRED = "pgq_job_retired"  # the partitioned table while disable drops it
IDEMPOTENCY = "pgq_job_idempotency"  # the plain index the key look-ups read
COALESCED_TYPE = "pgq_coalesced_job"  # the coalesced enqueue's result, not the table's row
UNIQUE_KEYS = ("pgq_job_idempotency_key", "pgq_job_coalesce_key")
FIRST_KEY = "pgq_job_s0_key"  # (id, segment): segment 0's primary key once attached
PLAIN_KEY = "pgq_job_plain_key"  # (id): the plain table's primary key once detached
#: The segment that is never emptied: jobs that would keep a rotating segment for long
#: (blocked, or not due for a while) are moved there once, rather than at every turn.
PARKED = -1
PARKED_TABLE = f"{JOB_TABLE}_parked"


class SegmentLayoutError(PgQueueError):
    """The job table cannot be converted as asked. The step that failed changed nothing;
    the steps before it are kept, and running the conversion again goes on from there."""


@dataclass(frozen=True)
class Layout:
    """How the job table is stored now."""

    segmented: bool
    #: The attached segments' numbers, oldest first (empty for a plain table).
    segments: tuple[int, ...]
    #: The segment new jobs go to (None for a plain table).
    current: int | None
    #: Whether the segment of jobs not due for a while is attached (see :data:`PARKED`).
    parked: bool = False


@dataclass(frozen=True)
class SwapReport:
    """What a conversion did: how long its swap held the job table's lock, and after how
    many tries of ``lock_timeout`` it got it."""

    lock_held_ms: float
    tries: int


def segment_table(number: int) -> str:
    """The name of segment ``number``'s table."""
    return PARKED_TABLE if number == PARKED else f"{JOB_TABLE}_s{number}"


def layout(conn: psycopg.Connection[Any]) -> Layout:
    """Return how the job table is stored (it must exist: ``migrate`` first)."""
    kind = relkind(conn, JOB_TABLE)
    if kind is None:
        raise SegmentLayoutError(f"{JOB_TABLE} does not exist: run migrate first")
    if kind != "p":
        return Layout(False, (), None)
    rows = conn.execute(
        "SELECT pg_get_expr(child.relpartbound, child.oid) FROM pg_inherits "
        "JOIN pg_class AS child ON child.oid = pg_inherits.inhrelid "
        "WHERE pg_inherits.inhparent = %s::regclass",
        [JOB_TABLE],
    ).fetchall()
    # A segment detached while this read the catalog shows without its bound: gone.
    numbers = sorted(int(_BOUND.findall(bound)[0]) for (bound,) in rows if bound is not None)
    (current,) = conn.execute(f"SELECT {CURRENT}()").fetchone() or (None,)
    segments = tuple(number for number in numbers if number != PARKED)
    return Layout(True, segments, current, parked=PARKED in numbers)


_BOUND = re.compile(r"-?\d+")


def jobs_per_segment(conn: psycopg.Connection[Any]) -> dict[int, int]:
    """Jobs in each attached segment (a count of each: for an operator, not a hot path)."""
    return {
        number: int(
            one_row(
                conn,
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(segment_table(number))),
            )[0]
        )
        for number in (*layout(conn).segments, *((PARKED,) if layout(conn).parked else ()))
    }


def check_constraints(conn: Conn, table: str, like: str) -> list[str]:
    return [
        str(name)
        for (name,) in conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
            "AND contype = 'c' AND conname LIKE %s",
            [table, like],
        ).fetchall()
    ]


# --- catalog helpers ----------------------------------------------------------------

Conn = psycopg.Connection[Any] | psycopg.Cursor[Any]


def one_row(
    conn: Conn, query: str | sql.Composed, params: list[Any] | None = None
) -> tuple[Any, ...]:
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise SegmentLayoutError(f"no row from the catalog for: {query}")
    return tuple(row)


def sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def relkind(conn: Conn, table: str) -> str | None:
    row = conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table]
    ).fetchone()
    return None if row is None else str(row[0])


def has_constraint(conn: Conn, table: str, name: str, *, validated: bool = False) -> bool:
    return (
        conn.execute(
            "SELECT FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s "
            "AND (convalidated OR NOT %s)",
            [table, name, validated],
        ).fetchone()
        is not None
    )


def has_column(conn: Conn, table: str, name: str) -> bool:
    return (
        conn.execute(
            "SELECT FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s "
            "AND NOT attisdropped",
            [table, name],
        ).fetchone()
        is not None
    )


def unique_indexes(conn: Conn, table: str) -> list[str]:
    return [
        name
        for (name,) in conn.execute(
            "SELECT index_class.relname FROM pg_index "
            "JOIN pg_class AS index_class ON index_class.oid = pg_index.indexrelid "
            "WHERE pg_index.indrelid = %s::regclass AND pg_index.indisunique "
            "ORDER BY 1",
            [table],
        ).fetchall()
    ]


def plain_indexes(conn: Conn, table: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(definition))
        for name, definition in conn.execute(
            "SELECT index_class.relname, pg_get_indexdef(pg_index.indexrelid) FROM pg_index "
            "JOIN pg_class AS index_class ON index_class.oid = pg_index.indexrelid "
            "WHERE pg_index.indrelid = %s::regclass AND NOT pg_index.indisunique "
            "ORDER BY 1",
            [table],
        ).fetchall()
    ]


def invalid_indexes(conn: Conn, table: str) -> list[str]:
    return [
        name
        for (name,) in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = %s::regclass AND NOT indisvalid ORDER BY 1",
            [table],
        ).fetchall()
    ]


def index_definition(conn: Conn, name: str) -> str | None:
    row = conn.execute(
        "SELECT pg_get_indexdef(pg_index.indexrelid) FROM pg_index "
        "WHERE pg_index.indexrelid = to_regclass(%s) AND pg_index.indisvalid",
        [name],
    ).fetchone()
    return None if row is None else str(row[0])


_INDEX_HEAD = re.compile(
    r"^CREATE (?P<unique>UNIQUE )?INDEX (?P<name>\S+) ON (?:ONLY )?(?P<table>\S+) USING "
)


def retarget_index(
    definition: str, name: str, table: str, *, only: bool = False, concurrently: bool = False
) -> str:
    """``definition`` (pg_get_indexdef's) as an index ``name`` on ``table``."""
    head = _INDEX_HEAD.match(definition)
    if head is None:
        raise SegmentLayoutError(f"unexpected index definition: {definition}")
    return (
        f"CREATE {head['unique'] or ''}INDEX {'CONCURRENTLY ' if concurrently else ''}{name} "
        f"ON {'ONLY ' if only else ''}{table} USING {definition[head.end() :]}"
    )


def functions_of_row_type(conn: Conn, table: str) -> list[tuple[str, str]]:
    """(signature, definition) of each function whose result or arguments name the
    table's row type: dropping the table would drop them."""
    return [
        (str(signature), str(definition))
        for signature, definition in conn.execute(
            "SELECT DISTINCT pg_proc.oid::regprocedure::text, pg_get_functiondef(pg_proc.oid) "
            "FROM pg_depend JOIN pg_proc ON pg_proc.oid = pg_depend.objid "
            "WHERE pg_depend.classid = 'pg_proc'::regclass "
            "AND pg_depend.refclassid = 'pg_type'::regclass "
            "AND pg_depend.refobjid = (SELECT reltype FROM pg_class WHERE oid = %s::regclass) "
            "ORDER BY 1",
            [table],
        ).fetchall()
    ]


def save_definition(conn: Conn, kind: str, name: str, definition: str) -> None:
    conn.execute(
        f"INSERT INTO {SAVED} (kind, name, definition) VALUES (%s, %s, %s) "
        "ON CONFLICT (kind, name) DO NOTHING",
        [kind, name, definition],
    )


def saved_definitions(conn: Conn, kind: str) -> list[tuple[str, str]]:
    if relkind(conn, SAVED) is None:
        return []
    return [
        (str(name), str(definition))
        for name, definition in conn.execute(
            f"SELECT name, definition FROM {SAVED} WHERE kind = %s ORDER BY name", [kind]
        ).fetchall()
    ]


def copy_index_comment(conn: Conn, source: str, target: str) -> None:
    (comment,) = one_row(conn, "SELECT obj_description(%s::regclass, 'pg_class')", [source])
    conn.execute(
        sql.SQL("COMMENT ON INDEX {} IS {}").format(sql.Identifier(target), sql.Literal(comment))
    )


def view_definition(conn: Conn) -> str:
    (definition,) = one_row(conn, "SELECT pg_get_viewdef(%s::regclass)", [VIEW])
    return str(definition)


def trigger_definitions(conn: Conn, table: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(definition))
        for name, definition in conn.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname",
            [table],
        ).fetchall()
    ]
