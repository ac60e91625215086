"""Migrations: in sync with the models, and they apply and reverse on a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.core.management import call_command

from django_pgqueue.tools.embedded import with_dbname
from tests.database import REPO, database_url

pytestmark = pytest.mark.timeout(300)


def test_models_and_migrations_are_in_sync(db):
    call_command("makemigrations", "django_pgqueue", "--check", "--dry-run", verbosity=0)


@pytest.fixture
def scratch_database():
    name = f"pgq_migrations_{uuid.uuid4().hex[:8]}"
    admin_url = database_url()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _manage(url: str, *args: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run(
        [sys.executable, "-m", "tests.manage", *args],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )


def _reloptions(conn, table: str) -> list[str]:
    row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table]).fetchone()
    return sorted(row[0] or []) if row else []


def test_migrations_apply_reverse_and_reapply(scratch_database):
    _manage(scratch_database, "migrate", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        options = _reloptions(conn, "django_pgqueue_job")
        assert "fillfactor=75" in options
        assert "autovacuum_vacuum_scale_factor=0.02" in options
        comment = conn.execute("SELECT obj_description('pgq_job_claim'::regclass)").fetchone()[0]
        assert comment.startswith("claim_batch")
        access = conn.execute(
            "SELECT am.amname FROM pg_class c JOIN pg_am am ON am.oid = c.relam "
            "WHERE c.relname = 'pgq_job_created_brin'"
        ).fetchone()[0]
        assert access == "brin"

    _manage(scratch_database, "migrate", "django_pgqueue", "0001", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert _reloptions(conn, "django_pgqueue_job") == []
        assert (
            conn.execute("SELECT obj_description('pgq_job_claim'::regclass)").fetchone()[0] is None
        )

    _manage(scratch_database, "migrate", "django_pgqueue", "zero", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('django_pgqueue_job')").fetchone()[0] is None

    _manage(scratch_database, "migrate", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert "fillfactor=75" in _reloptions(conn, "django_pgqueue_job")


_INDEX = """
SELECT pg_get_indexdef(index.indexrelid), index.indisvalid,
    obj_description(index.indexrelid, 'pg_class')
FROM pg_index AS index
WHERE index.indexrelid = to_regclass(%s)
"""
_SOME_JOBS = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors
)
SELECT 'q' || (g % 3), 'app.tasks.t' || (g % 7), '[]', '{}', 0, 'pending', 0, 1, 0,
    now(), now(), '[]'
FROM generate_series(1, 5000) AS g
"""


def test_0013_swaps_in_smaller_bloom_summaries_under_the_same_name(scratch_database):
    _manage(scratch_database, "migrate", "django_pgqueue", "0012", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        definition, valid, _ = conn.execute(_INDEX, ["pgq_job_filter_brin"]).fetchone()
        assert "n_distinct_per_range" not in definition
        conn.execute(_SOME_JOBS)  # built over rows, as on a live table

    _manage(scratch_database, "migrate", "django_pgqueue", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        definition, valid, comment = conn.execute(_INDEX, ["pgq_job_filter_brin"]).fetchone()
        assert valid
        assert "USING brin (queue text_bloom_ops (n_distinct_per_range='16'), " in definition
        assert "task_path text_bloom_ops (n_distinct_per_range='32'), " in definition
        assert "partition_key text_bloom_ops (n_distinct_per_range='32'), " in definition
        assert "available_at timestamptz_minmax_multi_ops) " in definition
        assert definition.endswith("WITH (pages_per_range='16')")
        assert comment.startswith("admin inbox filters")
        assert conn.execute("SELECT to_regclass('pgq_job_filter_small')").fetchone() == (None,)
        # The new summaries find what the old ones did (every range holds all values).
        conn.execute("SET enable_seqscan = off")
        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) SELECT id FROM django_pgqueue_job "
            "WHERE task_path = 'app.tasks.t3'"
        ).fetchone()[0]
        assert "pgq_job_filter_brin" in str(plan)
        found = conn.execute(
            "SELECT count(*) FROM django_pgqueue_job WHERE task_path = 'app.tasks.t3'"
        ).fetchone()
        assert found == (5000 // 7,)

    _manage(scratch_database, "migrate", "django_pgqueue", "0012", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        definition, valid, comment = conn.execute(_INDEX, ["pgq_job_filter_brin"]).fetchone()
        assert valid
        # Rebuilt as 0003 made it, which the model state alone cannot say.
        assert "n_distinct_per_range" not in definition
        assert definition.endswith("WITH (pages_per_range='16')")
        assert comment.startswith("admin inbox filters")


_PARTITIONED_JOBS = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, partition_key, partition_bucket
)
SELECT 'q', 'app.tasks.t', '[]', '{}', 0, 'pending', 0, 1, 0, now(), now(), '[]',
    'tenant-' || (g % 50), g % 50
FROM generate_series(1, 5000) AS g
"""


def test_0014_drops_the_unused_partitioned_claim_index_and_reversing_rebuilds_it(
    scratch_database,
):
    _manage(scratch_database, "migrate", "django_pgqueue", "0013", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        before = conn.execute(_INDEX, ["pgq_job_claim_part"]).fetchone()
        assert before is not None
        assert before[1]  # valid
        conn.execute(_PARTITIONED_JOBS)  # dropped and rebuilt over rows, as on a live table

    _manage(scratch_database, "migrate", "django_pgqueue", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('pgq_job_claim_part')").fetchone() == (None,)
        # The indexes the partitioned claim does use are all there.
        for name in ("pgq_job_part_pending", "pgq_job_part_processing", "pgq_job_claim"):
            assert conn.execute(_INDEX, [name]).fetchone()[1], name

    _manage(scratch_database, "migrate", "django_pgqueue", "0013", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        after = conn.execute(_INDEX, ["pgq_job_claim_part"]).fetchone()
        assert after == before  # same definition, valid, same comment
        assert after[2].startswith("claim_batch: ready partitioned jobs")


_SCHEDULE = """
INSERT INTO django_pgqueue_schedule (
    name, task_path, queue, priority, max_attempts, args, kwargs, expression, description,
    timezone, downtime, catch_up, timing, next_fire_at
)
VALUES (%s, 'app.tasks.t', 'default', 0, 3, '[]', '{}', '@daily', 'daily', 'UTC', 'latest',
    1, 't', now())
"""


def test_0018_marks_existing_schedules_as_code_and_guards_admin_ones(scratch_database):
    _manage(scratch_database, "migrate", "django_pgqueue", "0017", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        conn.execute(_SCHEDULE, ["declared"])
        # A long transaction holds the table: the migration gives up after its lock
        # timeout instead of queueing every worker's fires behind it.
        conn.execute("BEGIN")
        conn.execute("SELECT * FROM django_pgqueue_schedule FOR UPDATE")
        with pytest.raises(subprocess.CalledProcessError) as failed:
            _manage(scratch_database, "migrate", "django_pgqueue", "0018", "--noinput")
        assert b"lock timeout" in failed.value.stderr
        conn.execute("ROLLBACK")

    _manage(scratch_database, "migrate", "django_pgqueue", "0018", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT name, source FROM django_pgqueue_schedule").fetchall() == [
            ("declared", "code")
        ]
        conn.execute(_SCHEDULE, ["edited"])
        conn.execute("UPDATE django_pgqueue_schedule SET source = 'admin' WHERE name = 'edited'")
        # The previous release's sync: every undeclared name. The admin's row stays.
        deleted = conn.execute(
            "DELETE FROM django_pgqueue_schedule WHERE NOT (name = ANY ('{}'::text[])) "
            "RETURNING name"
        ).fetchall()
        assert deleted == [("declared",)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE django_pgqueue_schedule SET source = 'other'")

    _manage(scratch_database, "migrate", "django_pgqueue", "0017", "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'django_pgqueue_schedule' AND column_name = 'source'"
        ).fetchall()
        assert columns == []
        assert conn.execute(
            "SELECT to_regprocedure('django_pgqueue_keep_admin_schedule()')"
        ).fetchone() == (None,)
        # Without the trigger, the former admin row is an ordinary one.
        assert conn.execute("DELETE FROM django_pgqueue_schedule").rowcount == 1


@pytest.mark.parametrize(
    ("before", "migration", "column"),
    [("0006", "0007", "traceparent"), ("0015", "0016", "snoozes")],
)
def test_a_job_column_migration_gives_up_on_a_held_lock_and_succeeds_when_run_again(
    scratch_database, before, migration, column
):
    _manage(scratch_database, "migrate", "django_pgqueue", before, "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        # A long transaction that read the job table: ADD COLUMN would queue behind it,
        # and every claim and enqueue behind ADD COLUMN.
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM django_pgqueue_job")
        with pytest.raises(subprocess.CalledProcessError) as failed:
            _manage(scratch_database, "migrate", "django_pgqueue", migration, "--noinput")
        assert b"lock timeout" in failed.value.stderr
        conn.execute("ROLLBACK")
        exists = (
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'django_pgqueue_job' AND column_name = %s"
        )
        assert conn.execute(exists, [column]).fetchone() == (0,)  # nothing half done
    _manage(scratch_database, "migrate", "django_pgqueue", migration, "--noinput")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute(exists, [column]).fetchone() == (1,)
