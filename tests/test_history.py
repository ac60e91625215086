"""The history tier's upkeep: retention classes, partitions made ahead, pruning by partition.

Real DDL on the test database: every test that adds or drops partitions puts the
standard set back at teardown (``django_pgqueue_ensure_history`` makes what is missing).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.core import checks
from django.test import override_settings

from django_pgqueue.store.retention import RetentionClass, default_classes
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.worker.connection import ConnectionSlot
from django_pgqueue.worker.history import LOCK_WAIT_SECONDS, maintain_history
from django_pgqueue.worker.housekeeping import run_pass

pytestmark = pytest.mark.timeout(120)

JOB_ONLY = {"history_class"}


def _columns(conn: psycopg.Connection, relation: str) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        [relation],
    ).fetchall()


def _partitions(conn: psycopg.Connection, class_id: int) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT child.relname FROM pg_inherits JOIN pg_class AS child "
            "ON child.oid = inhrelid WHERE inhparent = to_regclass(%s) ORDER BY 1",
            [f"django_pgqueue_job_history_c{class_id}"],
        )
    ]


def _attach_past_partition(conn: psycopg.Connection, class_id: int, day: datetime) -> str:
    parent = f"django_pgqueue_job_history_c{class_id}"
    name = f"{parent}_{day:%Y%m%d}00"
    conn.execute(f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS)")
    end = day + timedelta(days=1)
    conn.execute(
        f"ALTER TABLE {parent} ATTACH PARTITION {name} "
        f"FOR VALUES FROM ('{day.isoformat()}') TO ('{end.isoformat()}')"
    )
    return name


def _fill(conn: psycopg.Connection, class_id: int, finished_at: datetime, count: int) -> None:
    status = {1: "succeeded", 2: "cancelled", 3: "dead_letter"}.get(class_id, "succeeded")
    conn.execute(
        "INSERT INTO django_pgqueue_job_history (id, queue, task_path, args, kwargs, priority, "
        "status, attempts, max_attempts, lease_generation, errors, finished_at, history_class) "
        "SELECT -g, 'default', 'tests.tasks.noop', '[]', '{}', 0, %s, 1, 5, 1, '[]', %s, %s "
        "FROM generate_series(1, %s) AS g",
        [status, finished_at, class_id, count],
    )


@pytest.fixture
def history(open_connection) -> Iterator[psycopg.Connection]:
    """An autocommit connection; the standard classes and partitions are restored after."""
    conn = open_connection()
    yield conn
    for (parent,) in conn.execute(
        "SELECT relid::regclass::text FROM pg_partition_tree('django_pgqueue_job_history') "
        "WHERE level = 2"
    ).fetchall():
        conn.execute(f"DROP TABLE {parent}")
    conn.execute("DELETE FROM django_pgqueue_history_class WHERE id > 3")
    conn.execute("UPDATE django_pgqueue_history_class SET keep_seconds = NULL, retired = false")
    conn.execute("SELECT * FROM django_pgqueue_ensure_history('day', 2)")


def test_the_history_has_the_job_tables_columns_and_the_view_joins_both(history):
    job = _columns(history, "django_pgqueue_job")
    assert [c for c in _columns(history, "django_pgqueue_job_history") if c[0] not in JOB_ONLY] == (
        job
    )
    assert _columns(history, "django_pgqueue_job_all") == job
    for class_id in (1, 2, 3):
        assert _columns(history, f"django_pgqueue_job_history_c{class_id}_default")[:-1] == job


#: Every statement that copies a whole job from one tier to the other, and where.
WHOLE_ROW_COPIES = {
    ("django_pgqueue_job_history", "sql:complete_many_if_leased"),
    ("django_pgqueue_job_history", "sql:move_finished"),
    ("django_pgqueue_job", "sql:bring_back"),
    ("django_pgqueue_job_history", "function:django_pgqueue_move_to_history"),
}
_INSERT = re.compile(r"INSERT INTO (django_pgqueue_job(?:_history)?) \(([^)]*)\)")


def test_every_whole_row_copy_between_the_tiers_names_every_column(history):
    # A column added to the job table must be carried by each copy, or a move loses it.
    found = set()
    # (The bench tools write rows of their own making, with the columns they set.)
    texts = {f"sql:{name}": query.text for name, query in QUERIES.items()}
    for name, source in history.execute(
        "SELECT proname, prosrc FROM pg_proc WHERE prosrc LIKE '%%INSERT INTO django_pgqueue_job%%'"
    ).fetchall():
        texts[f"function:{name}"] = source
    for where, text in texts.items():
        for table, listed in _INSERT.findall(text):
            names = [name.strip() for name in listed.split(",")]
            if len(names) < 10 or "id" not in names:
                continue  # a key, a test row, or a new job (its id from the sequence)
            found.add((table, where))
            expected = {name for name, _ in _columns(history, table)}
            assert set(names) == expected, (
                f"{where} copies into {table} without {sorted(expected - set(names))}"
            )
            assert len(names) == len(set(names)), f"{where} names a column twice"
    assert found == WHOLE_ROW_COPIES


def test_the_migration_made_three_classes_and_the_current_partitions(history):
    assert history.execute(
        "SELECT id, status, queue FROM django_pgqueue_history_class ORDER BY id"
    ).fetchall() == [(1, "succeeded", None), (2, "cancelled", None), (3, "dead_letter", None)]
    today = datetime.now(UTC).date()
    for class_id in (1, 2, 3):
        names = _partitions(history, class_id)
        assert f"django_pgqueue_job_history_c{class_id}_default" in names
        assert f"django_pgqueue_job_history_c{class_id}_{today:%Y%m%d}00" in names
        assert len(names) >= 4  # today, the next two days, the DEFAULT partition


def test_a_row_is_routed_by_class_and_finish_time(history):
    now = datetime.now(UTC)
    _fill(history, 3, now, 1)
    _fill(history, 1, now - timedelta(days=400), 1)  # no partition: the DEFAULT one
    assert history.execute(
        "SELECT tableoid::regclass::text FROM django_pgqueue_job_history ORDER BY history_class"
    ).fetchall() == [
        ("django_pgqueue_job_history_c1_default",),
        (f"django_pgqueue_job_history_c3_{now:%Y%m%d}00",),
    ]


def test_housekeeping_writes_the_classes_from_the_settings_and_makes_partitions(history, store):
    with override_settings(
        PGQUEUE_RETENTION_SECONDS=3600, PGQUEUE_DEAD_LETTER_RETENTION_SECONDS=None
    ):
        upkeep = maintain_history(store)
        again = maintain_history(store)
    assert upkeep.classes_written == 2  # succeeded and cancelled changed, dead letters not
    assert (again.classes_written, again.partitions_made) == (0, 0)
    assert history.execute(
        "SELECT status, keep_seconds FROM django_pgqueue_history_class ORDER BY id"
    ).fetchall() == [("succeeded", 3600.0), ("cancelled", 3600.0), ("dead_letter", None)]
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    history.execute(f"DROP TABLE django_pgqueue_job_history_c2_{tomorrow:%Y%m%d}00")
    with override_settings(PGQUEUE_HISTORY_PREMAKE=4):
        assert maintain_history(store).partitions_made == 3 * 2 + 1


def test_a_queue_class_gets_its_own_partitions_and_is_retired_when_dropped(history, store):
    classes = [
        *default_classes(finished_seconds=86400, dead_letter_seconds=None),
        RetentionClass("succeeded", "emails", 0),
    ]
    assert store.sync_history_classes(classes) == (3, 0)
    (class_id,) = history.execute(
        "SELECT id FROM django_pgqueue_history_class WHERE queue = 'emails'"
    ).fetchone()
    assert class_id > 3
    made, skipped = store.ensure_history_partitions(period="day", ahead=2)
    assert (made, skipped) == (3, 0)
    assert len(_partitions(history, class_id)) == 4
    assert store.sync_history_classes(classes[:3]) == (0, 1)
    assert history.execute(
        "SELECT retired, keep_seconds FROM django_pgqueue_history_class WHERE id = %s",
        [class_id],
    ).fetchone() == (True, 86400.0)


def _named_already(conn: psycopg.Connection, starts: list[datetime]) -> int:
    """Count the (class, period) partitions whose name is taken before they are made.

    A partition is named after its class and the UTC hour it starts at, whatever its
    length: an hour starting at midnight, or a week starting today, has the name of the
    daily partition already there, which covers it. Such a period is neither made nor
    reported skipped.
    """
    names = {name for class_id in (1, 2, 3) for name in _partitions(conn, class_id)}
    return sum(
        f"django_pgqueue_job_history_c{class_id}_{start:%Y%m%d%H}" in names
        for class_id in (1, 2, 3)
        for start in starts
    )


def test_another_period_length_starts_where_the_old_partitions_end(history, store):
    # Every hour of the next three falls in today's (or tomorrow's) daily partition, as
    # does this week's start: none is made, and each is reported skipped (but those named
    # like a daily partition, which are already there: see _named_already).
    (hour,) = history.execute("SELECT date_trunc('hour', now() AT TIME ZONE 'UTC')").fetchone()
    hours = [(hour + timedelta(hours=n)).replace(tzinfo=UTC) for n in range(4)]
    named = _named_already(history, hours)
    assert store.ensure_history_partitions(period="hour", ahead=3) == (0, 3 * 4 - named)
    (week,) = history.execute("SELECT date_trunc('week', now() AT TIME ZONE 'UTC')").fetchone()
    named = _named_already(history, [week.replace(tzinfo=UTC)])
    assert store.ensure_history_partitions(period="week", ahead=0) == (0, 3 - named)


def test_pruning_drops_whole_partitions_past_their_class_retention(history, store):
    old_day = datetime(2026, 1, 5, tzinfo=UTC)
    succeeded = _attach_past_partition(history, 1, old_day)
    dead = _attach_past_partition(history, 3, old_day)
    _fill(history, 1, old_day + timedelta(hours=1), 50)
    _fill(history, 3, old_day + timedelta(hours=1), 5)
    _fill(history, 1, datetime.now(UTC), 7)
    history.execute("ANALYZE django_pgqueue_job_history")
    history.execute("UPDATE django_pgqueue_history_class SET keep_seconds = 86400 WHERE id = 1")
    result = store.prune_history(max_drops=10, default_limit=100)
    assert (result.dropped, result.rows_estimate, result.deferred) == (1, 50, 0)
    names = _partitions(history, 1) + _partitions(history, 3)
    assert succeeded not in names
    assert dead in names  # dead letters are kept (keep_seconds NULL)
    assert history.execute(
        "SELECT history_class, count(*) FROM django_pgqueue_job_history GROUP BY 1 ORDER BY 1"
    ).fetchall() == [(1, 7), (3, 5)]


def test_pruning_writes_wal_independent_of_the_row_count(history, store):
    """Dropping a partition writes catalog changes only: the same few hundred kilobytes
    at most for 100 rows or 200,000 (the WAL position is the cluster's, so other
    sessions' writes count too: the bound is loose), where deleting rows writes WAL for
    each of them (shown here on 20,000)."""
    old_day = datetime(2026, 1, 5, tzinfo=UTC)
    history.execute("UPDATE django_pgqueue_history_class SET keep_seconds = 86400 WHERE id = 1")

    def wal_of(action) -> int:
        before = history.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        action()
        after = history.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        return int(history.execute("SELECT pg_wal_lsn_diff(%s, %s)", [after, before]).fetchone()[0])

    dropped = []
    for count in (100, 200_000):
        _attach_past_partition(history, 1, old_day)
        _fill(history, 1, old_day + timedelta(hours=2), count)
        history.execute("CHECKPOINT")  # no full-page images from earlier writes
        dropped.append(wal_of(lambda: store.prune_history(max_drops=10, default_limit=100)))
    _attach_past_partition(history, 1, old_day)
    _fill(history, 1, old_day + timedelta(hours=2), 20_000)
    history.execute("CHECKPOINT")
    deleted = wal_of(lambda: history.execute("DELETE FROM django_pgqueue_job_history WHERE id < 0"))
    assert max(dropped) < 1024 * 1024 < deleted, (dropped, deleted)


def test_expired_rows_of_a_default_partition_are_deleted_in_batches(history, store):
    history.execute("UPDATE django_pgqueue_history_class SET keep_seconds = 86400 WHERE id = 2")
    _fill(history, 2, datetime(2025, 1, 1, tzinfo=UTC), 30)
    first = store.prune_history(max_drops=10, default_limit=20)
    second = store.prune_history(max_drops=10, default_limit=20)
    assert (first.deleted, second.deleted) == (20, 10)
    assert history.execute("SELECT count(*) FROM django_pgqueue_job_history").fetchone() == (0,)


def test_a_partition_in_use_is_left_for_the_next_pass_and_writers_go_on(
    history, open_connection, store
):
    old_day = datetime(2026, 1, 5, tzinfo=UTC)
    name = _attach_past_partition(history, 1, old_day)
    history.execute("UPDATE django_pgqueue_history_class SET keep_seconds = 86400 WHERE id = 1")
    reader = open_connection()
    reader.autocommit = False
    reader.execute(f"SELECT count(*) FROM {name}")  # holds ACCESS SHARE until it ends
    writer = open_connection()
    wrote = threading.Event()

    def write_meanwhile() -> None:
        _fill(writer, 1, datetime.now(UTC), 1)
        wrote.set()

    with store.runner.atomic():
        store.limit_lock_wait(timeout_seconds=LOCK_WAIT_SECONDS)
        thread = threading.Thread(target=write_meanwhile)
        thread.start()
        result = store.prune_history(max_drops=10, default_limit=10)
    thread.join(timeout=30)
    assert wrote.is_set()
    assert (result.dropped, result.deferred) == (0, 1)
    assert name in _partitions(history, 1)
    reader.rollback()
    with store.runner.atomic():
        assert store.prune_history(max_drops=10, default_limit=10).dropped == 1


def test_a_housekeeping_pass_keeps_partitions_ahead_and_prunes(history, db_url):
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    history.execute(f"DROP TABLE django_pgqueue_job_history_c1_{tomorrow:%Y%m%d}00")
    old = _attach_past_partition(history, 2, datetime(2026, 1, 5, tzinfo=UTC))
    slot = ConnectionSlot("default", "test history")
    try:
        with override_settings(PGQUEUE_RETENTION_SECONDS=86400):
            report = run_pass(slot, worker_timeout=30)
    finally:
        slot.close()
    assert (report.history_partitions_made, report.history_partitions_dropped) == (1, 1)
    assert old not in _partitions(history, 2)


@pytest.mark.parametrize(
    ("setting", "value", "check_id"),
    [
        ("PGQUEUE_HISTORY_PERIOD", "month", "django_pgqueue.E131"),
        ("PGQUEUE_HISTORY_PREMAKE", 0, "django_pgqueue.E132"),
        ("PGQUEUE_HISTORY_PREMAKE", "2", "django_pgqueue.E132"),
    ],
)
def test_bad_history_settings_are_reported_by_the_system_check(setting, value, check_id):
    with override_settings(**{setting: value}):
        found = [m for m in checks.run_checks() if m.id == check_id]
    assert len(found) == 1
    assert setting in found[0].msg


def test_retention_per_status_and_queue_routes_jobs_to_their_own_partitions(history, store):
    from django_pgqueue.store.values import JobSpec

    retention = {
        "succeeded": timedelta(days=1),
        "dead_letter": 30 * 86400,
        "queues": {"emails": {"succeeded": 0}},
    }
    with override_settings(PGQUEUE_RETENTION=retention, PGQUEUE_RETENTION_SECONDS=3600):
        maintain_history(store)
    rows = history.execute(
        "SELECT status, queue, keep_seconds FROM django_pgqueue_history_class "
        "WHERE NOT retired ORDER BY id"
    ).fetchall()
    assert rows == [
        ("succeeded", None, 86400.0),
        ("cancelled", None, 3600.0),
        ("dead_letter", None, 30 * 86400.0),
        ("succeeded", "emails", 0.0),
    ]
    email = store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id
    other = store.enqueue(JobSpec("tests.tasks.noop", queue="default")).id
    for queue in ("emails", "default"):
        (claimed,) = store.claim("w", [queue], per_queue=1, lease_seconds=30)
        store.complete_if_leased(claimed.lease, "null")
    classes = dict(
        history.execute(
            "SELECT h.id, c.queue FROM django_pgqueue_job_history AS h "
            "JOIN django_pgqueue_history_class AS c ON c.id = h.history_class"
        ).fetchall()
    )
    assert classes == {email: "emails", other: None}
    # Kept for 0 seconds: its partition goes as soon as its period has ended.
    (class_id,) = history.execute(
        "SELECT id FROM django_pgqueue_history_class WHERE queue = 'emails'"
    ).fetchone()
    old = _attach_past_partition(history, class_id, datetime.now(UTC) - timedelta(days=2))
    assert store.prune_history(max_drops=10, default_limit=10).dropped == 1
    assert old not in _partitions(history, class_id)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "must be a dict"),
        ({"finished": 1}, "'finished' is not a final status"),
        ({"succeeded": -1}, "must be >= 0"),
        ({"succeeded": "1d"}, "must be a number of seconds"),
        ({"queues": {"": {"succeeded": 1}}}, "is not a queue name"),
        ({"queues": {"emails": {}}}, "non-empty dict"),
        ({"queues": {"emails": {"pending": 1}}}, "'pending' is not a final status"),
    ],
)
def test_a_bad_retention_setting_is_reported_by_the_system_check(value, message):
    with override_settings(PGQUEUE_RETENTION=value):
        found = [m for m in checks.run_checks() if m.id == "django_pgqueue.E133"]
    assert len(found) == 1
    assert message in found[0].msg
