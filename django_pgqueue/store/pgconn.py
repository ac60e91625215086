"""Dedicated psycopg connections, configured like Django's own for the same alias.

Workers keep their queue bookkeeping (claims, completions, lease extensions, LISTEN) on
connections of their own, separate from the connection a task's handler uses, so a failing
handler can never roll back the queue's bookkeeping and a busy handler can never starve a
lease extension.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections
from psycopg.adapt import AdaptersMap
from psycopg.types.string import TextLoader

__all__ = ["CLAIM_SESSION", "GENERIC_PLAN_SESSION", "connect"]

# jsonb arrives as text, as on Django's connections (our code decodes it where needed);
# timestamps use psycopg's own C loader rather than Django's Python wrapper around it,
# with the session in UTC, so they arrive as aware UTC datetimes all the same.
_ADAPTERS = AdaptersMap(psycopg.adapters)
_ADAPTERS.register_loader("jsonb", TextLoader)

# Statements run this many times on a connection are prepared server-side. Django turns
# this off by default (for PgBouncer); an explicit OPTIONS["prepare_threshold"] wins here too.
DEFAULT_PREPARE_THRESHOLD = 2

# The session of a connection that prepares statements. Generic plans save the planning
# (about a millisecond for a claim) on every execution, and ours are safe whatever the
# statistics (tests/test_indexes.py), but for one case: a job table that has never been
# analyzed, as when workers start on a new database, is costed at ten pages, so a
# sequential scan looks cheaper than any index, and the plan made then stays cached for
# the connection's life however large the table grows, until something invalidates it
# (an autovacuum's ANALYZE, which a busy or blocked autovacuum can delay for minutes).
# With sequential scans turned off the planner takes the index every statement was
# written for; a table with no usable index is still scanned (the setting only makes
# the scan look expensive). Before PostgreSQL 18 that expense is added to the plan's
# cost, which then passes every JIT threshold: JIT is off, or each such statement
# would spend a quarter of a second compiling (our statements are short; JIT never
# pays for them).
GENERIC_PLAN_SESSION = (
    "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET jit = off"
)

# ... and of a worker's connection that claims, on top: under a long-held snapshot
# pgq_job_claim fills with dead entries while few jobs are live, and a plan made after an
# ANALYZE then may cost it above a bitmap scan of pgq_job_filter_brin, whose summaries
# match every block range of a busy queue. Measured, every claim read the whole table
# for seconds, and the queue stalled for a minute at a time, until another ANALYZE
# (performance.md). Only there: every statement of ours has an index scan of its own,
# but with bitmap scans off on every connection of the workers one such hold drained at
# 57% of its rate (no stall), which is not understood yet.
CLAIM_SESSION = "SET enable_bitmapscan = off"


def connect(
    alias: str,
    *,
    application_name: str | None = None,
    prepare: bool = True,
    connect_timeout: int = 10,
    claims: bool = False,
) -> psycopg.Connection[Any]:
    """Open an autocommit connection to the database of Django alias ``alias``.

    It uses Django's parameters (host, credentials, OPTIONS), binds parameters
    server-side, and returns jsonb as text and timestamps as aware UTC datetimes. TCP
    keepalives are on, so a dead peer is noticed even on an idle LISTEN connection.
    ``claims``: the connection sends claims (:data:`CLAIM_SESSION`).
    """
    wrapper = connections[alias]
    params: dict[str, Any] = wrapper.get_connection_params()
    params.pop("cursor_factory", None)
    params["context"] = _ADAPTERS
    options = wrapper.settings_dict.get("OPTIONS", {})
    if "prepare_threshold" not in options:
        params["prepare_threshold"] = DEFAULT_PREPARE_THRESHOLD if prepare else None
    params.setdefault("connect_timeout", connect_timeout)
    for key, value in (
        ("keepalives", 1),
        ("keepalives_idle", 10),
        ("keepalives_interval", 5),
        ("keepalives_count", 3),
    ):
        params.setdefault(key, value)
    if application_name:
        params["application_name"] = application_name[:63]
    params["autocommit"] = True
    connection = psycopg.Connection.connect(**params)
    session = "SET TIME ZONE 'UTC'"
    if connection.prepare_threshold is not None:
        # Without prepared statements (for PgBouncer in transaction mode) nothing is
        # cached: each plan is made from the table as it is.
        session += "; " + GENERIC_PLAN_SESSION
        if claims:
            session += "; " + CLAIM_SESSION
    connection.execute(session)
    return connection
