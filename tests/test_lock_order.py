"""Statements that lock several partition or concurrency-key rows take them in key order.

Two such statements can then wait on each other only one way, never in a cycle. Each
test pauses another transaction between two rows it locks in key order (as a completion
batch or an urgent fold does, between two partitions of one statement), lets
housekeeping's lazy fold queue behind its first row, and then lets it take its second:
a fold that had locked that second row out of order deadlocks here (one side gets
``DeadlockDetected`` after ``deadlock_timeout``).
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.values import JobSpec
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(60)

# 'a' sorts before 'b'. Partition 'a' runs its next job (nothing else to claim: stale),
# 'b' names a next job that can start (not stale). Job ids are placeholders: the rows are
# only looked at, and 'a' is refreshed from the (empty) job table.
PARTITION_ROWS = """
INSERT INTO django_pgqueue_partition (
    partition_key, queue, head_id, head_priority, head_available_at, running_id, refreshed_at
)
VALUES ('a', 'default', 1, 0, now(), 1, now()), ('b', 'default', 2, 0, now(), NULL, now())
"""
# Key 'b' has room and a next job that can start (not stale).
KEY_ROW = """
INSERT INTO django_pgqueue_concurrency (
    concurrency_key, queue, max_in_flight, in_flight, head_id, head_priority,
    head_available_at, refreshed_at
)
VALUES ('b', 'default', 1, 0, 2, 0, now(), now())
"""


def _fold_in_thread(store: QueueStore) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def fold() -> None:
        try:
            outcome["result"] = store.fold_lazy_signals()
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=fold, daemon=True)
    thread.start()
    return thread, outcome


def _waiting_on_a_lock(observer: psycopg.Connection[Any], pid: int) -> bool:
    row = observer.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
    ).fetchone()
    return row is not None and row[0] == "Lock"


# (table, rows before, what the other transaction does to row 'a' first)
CASES = [
    pytest.param(
        (
            "partition",
            PARTITION_ROWS,
            "SELECT 1 FROM django_pgqueue_partition WHERE partition_key = 'a' FOR UPDATE",
        ),
        id="partition-row-with-nothing-to-claim",
    ),
    pytest.param(
        (
            "partition",
            PARTITION_ROWS.replace("('a', 'default', 1, 0, now(), 1, now()), ", ""),
            "INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)"
            " VALUES ('a', now())",
        ),
        id="partition-without-a-row",
    ),
    pytest.param(
        (
            "concurrency",
            KEY_ROW,
            "INSERT INTO django_pgqueue_concurrency (concurrency_key, refreshed_at)"
            " VALUES ('a', now())",
        ),
        id="key-without-a-row",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_the_lazy_fold_locks_in_key_order_beside_a_statement_that_does(
    make_store, open_connection, observer, case
):
    table, setup, first = case
    key_column = "partition_key" if table == "partition" else "concurrency_key"
    observer.execute(setup)
    if table == "partition":
        # Each names a job behind 'b''s next job (2), as a producer's lazy signal does: a
        # signal naming no job makes the fold refresh its partition (migration 0024).
        observer.execute(
            "INSERT INTO django_pgqueue_partition_signal (partition_key, urgent, job_id)"
            " VALUES ('a', false, 3), ('b', false, 3)"
        )
    else:
        # 'b''s row names the key's best ready job, as a refresh leaves it: a row naming
        # another makes the fold refresh the key (migration 0025).
        best = (
            make_store()
            .enqueue(JobSpec("tests.tasks.noop", concurrency_key="b", concurrency_limit=1))
            .job
        )
        observer.execute("DELETE FROM django_pgqueue_concurrency_signal")
        observer.execute(
            "UPDATE django_pgqueue_concurrency SET head_id = %s WHERE concurrency_key = 'b'",
            [best.pk],
        )
        observer.execute(
            "INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent)"
            " VALUES ('a', false), ('b', false)"
        )
    holder = open_connection()
    fold_store = make_store()
    fold_pid = fold_store.runner.connection.info.backend_pid
    with holder.transaction():
        holder.execute("SET LOCAL lock_timeout = '20s'")
        holder.execute(first)  # row 'a', as a statement locking 'a' then 'b' would
        thread, outcome = _fold_in_thread(fold_store)
        wait_for(
            lambda: _waiting_on_a_lock(observer, fold_pid),
            timeout=20,
            message="the lazy fold to wait for row 'a'",
        )
        # Its second row. A fold holding 'b' already closes a cycle here.
        holder.execute(f"SELECT 1 FROM django_pgqueue_{table} WHERE {key_column} = 'b' FOR UPDATE")
    thread.join(timeout=20)
    assert not thread.is_alive(), "the lazy fold is still waiting"
    assert "error" not in outcome, outcome
    taken, refreshed = outcome["result"]
    assert (taken, refreshed) == (2, 1), "both signals folded, only 'a' refreshed"
