"""Databases of a test's own for the job table in segments, and worker-like connections.

A test that converts the job table never does it on the shared test database: a
conversion left half done would change every later test's schema.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from django_pgqueue.store import pgconn
from tests.scratch import scratch_database

REPO = Path(__file__).resolve().parents[1]


def run_manage(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m tests.manage ARGS`` on the database at ``url``, its output captured."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        [sys.executable, "-m", "tests.manage", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def manage(url: str, *args: str) -> None:
    """Run ``python -m tests.manage ARGS`` on the database at ``url``; it must succeed."""
    done = run_manage(url, *args, "-v", "0")
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stderr}"


@contextmanager
def migrated_database(purpose: str) -> Iterator[str]:
    """A scratch database migrated as a user's is; yield its URL (dropped afterwards)."""
    with scratch_database(purpose) as url:
        manage(url, "migrate", "--noinput")
        yield url


def worker_connection(url: str) -> psycopg.Connection[Any]:
    """A connection set up as pgconn.connect sets up a worker's (jsonb as text, UTC,
    prepared statements with generic plans), to the database at ``url``."""
    conn = psycopg.connect(url, autocommit=True, context=pgconn._ADAPTERS)
    conn.execute("SET TIME ZONE 'UTC'; " + pgconn.GENERIC_PLAN_SESSION)
    return conn
