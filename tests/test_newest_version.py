"""Partition and key rows are looked up newest version first (migration 0023).

Every job a partition or key starts or finishes writes a new version of its row, which a
long-held snapshot keeps from VACUUM. A lookup by ``key = x`` visits every version, oldest
first; the enqueue probes and the lock-or-create loops of the fold and refresh functions
read the primary key backward from the newest and stop at the one version they see.

The cost is counted in index entries returned (dead ones included), never in seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.test import override_settings

from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tasks.sqlsync import sync_sql_settings
from tests.claim_params import claim_params
from tests.plans import explain
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(300)

#: Versions each row is given under the held snapshot.
VERSIONS = 300
#: Entries a lookup from the newest version may read: the visible one, and a few more
#: where a new version landed on a page with room left.
NEWEST_FIRST = 10

PARTITION, KEY = "partition", "key"
TABLE = {PARTITION: "django_pgqueue_partition", KEY: "django_pgqueue_concurrency"}
COLUMN = {PARTITION: "partition_key", KEY: "concurrency_key"}
NAME = {PARTITION: "p-churned", KEY: "queue:low"}
#: One claim of up to ten jobs of the default queue, every floor at the head.
CLAIM = claim_params(10, worker_id="w")


def _spec(kind: str, **extra: Any) -> JobSpec:
    if kind == PARTITION:
        return JobSpec("tests.tasks.noop", partition_key=NAME[kind], **extra)
    return JobSpec("tests.tasks.noop", concurrency_key=NAME[kind], concurrency_limit=2, **extra)


def _entries(conn: psycopg.Connection[Any], kind: str) -> int:
    """Index entries this transaction has read from the kind's row table (every index)."""
    (count,) = conn.execute(
        "SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::bigint FROM pg_index "
        "WHERE indrelid = %s::regclass",
        [TABLE[kind]],
    ).fetchone()
    return int(count)


def _read_by(conn: psycopg.Connection[Any], kind: str, action: Callable[[], object]) -> int:
    """Entries ``action`` reads on ``conn``, in a transaction rolled back afterwards."""
    with conn.transaction(force_rollback=True):
        before = _entries(conn, kind)
        action()
        return _entries(conn, kind) - before


@pytest.fixture
def churned(open_connection) -> Iterator[Callable[[str], None]]:
    """Give a kind's row VERSIONS versions that a held snapshot keeps."""
    holder = open_connection()
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM django_pgqueue_queue_pause").fetchone()
    writer = open_connection()

    def churn(kind: str) -> None:
        # head_priority is in the claim index: no update can be HOT, each one leaves a
        # primary-key entry, as a claim's or a refresh's does. An even count leaves the
        # row as it was.
        for step in range(VERSIONS):
            writer.execute(
                f"UPDATE {TABLE[kind]} SET head_priority = head_priority + %s "
                f"WHERE {COLUMN[kind]} = %s",
                [1 if step % 2 == 0 else -1, NAME[kind]],
            )

    yield churn
    holder.execute("ROLLBACK")


@pytest.fixture
def low_queue_limit(transactional_db: None) -> Iterator[None]:
    """A concurrency limit on the queue "low", as the SQL enqueue function reads it."""
    with override_settings(PGQUEUE_CONCURRENCY_LIMITS={"queue:low": 2}):
        sync_sql_settings("default", synced_by="test")
        yield
    sync_sql_settings("default", synced_by="test")


def _prepare(store: QueueStore, churn: Callable[[str], None], kind: str) -> None:
    """A row naming a pending next job, with VERSIONS versions behind it."""
    store.enqueue(_spec(kind, queue="low"))
    store.fold_signals()
    churn(kind)


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_a_lookup_by_equality_walks_every_version(store, open_connection, churned, kind):
    """The control: the churn made the versions the other tests do not walk."""
    _prepare(store, churned, kind)
    conn = open_connection()
    entries = _read_by(
        conn,
        kind,
        lambda: conn.execute(
            f"SELECT 1 FROM {TABLE[kind]} WHERE {COLUMN[kind]} = %s", [NAME[kind]]
        ).fetchall(),
    )
    assert entries >= VERSIONS


@pytest.mark.usefixtures("low_queue_limit")
@pytest.mark.parametrize("kind", [PARTITION, KEY])
@pytest.mark.parametrize(
    "how", ["enqueue", "enqueue_idempotent", "enqueue_many", "enqueue_coalesced", "sql"]
)
def test_an_enqueue_reads_the_newest_version_only(store, open_connection, churned, kind, how):
    _prepare(store, churned, kind)
    conn = open_connection()
    producer = QueueStore(PsycopgRunner(conn, "default"))
    spec = _spec(kind, queue="low")
    actions: dict[str, Callable[[], object]] = {
        "enqueue": lambda: producer.enqueue(spec),
        "enqueue_idempotent": lambda: producer.enqueue(
            _spec(kind, queue="low", idempotency_key="once")
        ),
        "enqueue_many": lambda: producer.enqueue_many([spec, spec]),
        "enqueue_coalesced": lambda: producer.enqueue(
            _spec(kind, queue="low", coalesce_key="same")
        ),
        # The SQL function: a partition key, or the queue's key from the settings.
        "sql": lambda: conn.execute(
            "SELECT django_pgqueue_enqueue('tests.tasks.noop', queue => 'low', "
            "partition_key => %s)",
            [NAME[kind] if kind == PARTITION else None],
        ).fetchone(),
    }
    entries = _read_by(conn, kind, actions[how])
    assert entries <= NEWEST_FIRST


@pytest.mark.usefixtures("low_queue_limit")
@pytest.mark.parametrize("kind", [PARTITION, KEY])
@pytest.mark.parametrize("function", ["fold", "refresh"])
def test_folds_and_refreshes_lock_the_newest_version_only(
    store, open_connection, churned, kind, function
):
    _prepare(store, churned, kind)
    conn = open_connection()
    name = {PARTITION: "partitions", KEY: "concurrency"}[kind]
    extra = "" if kind == PARTITION else ", %(channel)s"
    call = f"SELECT django_pgqueue_{function}_{name}(%(keys)s::text[]{extra})"
    params = {"keys": [NAME[kind]], "channel": flow_channel()}
    entries = _read_by(conn, kind, lambda: conn.execute(call, params).fetchone())
    assert entries <= NEWEST_FIRST


def test_the_repair_sweep_reads_each_partition_row_newest_first(store, open_connection, churned):
    """partitions_out_of_date joins each partition with pending jobs to its row: by its
    newest version, and still judging by the version it sees."""
    _prepare(store, churned, PARTITION)
    conn = open_connection()
    sweeper = QueueStore(PsycopgRunner(conn, "default"))
    entries = _read_by(conn, PARTITION, sweeper.partitions_out_of_date)
    assert entries <= NEWEST_FIRST
    assert sweeper.partitions_out_of_date() == ([], None)
    # A row naming another next job than the job table's is found, among its versions.
    conn.execute(
        "UPDATE django_pgqueue_partition SET head_id = head_id + 1000 WHERE partition_key = %s",
        [NAME[PARTITION]],
    )
    assert sweeper.partitions_out_of_date() == ([NAME[PARTITION]], None)


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_an_enqueue_judges_by_the_committed_version_not_a_newer_uncommitted_one(
    store, open_connection, churned, kind
):
    """Read backward, the first version met may be one another transaction has not
    committed: the probe skips it and judges by the one it sees."""
    _prepare(store, churned, kind)
    other = open_connection()
    other.execute("BEGIN")
    # Uncommitted: the row no longer names a next job, so a new job would be urgent.
    other.execute(
        f"UPDATE {TABLE[kind]} SET head_id = NULL WHERE {COLUMN[kind]} = %s", [NAME[kind]]
    )
    conn = open_connection()
    producer = QueueStore(PsycopgRunner(conn, "default"))
    producer.enqueue(_spec(kind, queue="low"))
    signals = f"django_pgqueue_{'partition' if kind == PARTITION else 'concurrency'}_signal"
    urgent = conn.execute(
        f"SELECT urgent FROM {signals} WHERE {COLUMN[kind]} = %s ORDER BY id DESC LIMIT 1",
        [NAME[kind]],
    ).fetchone()
    # The committed row names an older pending job, ready now: the signal is lazy.
    assert urgent == (False,)
    other.execute("ROLLBACK")


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_a_refresh_waiting_on_an_update_locks_and_writes_its_newest_version(
    store, open_connection, churned, kind
):
    """A lock taken through the backward read follows a concurrent update to its newest
    version, as the lookup by key did: the refresh writes that version, and the row
    keeps one visible version with the refreshed state."""
    _prepare(store, churned, kind)
    head = store.enqueue(_spec(kind, queue="low")).job  # behind the first one
    other = open_connection()
    other.execute("BEGIN")
    other.execute(
        f"UPDATE {TABLE[kind]} SET head_id = NULL, refreshed_at = now() WHERE {COLUMN[kind]} = %s",
        [NAME[kind]],
    )
    refresher = open_connection()
    pid = refresher.info.backend_pid
    name = {PARTITION: "partitions", KEY: "concurrency"}[kind]
    extra = "" if kind == PARTITION else ", %(channel)s"
    call = f"SELECT django_pgqueue_refresh_{name}(%(keys)s::text[]{extra})"
    params = {"keys": [NAME[kind]], "channel": flow_channel()}
    done: list[Any] = []
    thread = threading.Thread(
        target=lambda: done.append(refresher.execute(call, params).fetchone()), daemon=True
    )
    thread.start()
    observer = open_connection()
    wait_for(
        lambda: (
            observer.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            == (True,)
        ),
        timeout=30,
    )
    other.execute("COMMIT")
    thread.join(timeout=60)
    assert done == [(1,)]
    rows = observer.execute(
        f"SELECT head_id FROM {TABLE[kind]} WHERE {COLUMN[kind]} = %s", [NAME[kind]]
    ).fetchall()
    # The refresh wrote over the committed update: the oldest pending job is the head.
    first = observer.execute(
        f"SELECT min(id) FROM django_pgqueue_job WHERE {COLUMN[kind]} = %s", [NAME[kind]]
    ).fetchone()[0]
    assert rows == [(first,)]
    assert first < head.pk


@pytest.mark.parametrize("kind", [PARTITION, KEY])
def test_a_claim_whose_lock_took_a_newer_version_still_writes_its_row(store, open_connection, kind):
    """The claim writes a partition's ``running_id`` (a key's ``in_flight``, tokens and
    next job) by the ctid its lock returned. When an update committed after the claim
    began and before its lock, the lock took that newer version, which the claim's
    snapshot does not see: the write by ctid finds nothing, and the row is written by
    key instead (``running_late``, ``counted_late``), from the version locked."""
    name = NAME[kind]
    jobs = [store.enqueue(_spec(kind)).job for _ in range(2)]
    store.fold_signals()
    # The claim, held after its snapshot is taken and before it reads the partition
    # and key rows: it waits on an advisory lock while it computes "wanted".
    marker = "    WHERE NOT EXISTS (\n        SELECT 1 FROM django_pgqueue_queue_pause"
    text = QUERIES["claim_batch"].text
    assert text.count(marker) == 1
    held = text.replace(
        marker,
        "    WHERE EXISTS (SELECT FROM pg_advisory_xact_lock_shared(4242))\n"
        "      AND NOT EXISTS (\n        SELECT 1 FROM django_pgqueue_queue_pause",
    )
    gate = open_connection()
    gate.execute("SELECT pg_advisory_lock(4242)")
    claimer = open_connection(prepare=False)
    pid = claimer.info.backend_pid
    rows: list[Any] = []
    thread = threading.Thread(
        target=lambda: rows.extend(claimer.execute(held, CLAIM).fetchall()),
        daemon=True,
    )
    thread.start()
    observer = open_connection()
    wait_for(
        lambda: (
            observer.execute(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
            == ("advisory",)
        ),
        timeout=30,
    )
    # Committed after the claim's snapshot: the row's newest version is one the claim
    # does not see, and still open, so the claim's lock takes it. A key's says one of
    # its two slots is taken (by a job of another worker, say): the claim must count
    # from that version, and take one job, not two.
    change = "refreshed_at = now()" if kind == PARTITION else "in_flight = 1"
    observer.execute(f"UPDATE {TABLE[kind]} SET {change} WHERE {COLUMN[kind]} = %s", [name])
    gate.execute("SELECT pg_advisory_unlock(4242)")
    thread.join(timeout=60)
    claimed = [row for row in rows if row[0] is not None]
    assert [row[0] for row in claimed] == [jobs[0].pk]
    assert claimed[0][-3] == 1  # flow_started
    if kind == PARTITION:
        state = "SELECT running_id, head_id FROM django_pgqueue_partition"
        expected = (jobs[0].pk, jobs[0].pk)
    else:
        state = "SELECT in_flight, head_id FROM django_pgqueue_concurrency"
        expected = (2, jobs[1].pk)
    row = observer.execute(f"{state} WHERE {COLUMN[kind]} = %s", [name]).fetchall()
    assert row == [expected]


#: Ten thousand partition rows and as many key rows, every one open with a next job:
#: statistics under which a write by ctid that lost its TID scan would read a table.
IDLE_PARTITIONS = """
INSERT INTO django_pgqueue_partition (
    partition_key, queue, partition_bucket, head_id, head_priority, head_available_at,
    refreshed_at
)
SELECT 'part-' || g, 'default', g % 1024, g, 0, now(), now()
FROM generate_series(1, 10000) AS g;
INSERT INTO django_pgqueue_concurrency (
    concurrency_key, queue, max_in_flight, in_flight, head_id, head_priority,
    head_available_at, refreshed_at
)
SELECT 'key-' || g, 'default', 2, 0, g, 0, now(), now()
FROM generate_series(1, 10000) AS g
"""


def _cte_scans(plan: dict[str, Any], cte: str, table: str) -> list[str]:
    """The scans of ``table`` under the plan's CTE ``cte``."""

    def walk(node: dict[str, Any], inside: bool) -> Iterator[str]:
        inside = inside or node.get("Subplan Name") == f"CTE {cte}"
        scan = node["Node Type"] != "ModifyTable"
        if inside and scan and node.get("Relation Name") == table:
            yield node["Node Type"]
        for child in node.get("Plans", []):
            yield from walk(child, inside)

    return list(walk(plan, False))


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_claim_writes_partition_and_key_rows_by_ctid(open_connection, generic):
    conn = open_connection(prepare=False)
    conn.execute(IDLE_PARTITIONS)
    conn.execute("ANALYZE django_pgqueue_partition")
    conn.execute("ANALYZE django_pgqueue_concurrency")
    plan = explain(conn, QUERIES["claim_batch"].text, CLAIM, generic=generic)
    partitions, keys = TABLE[PARTITION], TABLE[KEY]
    assert _cte_scans(plan, "running", partitions) == ["Tid Scan"]
    assert _cte_scans(plan, "counted", keys) == ["Tid Scan"]
    # The rows a lock took newer than the snapshot: by key, one probe each.
    assert _cte_scans(plan, "running_late", partitions) == ["Index Scan"]
    assert _cte_scans(plan, "counted_late", keys) == ["Index Scan"]
