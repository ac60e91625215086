"""Which PostgreSQL the tests use: ``DATABASE_URL``, or an embedded server under ``.pgdata``.

The embedded server is started by the processes that use it (pytest, ``tests.manage``),
reused across runs (its data folder is cached and git-ignored), and stopped at exit by
the process that started it. Importing the settings never starts it: tools that load them
(mypy's Django plugin) exit without running ``atexit`` and would leave a server behind,
which later shuts itself down when a fresh checkout reuses the path, taking the new
server's socket with it.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from django_pgqueue.tools.embedded import EmbeddedPostgres, database_settings

REPO = Path(__file__).resolve().parent.parent
#: ``PGQUEUE_TEST_PGDATA`` (relative to the checkout) gives a run a server of its own:
#: CI runs its legs side by side, each with its own embedded server (for a run on
#: ``DATABASE_URL``, the one its server_control tests stop and restart), so that tests
#: which restart a server, or look at or terminate connections server-wide, never touch
#: another leg's.
EMBEDDED_ROOT = REPO / (os.environ.get("PGQUEUE_TEST_PGDATA") or ".pgdata")

_embedded: EmbeddedPostgres | None = None


def embedded_server() -> EmbeddedPostgres:
    """Return the suite's own embedded server, started (and stopped at exit) if needed."""
    global _embedded  # noqa: PLW0603
    if _embedded is None:
        server = EmbeddedPostgres(EMBEDDED_ROOT)
        if server.start():
            atexit.register(server.stop)
        _embedded = server
    return _embedded


def database_url() -> str:
    """Return the URL of the server under test (without a test-database prefix).

    Without ``DATABASE_URL`` it is the embedded server's, whether or not that runs yet.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    return EmbeddedPostgres(EMBEDDED_ROOT).url("postgres")


def ensure_server() -> None:
    """Start the embedded server unless ``DATABASE_URL`` names another."""
    if not os.environ.get("DATABASE_URL"):
        embedded_server()


def django_database(url: str) -> dict[str, Any]:
    """Translate a libpq URL into the test project's ``DATABASES`` entry."""
    return database_settings(url, TEST={"NAME": os.environ.get("PGQUEUE_TEST_DBNAME") or None})


def rebuild_embedded_server() -> None:
    """Replace the embedded server's data folder with a new one holding the test database.

    For a server that will not start again after a test crashed it (its crash recovery
    failed): the test that did it fails with the server's log, and the tests after it get
    a working server instead of failing one by one without a database.
    """
    import shutil
    import time

    import psycopg
    from django.core.management import call_command
    from django.db import connections
    from psycopg import sql

    server = embedded_server()
    server.kill()
    deadline = time.monotonic() + 30
    while server.postmaster_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    connections.close_all()
    shutil.rmtree(server.datadir)
    server.start()
    name = connections["default"].settings_dict["NAME"]
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    call_command("migrate", database="default", interactive=False, verbosity=0)
