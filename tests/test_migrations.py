"""Migrations: in sync with the models, and they apply and reverse on a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.core.management import call_command

from django_pgqueue.embedded import with_dbname
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
