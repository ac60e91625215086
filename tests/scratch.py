"""Scratch databases on the test server, for tests that need one without the schema."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from django_pgqueue.tools.embedded import with_dbname
from tests.database import database_url


@contextmanager
def scratch_database(purpose: str) -> Iterator[str]:
    """Create an empty database named after the test run and ``purpose``; yield its URL.

    The name starts with ``PGQUEUE_TEST_DBNAME`` (when set), so parallel runs sharing a
    server never collide. The database is dropped afterwards, connections or not.
    """
    prefix = os.environ.get("PGQUEUE_TEST_DBNAME") or "test_pgqueue"
    name = f"{prefix}_{purpose}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(database_url(), name)
    finally:
        with psycopg.connect(database_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
