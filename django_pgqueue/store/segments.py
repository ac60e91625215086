"""The job table in segments: its conversion to a partitioned table and back.

A table that keeps one row per job cannot shed the dead versions a long transaction's
snapshot may still read: VACUUM must keep them all. A partition made after that snapshot
was taken can be emptied whole while it is held (performance.md, "A job table in
segments"). :func:`enable` makes the job table a table partitioned by ``LIST
(segment)`` whose one partition, segment 0, is the table as it was; :func:`disable` makes
a job table left with one segment a plain table again, with the schema the migrations
give. Both run on a live table while workers and producers go on:

- every long step (index builds, the ``CHECK`` that lets ``ATTACH PARTITION`` skip its
  scan) takes no lock that blocks the queue;
- the swap is one short transaction behind a ``lock_timeout``, tried again until it gets
  the job table's lock, so a long statement delays it rather than the queue waiting
  behind it;
- every step before the swap can run again: a conversion stopped half way (a crash, a
  lock it never got) is finished by running it again, and until the swap the job table
  is a plain table every statement works on.

The job table's unique key indexes (``pgq_job_idempotency_key``, ``pgq_job_coalesce_key``)
cannot be carried over: a partitioned table's unique indexes must include its partition
key. Since migration 0026 the key tables alone keep one job per key, and the indexes stay
only as a backstop for the previous release's producers, so :func:`enable` may only run
once none of those is left. It replaces the unique idempotency index by a plain one
(``pgq_job_idempotency``), which the look-ups of a key's job read, and saves what it
drops (the index definitions, and the coalesced enqueue's definition with its backstop)
in ``pgq_segment_saved`` for :func:`disable` to restore.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from django_pgqueue.exceptions import PgQueueError
from django_pgqueue.store.sql import _without

__all__ = [
    "JOB_TABLE",
    "PARKED",
    "Layout",
    "SegmentLayoutError",
    "SwapReport",
    "disable",
    "enable",
    "jobs_per_segment",
    "layout",
    "prepare",
    "rotate",
]

logger = logging.getLogger("django_pgqueue.segments")

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


class _Resumed(Exception):
    """prepare() found a table in segments that disable() had begun to bring down."""


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
    kind = _relkind(conn, JOB_TABLE)
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
            _one(
                conn,
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(segment_table(number))),
            )[0]
        )
        for number in (*layout(conn).segments, *((PARKED,) if layout(conn).parked else ()))
    }


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
    patience = _Patience(lock_timeout, tries, pause)
    try:
        prepare(conn, lock_timeout=lock_timeout, tries=tries, pause=pause)
    except _Resumed:
        conn.execute(f"DELETE FROM {SAVED} WHERE kind = 'state'")
        logger.info("%s stays in segments: rotation resumes", JOB_TABLE)
        return SwapReport(0.0, 0)
    report = _swap(conn, _enable_swap, patience)
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
    patience = _Patience(lock_timeout, tries, pause)
    _require_autocommit(conn)
    _require_latest_migration(conn)
    if _relkind(conn, JOB_TABLE) == "p":
        if _saved(conn, "state"):
            raise _Resumed
        raise SegmentLayoutError(f"{JOB_TABLE} is in segments already")
    unknown = [name for name in _unique_indexes(conn, JOB_TABLE) if name not in _CARRIED]
    if unknown:
        raise SegmentLayoutError(
            f"{JOB_TABLE} has unique indexes a partitioned table cannot carry: "
            + ", ".join(unknown)
        )
    # A constant default: no rewrite. Then segment 0's primary key and the plain index
    # the key look-ups will read, and the CHECK that lets ATTACH skip its scan, validated
    # under a lock that lets writes go on.
    if not _has_column(conn, JOB_TABLE, "segment"):
        _alter(
            conn,
            f"ALTER TABLE {JOB_TABLE} ADD COLUMN segment integer NOT NULL DEFAULT 0",
            patience,
        )
    _build_concurrently(
        conn,
        FIRST_KEY,
        f"CREATE UNIQUE INDEX CONCURRENTLY {FIRST_KEY} ON {JOB_TABLE} (id, segment)",
    )
    _build_concurrently(
        conn,
        IDEMPOTENCY,
        f"CREATE INDEX CONCURRENTLY {IDEMPOTENCY} ON {JOB_TABLE} (idempotency_key) "
        "WHERE idempotency_key IS NOT NULL",
    )
    if not _has_constraint(conn, JOB_TABLE, "pgq_job_segment_0"):
        _alter(
            conn,
            f"ALTER TABLE {JOB_TABLE} ADD CONSTRAINT pgq_job_segment_0 "
            "CHECK (segment = 0) NOT VALID",
            patience,
        )
    if not _has_constraint(conn, JOB_TABLE, "pgq_job_segment_0", validated=True):
        conn.execute(f"ALTER TABLE {JOB_TABLE} VALIDATE CONSTRAINT pgq_job_segment_0")
    conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE} AS integer MINVALUE 0 START 0")
    conn.execute(
        f"CREATE OR REPLACE FUNCTION {CURRENT}() RETURNS integer LANGUAGE sql STABLE "
        f"AS $$ SELECT CASE WHEN is_called THEN last_value::integer ELSE 0 END FROM {SEQUENCE} $$"
    )
    conn.execute(f"COMMENT ON FUNCTION {CURRENT}() IS {_literal(_CURRENT_COMMENT)}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {SAVED} (kind text NOT NULL, name text NOT NULL, "
        "definition text NOT NULL, PRIMARY KEY (kind, name))"
    )
    conn.execute(f"COMMENT ON TABLE {SAVED} IS {_literal(_SAVED_COMMENT)}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {SEGMENTS} (segment integer PRIMARY KEY, "
        "attached_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
        "switched_at timestamptz, first_id bigint)"
    )
    conn.execute(f"COMMENT ON TABLE {SEGMENTS} IS {_literal(_SEGMENTS_COMMENT)}")
    # The first run's definitions are the ones to restore: a run after a failed swap
    # finds the same ones, and one after the swap never gets here.
    for name in UNIQUE_KEYS:
        definition = _index_definition(conn, name)
        if definition is not None:
            _save(conn, "index", name, definition)
            (comment,) = _one(conn, "SELECT obj_description(%s::regclass, 'pg_class')", [name])
            if comment is not None:
                _save(conn, "index comment", name, comment)
    functions = _functions_of_row_type(conn, JOB_TABLE)
    for signature, definition in functions:
        _save(conn, "function", signature, definition)
    if functions:
        _make_layout_free(conn, functions)
    _build_parent(conn)
    # Left by a run whose swap failed: never attached, never written.
    conn.execute(f"DROP TABLE IF EXISTS {PARKED_TABLE}")
    _make_segment(conn, PARKED, storage_of=JOB_TABLE)


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
    patience = _Patience(lock_timeout, tries, pause)
    _require_autocommit(conn)
    current = layout(conn)
    if not current.segmented:
        if _relkind(conn, SAVED) is None:
            raise SegmentLayoutError(f"{JOB_TABLE} is not in segments")
        # A prepare never followed by its swap, or a disable stopped after its swap.
        _tidy_plain(conn, patience)
        return SwapReport(0.0, 0)
    _save(conn, "state", "disabling", "on")
    number = _down_to_one(conn, patience, wait)
    table = segment_table(number)
    _build_concurrently(
        conn, PLAIN_KEY, f"CREATE UNIQUE INDEX CONCURRENTLY {PLAIN_KEY} ON {table} (id)"
    )
    _build_saved_indexes(conn, table)
    report = _swap(conn, lambda cur: _disable_swap(cur, number), patience)
    _tidy_plain(conn, patience)
    logger.info(
        "%s is a plain table again: the swap held its lock %.0f ms (try %d)",
        JOB_TABLE,
        report.lock_held_ms,
        report.tries,
    )
    return report


def _down_to_one(conn: psycopg.Connection[Any], patience: _Patience, wait: float) -> int:
    """Rotation steps (under housekeeping's lock, as a worker's) until the current
    segment is the only one holding jobs and the others are gone; return its number."""
    from django_pgqueue.store.statements.base import HOUSEKEEPING_LOCK_KEY

    deadline = time.monotonic() + wait
    while True:
        with conn.transaction():
            locked = _one(conn, "SELECT pg_try_advisory_xact_lock(%s)", [HOUSEKEEPING_LOCK_KEY])
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
        parked_empty = not current.parked or _one(
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
    for name, definition in _saved(conn, "index"):
        _build_concurrently(conn, name, _retarget_index(definition, name, table, concurrently=True))
    for name, comment in _saved(conn, "index comment"):
        conn.execute(
            sql.SQL("COMMENT ON INDEX {} IS {}").format(sql.Identifier(name), sql.Literal(comment))
        )


def _tidy_plain(conn: psycopg.Connection[Any], patience: _Patience) -> None:
    """Take a plain job table back to its migrated schema: what prepare added goes, what
    it dropped or rewrote comes back. Each step is skipped once done."""
    _build_saved_indexes(conn, JOB_TABLE)
    if _has_column(conn, JOB_TABLE, "segment"):
        if _has_constraint(conn, JOB_TABLE, "pgq_job_segment_0"):
            _alter(conn, f"ALTER TABLE {JOB_TABLE} DROP CONSTRAINT pgq_job_segment_0", patience)
        conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {FIRST_KEY}")
        _alter(conn, f"ALTER TABLE {JOB_TABLE} DROP COLUMN segment", patience)
    # The job table's row type is the migrated one again: the functions can name it.
    saved = _saved(conn, "function")
    with conn.transaction():
        for signature, definition in saved:
            grants = _function_grants(conn, signature)
            conn.execute(f"DROP FUNCTION IF EXISTS {signature}")
            _recreate_function(conn, signature, definition, grants)
    conn.execute(f"DROP TABLE IF EXISTS {PARENT}")
    conn.execute(f"DROP TABLE IF EXISTS {PARKED_TABLE}")
    conn.execute(f"DROP TYPE IF EXISTS {COALESCED_TYPE}")
    conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {IDEMPOTENCY}")
    conn.execute(f"DROP FUNCTION IF EXISTS {CURRENT}()")
    conn.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
    conn.execute(f"DROP TABLE IF EXISTS {SEGMENTS}")
    conn.execute(f"DROP TABLE IF EXISTS {SAVED}")


# --- rotation ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rotation:
    """What one rotation step did."""

    #: The segment attached ahead (new jobs go to it from a later step), if any.
    attached: int | None = None
    #: The segment new jobs now go to, if this step switched.
    switched_to: int | None = None
    #: Segments emptied whole (truncated), and those of them detached and dropped.
    truncated: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    #: Segments still holding jobs, older than the current one.
    holding: tuple[int, ...] = ()
    #: Jobs moved from older segments to the current one.
    moved: int = 0
    #: The switch waits for this many transactions older than the attach.
    waiting: int = 0
    #: No segment was attached because this many already hold jobs (the bound).
    at_bound: bool = False


#: Attached segments at most, empty ones included: a long transaction that read the
#: job table keeps emptied segments from being detached until it ends.
MAX_ATTACHED = 256


def rotate(
    conn: psycopg.Connection[Any],
    *,
    jobs_per_segment: int,
    max_holding: int,
    lock_wait: float,
    move_limit: int = 1000,
) -> Rotation | None:
    """One step of rotation, in the caller's transaction (housekeeping's); None when
    the job table is not in segments.

    1. Move up to ``move_limit`` jobs that would keep an older segment from emptying
       for long to the current one (see :data:`_MOVE`).
    2. Empty each segment older than the current one that no longer holds a job:
       ``TRUNCATE`` under its exclusive lock (the rows were checked gone under it), then
       ``DETACH`` and ``DROP`` if the job table's lock is granted within ``lock_wait``.
       A segment a long transaction has read keeps its lock until that ends: it stays,
       empty, and is tried again next step.
    3. Switch new jobs to the segment attached ahead, once no transaction that began
       before its ``ATTACH`` still writes to the job table: such a transaction routes
       rows with the partitions it saw, and would fail to insert into the new one.
    4. Attach the next segment ahead once the current one has been given
       ``jobs_per_segment`` job ids, unless ``max_holding`` older segments still hold
       jobs (each open segment is one more index probe for a statement that finds a job
       by id).
    """
    if _relkind(conn, JOB_TABLE) != "p" or _relkind(conn, SEGMENTS) is None:
        return None
    conn.execute(
        "SELECT set_config('lock_timeout', %s, true)", [f"{max(1, round(lock_wait * 1000))}ms"]
    )
    current = layout(conn)
    assert current.current is not None
    disabling = bool(_saved(conn, "state"))
    others = [number for number in current.segments if number != current.current]
    older = [number for number in others if number < current.current]
    if disabling:
        # disable() waits for one segment: everything that can move goes to the current
        # one, nothing is attached, and the parked segment is emptied like the others.
        sources = [*others, PARKED] if current.parked else others
        moved = _move(conn, _CATCH_UP, sources, current.current, move_limit, everything=True)
        emptied = sources
    else:
        moved = _move(conn, _PARK, older, PARKED, move_limit) if older else 0
        lingering = [number for number in older if number < current.current - 1]
        if lingering:
            moved += _move(conn, _CATCH_UP, lingering, current.current, move_limit)
        emptied = older
    truncated: list[int] = []
    dropped: list[int] = []
    holding: list[int] = []
    for number in emptied:
        now, state = _empty(conn, number, detach=number != PARKED)
        if now:
            truncated.append(number)
        if state == "holding":
            holding.append(number)
        if state == "dropped":
            dropped.append(number)
    ahead = [number for number in current.segments if number > current.current]
    attached = switched = None
    waiting = 0
    at_bound = False
    if disabling:
        pass
    elif ahead:
        waiting = _older_writers(conn, ahead[0])
        if not waiting:
            _switch(conn, ahead[0])
            switched = ahead[0]
    elif _ids_given(conn, current.current) >= jobs_per_segment:
        attached_count = len(current.segments) - len(dropped)
        if len(holding) >= max_holding or attached_count >= MAX_ATTACHED:
            at_bound = True
        else:
            attached = current.current + 1
            _attach(conn, attached)
    return Rotation(
        attached=attached,
        switched_to=switched,
        truncated=tuple(truncated),
        dropped=tuple(dropped),
        holding=tuple(holding),
        moved=moved,
        waiting=waiting,
        at_bound=at_bound,
    )


#: Seconds ahead of now a pending job's start must be for the mover to take it from a
#: recent segment: one that starts sooner is claimed from where it is.
MOVE_HORIZON_SECONDS = 60.0

# What moves, by a cross-partition UPDATE of its segment (PostgreSQL deletes the row
# from one segment and inserts it into the other), in id order, up to a limit per step:
#
# - _PARK: from segments older than the current one, the jobs that would keep them for
#   long: blocked ones, and pending ones that start later than the horizon. They go to
#   the parked segment, which is never emptied, once (moved on at every turn, a week's
#   scheduled jobs would be written again and again).
# - _CATCH_UP: from segments older than the previous one (their jobs outlived a whole
#   segment: a backlog of partitions or keys) the pending jobs, to the current segment;
#   when disable() empties every other segment, the blocked ones as well, from any.
#
# Never a running job (its lease, heartbeat and outcome address its row), nor a pending
# one holding a coalesce key (a producer's transaction updates it, and would fail on a
# row that moved). Rows locked by anyone are skipped. A statement of another session
# that then locks or updates a moved row fails with a serialization failure (40001): a
# worker's runs again, and so do the store's statements that touch such jobs
# (_run_retrying_moves). The setting lets the row past the trigger that takes a new
# job's idempotency key (migration 0028): the moving job holds it already.
_MOVE = """
WITH moving AS (
    SELECT job.id, job.segment
    FROM {table} AS job
    WHERE job.segment = ANY (%(sources)s::integer[])
      AND ({condition})
    ORDER BY job.segment, job.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {table} AS job
SET segment = %(target)s
FROM moving
WHERE job.id = moving.id AND job.segment = moving.segment
"""
_PARK = _MOVE.format(
    table=JOB_TABLE,
    condition="job.status = 'blocked' OR (job.status = 'pending' AND job.coalesce_key IS NULL "
    "AND job.available_at > now() + make_interval(secs => %(horizon)s))",
)
_CATCH_UP = _MOVE.format(
    table=JOB_TABLE,
    condition="(job.status = 'pending' AND job.coalesce_key IS NULL) "
    "OR (job.status = 'blocked' AND %(everything)s)",
)


def _move(
    conn: psycopg.Connection[Any],
    statement: str,
    sources: list[int],
    target: int,
    limit: int,
    *,
    everything: bool = False,
) -> int:
    params = {
        "sources": sources,
        "target": target,
        "limit": limit,
        "horizon": MOVE_HORIZON_SECONDS,
        "everything": everything,
    }
    with conn.transaction():
        conn.execute("SELECT set_config('django_pgqueue.moving_segments', 'on', true)")
        moved = conn.execute(statement, params).rowcount
        conn.execute("SELECT set_config('django_pgqueue.moving_segments', 'off', true)")
    return moved


def _ids_given(conn: _Conn, number: int) -> int:
    """Job ids handed out since new jobs were pointed at segment ``number``."""
    (given,) = _one(
        conn,
        f"SELECT sequence.last_value - segment.first_id FROM {JOB_TABLE}_id_seq AS sequence, "
        f"{SEGMENTS} AS segment WHERE segment.segment = %s",
        [number],
    )
    return int(given)


def _older_writers(conn: _Conn, number: int) -> int:
    """Transactions that began before segment ``number`` was attached, hold a lock on
    the job table, and may not see that segment: their partitions were read when they
    first locked it, and stay as they were until they end. So a row they insert with
    the new segment would find no partition, and one they look for there would not be
    found. One is left out: a transaction idle with a snapshot (REPEATABLE READ) that
    has not written to the job table, since everything in the new segment was written
    after its snapshot, which cannot see it anyway."""
    (count,) = _one(
        conn,
        "SELECT count(DISTINCT lock.pid) FROM pg_locks AS lock "
        "JOIN pg_stat_activity AS activity ON activity.pid = lock.pid "
        "WHERE lock.relation = %s::regclass AND activity.pid <> pg_backend_pid() "
        f"AND activity.xact_start < (SELECT attached_at FROM {SEGMENTS} WHERE segment = %s) "
        "AND activity.state <> 'idle in transaction (aborted)' "
        "AND NOT (activity.state = 'idle in transaction' AND activity.backend_xmin IS NOT NULL "
        "    AND NOT EXISTS (SELECT FROM pg_locks AS own WHERE own.pid = lock.pid "
        "        AND own.relation = lock.relation AND own.mode = 'RowExclusiveLock'))",
        [JOB_TABLE, number],
    )
    return int(count)


def _switch(conn: psycopg.Connection[Any], number: int) -> None:
    # A sequence's value is not transactional: the switch stands even if the step rolls
    # back. It only points at a segment attached by a committed earlier step.
    conn.execute(f"SELECT setval('{SEQUENCE}', %s, true)", [number])
    conn.execute(
        f"UPDATE {SEGMENTS} SET switched_at = now(), "
        f"first_id = (SELECT last_value FROM {JOB_TABLE}_id_seq) WHERE segment = %s",
        [number],
    )


def _attach(conn: psycopg.Connection[Any], number: int) -> None:
    """A new segment, made empty and attached ahead; new jobs go to it after a switch."""
    _make_segment(conn, number, storage_of=segment_table(max(layout(conn).segments)))
    conn.execute(
        f"ALTER TABLE {JOB_TABLE} ATTACH PARTITION {segment_table(number)} FOR VALUES IN ({number})"
    )
    conn.execute(f"INSERT INTO {SEGMENTS} (segment) VALUES (%s)", [number])


def _make_segment(conn: _Conn, number: int, *, storage_of: str) -> None:
    """Segment ``number``'s table, empty, with the job table's columns, constraints and
    indexes (named after the job table's, with the segment's suffix) and the storage
    options of ``storage_of``; not attached."""
    table = segment_table(number)
    suffix = table.removeprefix(JOB_TABLE)
    (options,) = _one(
        conn, "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [storage_of]
    )
    storage = f" WITH ({', '.join(options)})" if options else ""
    conn.execute(
        f"CREATE TABLE {table} (LIKE {JOB_TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        f"INCLUDING COMMENTS INCLUDING STORAGE INCLUDING STATISTICS){storage}"
    )
    for name, definition in _plain_indexes(conn, JOB_TABLE):
        conn.execute(_retarget_index(definition, f"{name}{suffix}", table))
    conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id, segment)")
    for name in _check_constraints(conn, table, "pgq_job_segment_%"):
        conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    label = "parked" if number == PARKED else str(number)
    conn.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT pgq_job_segment_{label} CHECK (segment = {number})"
    )


def _check_constraints(conn: _Conn, table: str, like: str) -> list[str]:
    return [
        str(name)
        for (name,) in conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
            "AND contype = 'c' AND conname LIKE %s",
            [table, like],
        ).fetchall()
    ]


def _snapshots_that_may_see(conn: _Conn, number: int) -> int:
    """Sessions idle in a transaction with a snapshot taken after new jobs first went to
    segment ``number`` (so it may see some of its rows, since deleted), that have not
    read the job table yet (reading it would have locked the segment). TRUNCATE is not
    MVCC-safe: such a REPEATABLE READ transaction reading the job table afterwards would
    find the segment empty, and miss jobs its snapshot saw there (now in the history,
    where its snapshot does not see them). A snapshot older than that moment cannot see
    any row of the segment: every version in it was written later, a moved job's too."""
    (count,) = _one(
        conn,
        "SELECT count(*) FROM pg_stat_activity AS activity "
        "WHERE activity.pid <> pg_backend_pid() AND activity.backend_xmin IS NOT NULL "
        "AND activity.state = 'idle in transaction' "
        "AND activity.xact_start >= coalesce("
        f"    (SELECT switched_at FROM {SEGMENTS} WHERE segment = %s), '-infinity')",
        [number],
    )
    return int(count)


def _empty(conn: psycopg.Connection[Any], number: int, *, detach: bool = True) -> tuple[bool, str]:
    """Empty segment ``number`` if it holds no job. Returns whether it was truncated
    now, and what it is: "holding" jobs, "busy" (a lock was not granted), "kept" (empty,
    still attached) or "dropped"."""
    table = segment_table(number)
    (size,) = _one(conn, "SELECT pg_relation_size(%s::regclass)", [table])
    truncated = False
    if size:
        # Checked first without the lock, which would stop every statement on the job
        # table's segments while it waits.
        if conn.execute(f"SELECT EXISTS (SELECT FROM {table})").fetchone() != (False,):
            return False, "holding"
        try:
            with conn.transaction():
                conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                # Under the lock no writer is left: what this sees is all there is.
                if conn.execute(f"SELECT EXISTS (SELECT FROM {table})").fetchone() != (False,):
                    return False, "holding"
                if _snapshots_that_may_see(conn, number):
                    return False, "busy"
                conn.execute(f"TRUNCATE {table}")
                truncated = True
        except psycopg.errors.LockNotAvailable:
            return False, "busy"
    if not detach:
        return truncated, "kept"
    try:
        with conn.transaction():
            conn.execute(f"ALTER TABLE {JOB_TABLE} DETACH PARTITION {table}")
            conn.execute(f"DROP TABLE {table}")
            conn.execute(f"DELETE FROM {SEGMENTS} WHERE segment = %s", [number])
    except psycopg.errors.LockNotAvailable:
        return truncated, "kept"
    return truncated, "dropped"


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
    for name, definition in _plain_indexes(conn, JOB_TABLE):
        conn.execute(_retarget_index(definition, f"{name}_p", PARENT, only=True))
        _copy_index_comment(conn, name, f"{name}_p")
    _copy_table_extras(conn, JOB_TABLE, PARENT)


def _enable_swap(cur: psycopg.Cursor[Any]) -> None:
    cur.execute(f"LOCK TABLE {JOB_TABLE} IN ACCESS EXCLUSIVE MODE")
    # Built before the lock: a column, an index or a grant that changed since is found
    # here, and the conversion stops rather than losing it.
    _require_same_shape(cur, JOB_TABLE, PARENT)
    (last, called) = _one(cur, f"SELECT last_value, is_called FROM {JOB_TABLE}_id_seq")
    cur.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)", [PARENT, last, called])
    view = _view_definition(cur)
    triggers = _triggers(cur, JOB_TABLE)
    indexes = [name for name, _ in _plain_indexes(cur, JOB_TABLE)]
    named = [signature for signature, _ in _functions_of_row_type(cur, JOB_TABLE)]
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
    invalid = _invalid_indexes(cur, JOB_TABLE)
    if invalid:
        raise SegmentLayoutError(
            "these indexes of the partitioned table found no match in segment 0: "
            + ", ".join(invalid)
        )


def _disable_swap(cur: psycopg.Cursor[Any], number: int) -> None:
    table = segment_table(number)
    cur.execute(f"LOCK TABLE {JOB_TABLE} IN ACCESS EXCLUSIVE MODE")
    if _relkind(cur, PARKED_TABLE) is not None:
        if cur.execute(f"SELECT EXISTS (SELECT FROM {PARKED_TABLE})").fetchone() != (False,):
            raise SegmentLayoutError("the parked segment holds jobs again: run disable again")
        cur.execute(f"ALTER TABLE {JOB_TABLE} DETACH PARTITION {PARKED_TABLE}")
        cur.execute(f"DROP TABLE {PARKED_TABLE}")
    (last, called) = _one(cur, f"SELECT last_value, is_called FROM {JOB_TABLE}_id_seq")
    (identity,) = _one(
        cur,
        "SELECT attidentity FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'id'",
        [JOB_TABLE],
    )
    view = _view_definition(cur)
    triggers = _triggers(cur, JOB_TABLE)
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
    sequence_grants = _sequence_grants(cur, JOB_TABLE)
    _copy_table_extras(cur, JOB_TABLE, table, sequence=False)
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
    _grant(cur, sequence_grants, "SEQUENCE", sql.Identifier(f"{JOB_TABLE}_id_seq"))
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


@dataclass(frozen=True)
class _Patience:
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


def _swap(
    conn: psycopg.Connection[Any], body: Callable[[psycopg.Cursor[Any]], None], patience: _Patience
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


# --- catalog helpers ----------------------------------------------------------------

_Conn = psycopg.Connection[Any] | psycopg.Cursor[Any]


def _one(
    conn: _Conn, query: str | sql.Composed, params: list[Any] | None = None
) -> tuple[Any, ...]:
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise SegmentLayoutError(f"no row from the catalog for: {query}")
    return tuple(row)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _require_autocommit(conn: psycopg.Connection[Any]) -> None:
    if not conn.autocommit:
        raise SegmentLayoutError(
            "the connection must be in autocommit mode: the indexes are built concurrently"
        )


def _require_latest_migration(conn: psycopg.Connection[Any]) -> None:
    from django.db.migrations.loader import MigrationLoader

    from django_pgqueue.store.schema import APP_LABEL

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


def _relkind(conn: _Conn, table: str) -> str | None:
    row = conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table]
    ).fetchone()
    return None if row is None else str(row[0])


def _has_constraint(conn: _Conn, table: str, name: str, *, validated: bool = False) -> bool:
    return (
        conn.execute(
            "SELECT FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s "
            "AND (convalidated OR NOT %s)",
            [table, name, validated],
        ).fetchone()
        is not None
    )


def _has_column(conn: _Conn, table: str, name: str) -> bool:
    return (
        conn.execute(
            "SELECT FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s "
            "AND NOT attisdropped",
            [table, name],
        ).fetchone()
        is not None
    )


def _alter(conn: psycopg.Connection[Any], statement: str, patience: _Patience) -> None:
    """One statement that needs the job table's exclusive lock, behind ``lock_timeout``."""

    def body(cur: psycopg.Cursor[Any]) -> None:
        cur.execute(statement)

    _swap(conn, body, patience)


def _unique_indexes(conn: _Conn, table: str) -> list[str]:
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


def _plain_indexes(conn: _Conn, table: str) -> list[tuple[str, str]]:
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


def _invalid_indexes(conn: _Conn, table: str) -> list[str]:
    return [
        name
        for (name,) in conn.execute(
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = %s::regclass AND NOT indisvalid ORDER BY 1",
            [table],
        ).fetchall()
    ]


def _index_definition(conn: _Conn, name: str) -> str | None:
    row = conn.execute(
        "SELECT pg_get_indexdef(pg_index.indexrelid) FROM pg_index "
        "WHERE pg_index.indexrelid = to_regclass(%s) AND pg_index.indisvalid",
        [name],
    ).fetchone()
    return None if row is None else str(row[0])


_INDEX_HEAD = re.compile(
    r"^CREATE (?P<unique>UNIQUE )?INDEX (?P<name>\S+) ON (?:ONLY )?(?P<table>\S+) USING "
)


def _retarget_index(
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


def _build_concurrently(conn: psycopg.Connection[Any], name: str, statement: str) -> None:
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


def _functions_of_row_type(conn: _Conn, table: str) -> list[tuple[str, str]]:
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


def _make_layout_free(conn: psycopg.Connection[Any], functions: list[tuple[str, str]]) -> None:
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
    columns = _job_columns(conn)
    if _relkind(conn, COALESCED_TYPE) is None:
        conn.execute(
            f"CREATE TYPE {COALESCED_TYPE} AS ("
            + ", ".join(f"{name} {kind}" for name, kind in columns)
            + ")"
        )
    names = ", ".join(name for name, _ in columns)
    with conn.transaction():
        for signature, definition in functions:
            grants = _function_grants(conn, signature)
            conn.execute(f"DROP FUNCTION {signature}")
            _recreate_function(conn, signature, _layout_free(definition, names), grants)


def _job_columns(conn: _Conn) -> list[tuple[str, str]]:
    return [
        (str(name), str(kind))
        for name, kind in conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "AND attname <> 'segment' ORDER BY attnum",
            [JOB_TABLE],
        ).fetchall()
    ]


def _layout_free(definition: str, columns: str) -> str:
    """``definition`` (the coalesced enqueue's) as :func:`_make_layout_free` makes it.

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


def _save(conn: _Conn, kind: str, name: str, definition: str) -> None:
    conn.execute(
        f"INSERT INTO {SAVED} (kind, name, definition) VALUES (%s, %s, %s) "
        "ON CONFLICT (kind, name) DO NOTHING",
        [kind, name, definition],
    )


def _saved(conn: _Conn, kind: str) -> list[tuple[str, str]]:
    if _relkind(conn, SAVED) is None:
        return []
    return [
        (str(name), str(definition))
        for name, definition in conn.execute(
            f"SELECT name, definition FROM {SAVED} WHERE kind = %s ORDER BY name", [kind]
        ).fetchall()
    ]


def _copy_index_comment(conn: _Conn, source: str, target: str) -> None:
    (comment,) = _one(conn, "SELECT obj_description(%s::regclass, 'pg_class')", [source])
    conn.execute(
        sql.SQL("COMMENT ON INDEX {} IS {}").format(sql.Identifier(target), sql.Literal(comment))
    )


def _view_definition(conn: _Conn) -> str:
    (definition,) = _one(conn, "SELECT pg_get_viewdef(%s::regclass)", [VIEW])
    return str(definition)


def _triggers(conn: _Conn, table: str) -> list[tuple[str, str]]:
    return [
        (str(name), str(definition))
        for name, definition in conn.execute(
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY tgname",
            [table],
        ).fetchall()
    ]


def _copy_table_extras(conn: _Conn, source: str, target: str, *, sequence: bool = True) -> None:
    """The owner, grants and comment of table ``source`` (and, with ``sequence``, the
    grants of its identity sequence) onto ``target``: LIKE copies none of them."""
    (owner, comment) = _one(
        conn,
        "SELECT pg_get_userbyid(relowner), obj_description(oid, 'pg_class') FROM pg_class "
        "WHERE oid = %s::regclass",
        [source],
    )
    conn.execute(
        sql.SQL("ALTER TABLE {} OWNER TO {}").format(sql.Identifier(target), sql.Identifier(owner))
    )
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(target), sql.Literal(comment))
    )
    _grant(conn, _relation_grants(conn, source), "TABLE", sql.Identifier(target))
    if sequence:
        (name,) = _one(conn, "SELECT pg_get_serial_sequence(%s, 'id')", [target])
        _grant(conn, _sequence_grants(conn, source), "SEQUENCE", sql.SQL(name))


Grants = list[tuple[str | None, str, bool]]

_ACL = (
    "SELECT CASE WHEN grant_.grantee = 0 THEN NULL ELSE pg_get_userbyid(grant_.grantee) END, "
    "grant_.privilege_type, grant_.is_grantable FROM {catalog}, aclexplode({acl}) AS grant_ "
    "WHERE {catalog}.oid = %s AND grant_.grantee <> {catalog}.{owner}"
)


def _relation_grants(conn: _Conn, relation: str) -> Grants:
    (oid,) = _one(conn, "SELECT %s::regclass::oid", [relation])
    query = _ACL.format(catalog="pg_class", acl="pg_class.relacl", owner="relowner")
    return [tuple(row) for row in conn.execute(query, [oid]).fetchall()]


def _sequence_grants(conn: _Conn, table: str) -> Grants:
    (oid,) = _one(conn, "SELECT pg_get_serial_sequence(%s, 'id')::regclass::oid", [table])
    query = _ACL.format(catalog="pg_class", acl="pg_class.relacl", owner="relowner")
    return [tuple(row) for row in conn.execute(query, [oid]).fetchall()]


def _function_grants(conn: _Conn, signature: str) -> Grants | None:
    """The function's grants, or None when it has the default ones (PUBLIC may run it)."""
    (oid, acl) = _one(
        conn, "SELECT oid, proacl FROM pg_proc WHERE oid = %s::regprocedure", [signature]
    )
    if acl is None:
        return None
    query = _ACL.format(catalog="pg_proc", acl="pg_proc.proacl", owner="proowner")
    return [tuple(row) for row in conn.execute(query, [oid]).fetchall()]


def _grant(conn: _Conn, grants: Grants, kind: str, target: sql.Composable) -> None:
    for grantee, privilege, grantable in grants:
        conn.execute(
            sql.SQL("GRANT {} ON {} {} TO {}{}").format(
                sql.SQL(privilege),
                sql.SQL(kind),
                target,
                sql.SQL("PUBLIC") if grantee is None else sql.Identifier(grantee),
                sql.SQL(" WITH GRANT OPTION" if grantable else ""),
            )
        )


def _recreate_function(conn: _Conn, signature: str, definition: str, grants: Grants | None) -> None:
    conn.execute(definition)
    if grants is not None:
        target = sql.SQL(signature)
        conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(target))
        _grant(conn, grants, "FUNCTION", target)


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
    mine = {name for name, _ in _plain_indexes(cur, table)}
    theirs = {name.removesuffix("_p") for name, _ in _plain_indexes(cur, parent)}
    if mine != theirs:
        raise SegmentLayoutError(
            f"{table}'s indexes changed while the conversion ran (a migration?): run it again"
        )
