"""What every statement module shares: the runner, the named statements, and small helpers.

The modules beside this one each run one ``sql/*.sql`` file;
:class:`~django_pgqueue.store.queue.QueueStore` combines them. Nothing else in the package
executes queue SQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from django_pgqueue.exceptions import InvalidOption, LeaseLost
from django_pgqueue.limits import JOB_ID_MAX, JOB_ID_MIN
from django_pgqueue.store.runners import Result, Runner
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import Lease, OperatorResult

# Fixed key of the housekeeping advisory lock: the first 8 bytes of sha1("django_pgqueue").
HOUSEKEEPING_LOCK_KEY = 0x1F2B_8D6A_4C3E_5A71
# Fixed key of the schedule sync lock: the next 8 bytes of sha1("django_pgqueue").
SCHEDULE_SYNC_LOCK_KEY = 0x3B6F_0E2D_91C4_7A58
# Largest number of ids an operator statement handles at once.
OPERATOR_CHUNK = 1000
#: How long (seconds) a cancel keeps trying a job whose row is locked before it reports
#: the job busy: longer than any bookkeeping statement, shorter than an admin's patience.
CANCEL_PATIENCE = 1.0
# Urgent signals one fold takes, and partitions and keys one wake-up wakes (the claim
# folds and wakes before it claims).
FOLD_BATCH = 1000
# Lazy signals one fold_lazy_signals takes (housekeeping, off the claim path).
LAZY_FOLD_BATCH = 2000
#: Tries of a statement that met a job moving between segments of the job table.
MOVE_TRIES = 5


def moved_row(error: BaseException) -> bool:
    """Whether ``error`` is a serialization failure (40001), as a statement of a READ
    COMMITTED transaction gets when a row it locks or updates moved to another segment
    of the job table meanwhile. Django wraps psycopg's error; both are recognised."""
    return isinstance(error, psycopg.errors.SerializationFailure) or isinstance(
        error.__cause__, psycopg.errors.SerializationFailure
    )


def timeout_setting(seconds: float | None) -> str:
    """Return ``seconds`` as a value for a server timeout setting ('0': none).

    At least a millisecond: a positive timeout must never round to '0', which turns the
    timeout off.
    """
    return "0" if seconds is None else f"{max(1, round(seconds * 1000))}ms"


class StoreBase:
    """One connection's runner, and how a statement is run on it."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def _run(self, name: str, **params: Any) -> Result:
        return self.runner.run(QUERIES[name], params)

    def _run_retrying_moves(self, name: str, **params: Any) -> Result:
        """Run a statement that locks or updates jobs which housekeeping may move to
        another segment of the job table (pending or blocked ones), in a savepoint of
        the caller's transaction; run it again when it met a moved row. The next try's
        snapshot finds the row where it went. In the plain layout no row ever moves."""
        return self._retrying_moves(lambda: self._run(name, **params))

    def _retrying_moves[T](self, work: Callable[[], T]) -> T:
        for attempt in range(1, MOVE_TRIES + 1):
            try:
                with self.runner.atomic():
                    return work()
            except Exception as error:
                if attempt == MOVE_TRIES or not moved_row(error):
                    raise
        raise AssertionError("unreachable")

    def _run_fenced(self, name: str, lease: Lease, **params: Any) -> tuple[Any, ...]:
        """Run a single-job ``_if_leased`` statement; return its row or raise LeaseLost."""
        rows = self._run(
            name,
            job_id=lease.job_id,
            lease_generation=lease.lease_generation,
            worker_id=lease.worker_id,
            **params,
        ).rows
        if not rows:
            raise LeaseLost(lease.job_id, lease.lease_generation, lease.worker_id)
        row: tuple[Any, ...] = rows[0]
        return row


def inserted_rows(result: Result) -> list[tuple[int, datetime, datetime, str | None]]:
    """Return ``(id, created_at, available_at, idempotency_key)`` per job a bulk insert wrote.

    The statements answer with one row of arrays (see ``enqueue_many`` in enqueue.sql),
    leaving out the available times and keys when they say nothing new.
    """
    ids, created_at, available_at, keys, _notified = result.rows[0]
    if ids is None:
        return []
    count = len(ids)
    if available_at is None:
        available_at = [created_at] * count
    if keys is None:
        keys = [None] * count
    # strict: arrays of different lengths raise rather than pair the wrong jobs.
    return list(zip(ids, [created_at] * count, available_at, keys, strict=True))


def loads_json(text: str) -> Any:
    """``json.loads``, with the empty array and object most jobs carry decoded for free.

    A claim decodes three documents per job (arguments, keyword arguments, the workers
    of earlier attempts); for a job with none of them that was a tenth of a worker's
    time. Fresh containers each time: a task may change what it is given.
    """
    if text == "[]":
        return []
    if text == "{}":
        return {}
    return json.loads(text)


def leases_document(leases: Sequence[Lease]) -> str:
    return "[" + ",".join(f"[{lease.job_id},{lease.lease_generation}]" for lease in leases) + "]"


def unique_ids(job_ids: Iterable[int]) -> list[int]:
    ids = []
    for job_id in job_ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise InvalidOption("job_ids", f"must be integers, not {job_id!r}")
        if not JOB_ID_MIN <= job_id <= JOB_ID_MAX:
            # Checked here: PostgreSQL would refuse the array and abort the transaction.
            raise InvalidOption("job_ids", f"{job_id} is outside the range of job ids (bigint)")
        ids.append(job_id)
    return sorted(set(ids))


def operator_result(requested: list[int], done: Iterable[int]) -> OperatorResult:
    done_set = set(done)
    return OperatorResult(
        done=tuple(sorted(done_set)),
        skipped=tuple(job_id for job_id in requested if job_id not in done_set),
    )
