"""Query plans in tests: EXPLAIN a statement's text as the store sends it, custom or
generic, and walk the plan's nodes.

A worker's connection prepares its statements and plans them generically
(``GENERIC_PLAN_SESSION``, store/pgconn.py), so an index a test expects must hold for
that plan too, not only for the custom plan ``EXPLAIN`` makes from literal values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import sql

from django_pgqueue.store.pgconn import GENERIC_PLAN_SESSION
from django_pgqueue.store.sql import QUERIES

_NAMED = re.compile(r"%\(([a-z_]+)\)s")


def walk(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield ``plan`` and every node under it, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from walk(child)


def _root(rows: Any) -> dict[str, Any]:
    # psycopg returns the json column decoded, unless a test's connection asked for text.
    root: dict[str, Any] = (json.loads(rows) if isinstance(rows, str) else rows)[0]["Plan"]
    return root


def explain(
    conn: psycopg.Connection[Any],
    text: str,
    params: Mapping[str, Any],
    *,
    generic: bool = False,
    analyze: bool = False,
    session: str = "",
) -> dict[str, Any]:
    """Return the root node of the plan of ``text`` (named ``%(x)s`` placeholders).

    ``generic`` prepares the text with numbered parameters in a worker's session and
    explains its execution, so the plan is the one a worker's prepared statement gets; the
    session's settings are reset afterwards. ``analyze`` runs the statement (the caller
    rolls back what it wrote). ``session``: more settings for the generic plan's session
    (``CLAIM_SESSION``, for the statements a worker's claiming connections send).
    """
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    if not generic:
        (rows,) = conn.execute(f"EXPLAIN ({options}) {text}", params).fetchone()  # type: ignore[misc]
        return _root(rows)
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE probe AS {_NAMED.sub(number, text)}")
    conn.execute(GENERIC_PLAN_SESSION + (f"; {session}" if session else ""))
    try:
        arguments = sql.SQL(", ").join(sql.Literal(params[key]) for key in order)
        # A statement without parameters is executed without parentheses.
        query = (
            sql.SQL(f"EXPLAIN ({options}) EXECUTE probe({{}})").format(arguments)
            if order
            else sql.SQL(f"EXPLAIN ({options}) EXECUTE probe")
        )
        (rows,) = conn.execute(query).fetchone()  # type: ignore[misc]
    finally:
        conn.execute(
            "RESET plan_cache_mode; RESET enable_seqscan; RESET enable_bitmapscan; RESET jit"
        )
        conn.execute("DEALLOCATE probe")
    return _root(rows)


def claim_cost(
    conn: psycopg.Connection[Any], params: Mapping[str, Any]
) -> tuple[int, int, set[str]]:
    """Return (buffers touched, jobs claimed, indexes used) of one claim, rolled back."""
    with conn.transaction(force_rollback=True):
        (rows,) = conn.execute(  # type: ignore[misc]
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["claim_batch"].text, params
        ).fetchone()
    plan = _root(rows)
    buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    claimed = next(
        node["Actual Rows"]
        for node in walk(plan)
        if node.get("Node Type") == "ModifyTable"
        and node.get("Relation Name") == "django_pgqueue_job"
    )
    indexes = {node["Index Name"] for node in walk(plan) if "Index Name" in node}
    return buffers, claimed, indexes
