"""Statements that need the job table's exclusive lock: behind a lock_timeout, tried again."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from django_pgqueue.store.segments.catalog import SegmentLayoutError, SwapReport

logger = logging.getLogger("django_pgqueue.segments")


@dataclass(frozen=True)
class Patience:
    """How long a statement waits for the job table's lock, how often it tries."""

    lock_timeout: float
    tries: int
    pause: Callable[[float], None]

    def __post_init__(self) -> None:
        if not self.lock_timeout > 0 or self.tries < 1:
            raise SegmentLayoutError(
                f"lock_timeout must be positive and tries at least 1 (got {self.lock_timeout!r} "
                f"and {self.tries!r})"
            )


def swap(
    conn: psycopg.Connection[Any], body: Callable[[psycopg.Cursor[Any]], None], patience: Patience
) -> SwapReport:
    """Run ``body`` in one transaction behind ``lock_timeout``, until it gets its locks."""
    lock_timeout, tries = patience.lock_timeout, patience.tries
    for attempt in range(1, tries + 1):
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(
                    "SELECT set_config('lock_timeout', %s, true)", [f"{lock_timeout * 1000:.0f}ms"]
                )
                started = time.monotonic()
                body(cur)
                held = (time.monotonic() - started) * 1000
        except psycopg.errors.LockNotAvailable:
            logger.info(
                "the job table's lock was not free within %.1f s (try %d)", lock_timeout, attempt
            )
            patience.pause(min(0.05 * attempt, 2.0))
            continue
        return SwapReport(held, attempt)
    raise SegmentLayoutError(
        f"the job table's lock was never free within {lock_timeout} s in {tries} tries: "
        "a long transaction holds it (see pg_locks); run again once it has ended"
    )


def require_autocommit(conn: psycopg.Connection[Any]) -> None:
    if not conn.autocommit:
        raise SegmentLayoutError(
            "the connection must be in autocommit mode: the indexes are built concurrently"
        )


def alter(conn: psycopg.Connection[Any], statement: str, patience: Patience) -> None:
    """One statement that needs the job table's exclusive lock, behind ``lock_timeout``."""

    def body(cur: psycopg.Cursor[Any]) -> None:
        cur.execute(statement)

    swap(conn, body, patience)


def build_concurrently(conn: psycopg.Connection[Any], name: str, statement: str) -> None:
    """Build an index concurrently unless a valid one of that name exists; a build that
    failed half way leaves an invalid index, dropped and built again."""
    row = conn.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name]
    ).fetchone()
    if row is not None and row[0]:
        return
    if row is not None:
        conn.execute(f"DROP INDEX CONCURRENTLY {name}")
    conn.execute(statement)
