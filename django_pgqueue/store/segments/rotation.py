"""Housekeeping's rotation of the job table's segments: attach, switch, move, empty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from django_pgqueue.store.segments.catalog import (
    JOB_TABLE,
    PARKED,
    SEGMENTS,
    SEQUENCE,
    Conn,
    check_constraints,
    layout,
    one_row,
    plain_indexes,
    relkind,
    retarget_index,
    saved_definitions,
    segment_table,
)


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
       for long: to the parked segment, or to the current one (see :data:`_MOVE`).
    2. Empty each segment older than the current one that no longer holds a job and
       that no snapshot may still read: ``DETACH`` and ``DROP`` under the job table's
       lock if it is granted in time (:func:`emptying_wait`), else ``TRUNCATE`` under
       the segment's own; see :class:`_Emptying`. A segment a long transaction has read
       keeps its lock until that ends, and is tried again next step.
    3. Switch new jobs to the segment attached ahead, once no transaction that began
       before its ``ATTACH`` may miss it (see :func:`_older_writers`): such a
       transaction keeps the partitions it saw, and would fail to insert into the new
       segment, or not find a job there.
    4. Attach the next segment ahead once the current one has been given
       ``jobs_per_segment`` job ids, unless ``max_holding`` older segments still hold
       jobs (each open segment is one more index probe for a statement that finds a job
       by id).
    """
    if relkind(conn, JOB_TABLE) != "p" or relkind(conn, SEGMENTS) is None:
        return None
    _lock_timeout(conn, lock_wait)
    current = layout(conn)
    assert current.current is not None
    disabling = bool(saved_definitions(conn, "state"))
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
    # Checked first without a lock: waiting for one stops every statement on the job
    # table's segments.
    holding = [number for number in emptied if _holds_jobs(conn, number)]
    candidates = [
        number
        for number in sorted(emptied)
        if number not in holding and not _snapshots_that_may_see(conn, number)
    ]
    emptying = _Emptying(conn, candidates)
    emptying.run(emptying_wait(lock_wait, len(candidates)), lock_wait)
    holding.extend(emptying.holding)
    truncated, dropped = emptying.truncated, emptying.dropped
    _lock_timeout(conn, lock_wait)
    ahead = [number for number in current.segments if number > current.current]
    attached = switched = None
    waiting = 0
    at_bound = False
    if disabling:
        pass  # nothing attached or switched to: disable() is bringing them down to one
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


#: The most the lock wait of emptying grows to, as a multiple of the step's.
EMPTYING_WAIT_GROWTH = 8


def emptying_wait(lock_wait: float, waiting: int) -> float:
    """The lock wait for emptying old segments when ``waiting`` of them are attached.

    Each lock emptying takes (a segment's to ``TRUNCATE``, the job table's to
    ``DETACH``) queues every statement on the job table behind it while it waits, so the
    first try is short. But workers under load always hold some lock on the table, and a
    short wait may never find a gap: refused step after step, emptied segments stay
    attached, and every statement that finds a job by id probes each of them (measured:
    ten attached cost a fifth of the drain). So the wait doubles with each segment left
    waiting, up to :data:`EMPTYING_WAIT_GROWTH` times the first: a pause of the queue
    once, then one segment again."""
    growth: int = min(2 ** max(waiting - 1, 0), EMPTYING_WAIT_GROWTH)
    return lock_wait * growth


def _lock_timeout(conn: Conn, seconds: float) -> None:
    conn.execute(
        "SELECT set_config('lock_timeout', %s, true)", [f"{max(1, round(seconds * 1000))}ms"]
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


def _ids_given(conn: Conn, number: int) -> int:
    """Job ids handed out since new jobs were pointed at segment ``number``."""
    (given,) = one_row(
        conn,
        f"SELECT sequence.last_value - segment.first_id FROM {JOB_TABLE}_id_seq AS sequence, "
        f"{SEGMENTS} AS segment WHERE segment.segment = %s",
        [number],
    )
    return int(given)


def _older_writers(conn: Conn, number: int) -> int:
    """Transactions that began before segment ``number`` was attached, hold a lock on
    the job table, and may not see that segment: their partitions were read when they
    first locked it, and stay as they were until they end. So a row they insert with
    the new segment would find no partition, and one they look for there would not be
    found. One is left out: a transaction idle with a snapshot (REPEATABLE READ) that
    has not written to the job table, since everything in the new segment was written
    after its snapshot, which cannot see it anyway."""
    (count,) = one_row(
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
    make_segment(conn, number, storage_of=segment_table(max(layout(conn).segments)))
    conn.execute(
        f"ALTER TABLE {JOB_TABLE} ATTACH PARTITION {segment_table(number)} FOR VALUES IN ({number})"
    )
    conn.execute(f"INSERT INTO {SEGMENTS} (segment) VALUES (%s)", [number])


def make_segment(conn: Conn, number: int, *, storage_of: str) -> None:
    """Segment ``number``'s table, empty, with the job table's columns, constraints and
    indexes (named after the job table's, with the segment's suffix) and the storage
    options of ``storage_of``; not attached."""
    table = segment_table(number)
    suffix = table.removeprefix(JOB_TABLE)
    (options,) = one_row(
        conn, "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", [storage_of]
    )
    storage = f" WITH ({', '.join(options)})" if options else ""
    conn.execute(
        f"CREATE TABLE {table} (LIKE {JOB_TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
        f"INCLUDING COMMENTS INCLUDING STORAGE INCLUDING STATISTICS){storage}"
    )
    for name, definition in plain_indexes(conn, JOB_TABLE):
        conn.execute(retarget_index(definition, f"{name}{suffix}", table))
    conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (id, segment)")
    for name in check_constraints(conn, table, "pgq_job_segment_%"):
        conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    label = "parked" if number == PARKED else str(number)
    conn.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT pgq_job_segment_{label} CHECK (segment = {number})"
    )


def _snapshots_that_may_see(conn: Conn, number: int) -> int:
    """Sessions idle in a transaction with a snapshot taken after new jobs first went to
    segment ``number`` (so it may see some of its rows, since deleted), that have not
    read the job table yet (reading it would have locked the segment). TRUNCATE is not
    MVCC-safe: such a REPEATABLE READ transaction reading the job table afterwards would
    find the segment empty, and miss jobs its snapshot saw there (now in the history,
    where its snapshot does not see them). A snapshot older than that moment cannot see
    any row of the segment: every version in it was written later, a moved job's too."""
    (count,) = one_row(
        conn,
        "SELECT count(*) FROM pg_stat_activity AS activity "
        "WHERE activity.pid <> pg_backend_pid() AND activity.backend_xmin IS NOT NULL "
        "AND activity.state = 'idle in transaction' "
        "AND activity.xact_start >= coalesce("
        f"    (SELECT switched_at FROM {SEGMENTS} WHERE segment = %s), '-infinity')",
        [number],
    )
    return int(count)


def _holds_jobs(conn: Conn, number: int) -> bool:
    return conn.execute(f"SELECT EXISTS (SELECT FROM {segment_table(number)})").fetchone() != (
        False,
    )


class _Emptying:
    """Empty the old segments ``candidates`` (ascending) that hold no job and no
    snapshot may still read, in housekeeping's transaction.

    A segment's rows go with it when it is detached and dropped, and the job table's
    exclusive lock that takes is asked for first: once it is held, no other session can
    hold or ask for a segment's lock (every statement locks the job table before its
    segments), so each segment's lock is granted at once. The other way round would
    hang: holding a segment's lock (after a TRUNCATE), this step would wait for the job
    table's while the workers holding that wait for the segment, until the lock timeout
    ends it, with the queue stopped all along.

    When the job table's lock is refused (a long transaction holds it, or the workers
    kept it busy for the whole wait), segments are only truncated, each under its own
    lock: their rows go and they stay attached, empty, for a later step to detach. That
    wait is the step's short one, and after one refusal a lock is taken only if free at
    once: a step pauses the queue twice at most.
    """

    def __init__(self, conn: psycopg.Connection[Any], candidates: list[int]) -> None:
        self.conn = conn
        self.candidates = candidates
        self.truncated: list[int] = []
        self.dropped: list[int] = []
        self.holding: list[int] = []

    def run(self, wait: float, short_wait: float) -> None:
        if not self.candidates:
            return
        detachable = [number for number in self.candidates if number != PARKED]
        if detachable and self._lock(JOB_TABLE, wait, only=True):
            for number in self.candidates:
                self._empty(number, detach=number != PARKED)
            return
        for number in self.candidates:
            if not self._empty(number, detach=False, wait=short_wait):
                return

    def _lock(self, table: str, wait: float | None, *, only: bool = False) -> bool:
        """Take ``table``'s exclusive lock for the rest of the step, waiting at most
        ``wait`` seconds (None: only if free now); whether it was granted."""
        scope = "ONLY " if only else ""
        if wait is not None:
            _lock_timeout(self.conn, wait)
        try:
            with self.conn.transaction():
                self.conn.execute(
                    f"LOCK TABLE {scope}{table} IN ACCESS EXCLUSIVE MODE"
                    + ("" if wait is not None else " NOWAIT")
                )
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    def _empty(self, number: int, *, detach: bool, wait: float | None = None) -> bool:
        """Empty segment ``number`` under its lock (waiting as :meth:`_lock` does);
        whether the lock was granted."""
        table = segment_table(number)
        (size,) = one_row(self.conn, "SELECT pg_relation_size(%s::regclass)", [table])
        if not size and not detach:
            return True  # truncated already
        with self.conn.transaction() as step:
            if not self._lock(table, wait):
                return False
            # Under the lock no writer is left: what this sees is all there is. A
            # segment left as it is gives its lock back (the savepoint's rollback): held
            # to the step's end, it would stop every statement on the job table.
            if _holds_jobs(self.conn, number):
                self.holding.append(number)
                raise psycopg.Rollback(step)
            if _snapshots_that_may_see(self.conn, number):
                raise psycopg.Rollback(step)
            if detach:
                self.conn.execute(f"ALTER TABLE {JOB_TABLE} DETACH PARTITION {table}")
                self.conn.execute(f"DROP TABLE {table}")
                self.conn.execute(f"DELETE FROM {SEGMENTS} WHERE segment = %s", [number])
                self.dropped.append(number)
            else:
                self.conn.execute(f"TRUNCATE {table}")
            if size:
                self.truncated.append(number)
        return True
