"""Which PostgreSQL the shop uses: ``DATABASE_URL``, or an embedded server under ``.pgdata``.

No Django imports here: ``demo.py`` uses this module before any settings exist.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: The data folder the test suite uses too: one embedded server serves both.
EMBEDDED_ROOT = Path(__file__).resolve().parents[2] / ".pgdata"
#: The shop's own database on the embedded server, next to the test databases.
DEMO_DATABASE = "pgqueue_demo"


def embedded_url() -> str:
    """Start the embedded server if it is not running; return the demo database's URL.

    The server is left running: the test suite and ``make demo`` share it, and
    ``python -m django_pgqueue.tools.embedded stop .pgdata`` (or ``make clean``) stops it.
    """
    from django_pgqueue.tools.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(EMBEDDED_ROOT)
    server.start()
    return server.url(DEMO_DATABASE)


def database_url() -> str:
    """Return ``DATABASE_URL``, or the embedded demo database (created if missing)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    url = embedded_url()
    ensure_database(url)
    return url


def ensure_database(url: str) -> bool:
    """Create the database ``url`` names unless it exists; return whether it was created.

    The check and the CREATE run on the server's ``postgres`` maintenance database.
    Two processes racing to create it are fine: the loser sees DuplicateDatabase.
    """
    try:
        with psycopg.connect(url, connect_timeout=10):
            return False
    except psycopg.OperationalError:
        pass  # missing database, or the server is down: find out below
    params = conninfo_to_dict(url)
    name = str(params.get("dbname") or params.get("user") or "postgres")
    maintenance = make_conninfo("", **{**params, "dbname": "postgres"})
    with psycopg.connect(maintenance, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.DuplicateDatabase:
            return False
    return True


def describe(url: str) -> str:
    """Return ``database NAME on HOST`` for ``url``, without its password."""
    params = conninfo_to_dict(url)
    host = params.get("host") or "localhost"
    port = f":{params['port']}" if params.get("port") else ""
    return f"database {params.get('dbname', '?')!s} on {host}{port}"


def django_database(url: str) -> dict[str, Any]:
    """Translate a libpq URL (or ``key=value`` string) into a ``DATABASES`` entry."""
    from django_pgqueue.tools.embedded import database_settings

    return database_settings(url)
