"""EnsureIndexConcurrently: builds a missing index, keeps a valid one, rebuilds an INVALID one.

INVALID indexes are made by real failures (see tests/indexes.py), never by editing the
catalog. The migration-level proof, with builds of 0003 cancelled mid-way on a large
table, is in tests/test_migration_interrupted.py.
"""

from __future__ import annotations

from io import StringIO

import psycopg
import pytest
from django.contrib.postgres.operations import AddIndexConcurrently
from django.core.management import call_command
from django.db import IntegrityError, connection, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import RenameIndex, RunSQL, SeparateDatabaseAndState
from django.db.migrations.writer import OperationWriter
from django.test.utils import CaptureQueriesContext

from django_pgqueue.exceptions import InvalidIndexStatement
from django_pgqueue.store.schema import EnsureIndexConcurrently, RemoveIndexConcurrentlyExactly
from tests.indexes import (
    APP,
    index_oid,
    run_operation,
    seed_finished_jobs,
    validity,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db(transaction=True)]

QUEUE_ID = models.Index(fields=["queue", "id"], name="pgq_test_queue_id")
UNIQUE = models.Index(models.Value(1), name="pgq_test_unique")
UNIQUE_SQL = 'CREATE UNIQUE INDEX CONCURRENTLY "pgq_test_unique" ON "django_pgqueue_job" ((1))'


@pytest.fixture
def conn(observer):
    """The observer connection; drops the test's indexes at teardown, whatever happened."""
    yield observer
    for name in (QUEUE_ID.name, UNIQUE.name):
        observer.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')


def _comment(conn: psycopg.Connection, name: str) -> str | None:
    return conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", [name]).fetchone()[0]


def test_a_missing_index_is_built_valid_with_its_comment(conn):
    run_operation(EnsureIndexConcurrently("livejob", QUEUE_ID, comment="tests: queue, then id"))
    assert validity(conn, QUEUE_ID.name) is True
    assert _comment(conn, QUEUE_ID.name) == "tests: queue, then id"


def test_a_valid_index_is_left_alone(conn):
    operation = EnsureIndexConcurrently("livejob", QUEUE_ID, comment="tests: it's kept")
    run_operation(operation)
    before = index_oid(conn, QUEUE_ID.name)
    with CaptureQueriesContext(connection) as queries:
        run_operation(operation)
    statements = [query["sql"].lstrip().upper() for query in queries]
    assert not [sql for sql in statements if sql.startswith(("CREATE", "DROP"))]
    assert index_oid(conn, QUEUE_ID.name) == before
    assert _comment(conn, QUEUE_ID.name) == "tests: it's kept"


def test_an_invalid_index_is_dropped_and_built_again(conn):
    seed_finished_jobs(conn, 2)
    operation = EnsureIndexConcurrently("livejob", UNIQUE, sql=UNIQUE_SQL, comment="unique")
    with pytest.raises(IntegrityError):
        run_operation(operation)  # a duplicate key: the build fails, its index stays
    assert validity(conn, UNIQUE.name) is False
    left_behind = index_oid(conn, UNIQUE.name)

    duplicate = conn.execute("SELECT min(id) FROM django_pgqueue_job").fetchone()[0]
    conn.execute("DELETE FROM django_pgqueue_job WHERE id = %s", [duplicate])
    run_operation(operation)
    assert validity(conn, UNIQUE.name) is True
    assert index_oid(conn, UNIQUE.name) != left_behind
    assert _comment(conn, UNIQUE.name) == "unique"


def test_reversing_drops_the_index(conn):
    operation = EnsureIndexConcurrently("livejob", QUEUE_ID)
    run_operation(operation)
    run_operation(operation, backwards=True)
    assert validity(conn, QUEUE_ID.name) is None
    run_operation(operation, backwards=True)  # already gone: nothing to do, no error


def test_it_refuses_to_run_inside_a_transaction(conn):
    from django.db import NotSupportedError, transaction

    with transaction.atomic(), pytest.raises(NotSupportedError, match="atomic = False"):
        run_operation(EnsureIndexConcurrently("livejob", QUEUE_ID))
    assert validity(conn, QUEUE_ID.name) is None


@pytest.mark.parametrize(
    "sql",
    [
        'CREATE INDEX CONCURRENTLY "pgq_test_queue_id" ON "django_pgqueue_job" ("queue", "id")',
        "create index concurrently if not exists pgq_test_queue_id on django_pgqueue_job (queue)",
        'CREATE UNIQUE INDEX CONCURRENTLY "pgq_test_queue_id" ON "django_pgqueue_job" ("id")',
    ],
)
def test_statements_that_build_the_named_index_concurrently_are_accepted(sql):
    assert EnsureIndexConcurrently("livejob", QUEUE_ID, sql=sql).sql == sql


@pytest.mark.parametrize(
    "sql",
    [
        'CREATE INDEX "pgq_test_queue_id" ON "django_pgqueue_job" ("queue", "id")',
        'CREATE INDEX CONCURRENTLY "pgq_test_other" ON "django_pgqueue_job" ("queue")',
        'CREATE INDEX CONCURRENTLY "pgq_test_queue_id_2" ON "django_pgqueue_job" ("queue")',
        'DROP INDEX CONCURRENTLY "pgq_test_queue_id"',
        "",
    ],
)
def test_a_statement_that_does_not_build_the_named_index_concurrently_is_refused(sql):
    with pytest.raises(InvalidIndexStatement, match="pgq_test_queue_id") as raised:
        EnsureIndexConcurrently("livejob", QUEUE_ID, sql=sql)
    assert isinstance(raised.value, ValueError)


def test_it_serializes_with_its_statement_and_comment():
    operation = EnsureIndexConcurrently("livejob", UNIQUE, sql=UNIQUE_SQL, comment="unique")
    name, args, kwargs = operation.deconstruct()
    assert (name, args) == ("EnsureIndexConcurrently", [])
    assert EnsureIndexConcurrently(**kwargs).deconstruct() == (name, args, kwargs)
    text, imports = OperationWriter(operation).serialize()
    assert "import django_pgqueue.store.schema" in imports
    assert "django_pgqueue.store.schema.EnsureIndexConcurrently(" in text
    assert "sql=" in text
    assert "comment='unique'" in text


def test_a_rename_is_not_folded_into_it():
    operation = EnsureIndexConcurrently("livejob", UNIQUE, sql=UNIQUE_SQL)
    rename = RenameIndex("livejob", new_name="pgq_test_renamed", old_name=UNIQUE.name)
    assert operation.reduce(rename, APP) is False
    assert operation.index.name == UNIQUE.name


def test_sqlmigrate_prints_the_builds_of_0003(conn):
    out = StringIO()
    call_command("sqlmigrate", APP, "0003", stdout=out)
    sql = out.getvalue()
    for name in ("pgq_job_revivable", "pgq_job_dead_queue", "pgq_job_filter_brin"):
        assert f'CREATE INDEX CONCURRENTLY "{name}" ON "django_pgqueue_job"' in sql
        assert f'COMMENT ON INDEX "{name}" IS ' in sql


def test_every_concurrent_build_of_our_migrations_goes_through_the_helper():
    """Future migrations follow the pattern: no raw CREATE INDEX CONCURRENTLY, no copies."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    helped = []
    for (app_label, name), migration in sorted(loader.disk_migrations.items()):
        if app_label != APP:
            continue
        for operation in _flatten(migration.operations):
            if isinstance(operation, EnsureIndexConcurrently):
                helped.append(operation.index.name)
                assert not migration.atomic, f"{name} builds concurrently: atomic = False"
                continue
            assert not isinstance(operation, AddIndexConcurrently), name
            if isinstance(operation, RunSQL):
                text = " ".join(str(part) for part in _sql_parts(operation.sql)).upper()
                assert "CONCURRENTLY" not in text, f"{name}: use EnsureIndexConcurrently"
    assert {"pgq_job_revivable", "pgq_job_dead_queue", "pgq_job_filter_brin"} <= set(helped)


def _flatten(operations):
    for operation in operations:
        if isinstance(operation, SeparateDatabaseAndState):
            yield from _flatten(operation.database_operations)
        else:
            yield operation


def _sql_parts(sql):
    return sql if isinstance(sql, list | tuple) else [sql]


REBUILD_SQL = (
    'CREATE INDEX CONCURRENTLY "pgq_test_queue_id" ON "django_pgqueue_job" ("queue", "id")'
)


def test_a_restorable_drop_refuses_a_rebuild_of_another_index():
    with pytest.raises(InvalidIndexStatement, match="pgq_test_queue_id"):
        RemoveIndexConcurrentlyExactly(
            "job", "pgq_test_queue_id", sql=REBUILD_SQL.replace("queue_id", "other")
        )


def test_a_restorable_drop_serializes_with_its_rebuild_and_comment():
    operation = RemoveIndexConcurrentlyExactly(
        "job", "pgq_test_queue_id", sql=REBUILD_SQL, comment="by queue"
    )
    name, args, kwargs = operation.deconstruct()
    assert name == "RemoveIndexConcurrentlyExactly"
    assert RemoveIndexConcurrentlyExactly(*args, **kwargs).deconstruct() == (name, args, kwargs)
    text, imports = OperationWriter(operation).serialize()
    assert "import django_pgqueue.store.schema" in imports
    assert "django_pgqueue.store.schema.RemoveIndexConcurrentlyExactly(" in text
    assert "comment='by queue'" in text
