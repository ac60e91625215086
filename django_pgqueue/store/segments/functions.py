"""The coalesced enqueue made independent of the job table's row type (and of its backstop)."""

from __future__ import annotations

from typing import Any

import psycopg

from django_pgqueue.store.segments.catalog import (
    COALESCED_TYPE,
    JOB_TABLE,
    Conn,
    SegmentLayoutError,
    relkind,
)
from django_pgqueue.store.segments.privileges import function_grants, recreate_function
from django_pgqueue.store.sql import _without


def make_layout_free(conn: psycopg.Connection[Any], functions: list[tuple[str, str]]) -> None:
    """Make each function that names the job table's row type again without it.

    A function's compiled body keeps the row types it was compiled with: a call that
    waits on the job table's lock while the swap renames it would go on with the old
    table's row type and fail ("type of parameter ... does not match"). So before the
    swap, the coalesced enqueue returns and holds a composite type of its own with the
    job table's columns (``pgq_coalesced_job``: the callers read the same fields), names
    its columns where it read ``*``, and loses its backstop (the ON CONFLICT on
    ``pgq_job_coalesce_key``, and the ``xmax`` that told an insert from its update,
    which a partitioned table's RETURNING cannot read). It then works on either layout.
    """
    columns = columns_of(conn, JOB_TABLE)
    # Left by an earlier disable (see tidy): kept if it still has the job table's
    # columns; made anew if a migration changed them (no function uses it meanwhile).
    if relkind(conn, COALESCED_TYPE) is not None and columns_of(conn, COALESCED_TYPE) != columns:
        conn.execute(f"DROP TYPE {COALESCED_TYPE}")
    if relkind(conn, COALESCED_TYPE) is None:
        conn.execute(
            f"CREATE TYPE {COALESCED_TYPE} AS ("
            + ", ".join(f"{name} {kind}" for name, kind in columns)
            + ")"
        )
    names = ", ".join(name for name, _ in columns)
    with conn.transaction():
        for signature, definition in functions:
            grants = function_grants(conn, signature)
            conn.execute(f"DROP FUNCTION {signature}")
            recreate_function(conn, signature, layout_free(definition, names), grants)


def columns_of(conn: Conn, relation: str) -> list[tuple[str, str]]:
    """The columns (or a composite type's attributes) of ``relation``, with their types,
    in order; the segment column left out (a job table in segments has it, the type
    does not)."""
    return [
        (str(name), str(kind))
        for name, kind in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname <> 'segment' ORDER BY attnum",
            [relation],
        ).fetchall()
    ]


def layout_free(definition: str, columns: str) -> str:
    """``definition`` (the coalesced enqueue's) as :func:`make_layout_free` makes it.

    Each change must apply exactly as often as written: a function a later release
    changed stops the conversion rather than being half rewritten.
    """
    lines = definition.splitlines()
    if not any(line.strip() == "-- begin backstop" for line in lines):
        raise SegmentLayoutError(f"unexpected function naming {JOB_TABLE}'s row type")
    text = "\n".join(_without(lines, "backstop"))
    for old, new, times in (
        (f"RETURNS TABLE(job {JOB_TABLE}, ", f"RETURNS TABLE(job {COALESCED_TYPE}, ", 1),
        (f"held {JOB_TABLE}%ROWTYPE;", f"held {COALESCED_TYPE};", 1),
        ("SELECT * INTO held", f"SELECT {columns} INTO held", 3),
        ("RETURNING * INTO held", f"RETURNING {columns} INTO held", 1),
        (
            "RETURNING pending.id, pending.xmax = 0 INTO new_id, is_new;",
            "RETURNING pending.id, true INTO new_id, is_new;",
            1,
        ),
    ):
        if text.count(old) != times:
            raise SegmentLayoutError(
                f"the coalesced enqueue has {text.count(old)} times {old!r}, not {times}: "
                "this conversion does not know it; nothing was changed"
            )
        text = text.replace(old, new)
    return text
