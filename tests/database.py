"""Which PostgreSQL the tests use: ``DATABASE_URL``, or an embedded server under ``.pgdata``.

The embedded server is started on first use, reused across runs (its data folder is
cached and git-ignored), and stopped at exit by the process that started it.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from django_pgqueue.embedded import EmbeddedPostgres, database_settings

REPO = Path(__file__).resolve().parent.parent
EMBEDDED_ROOT = REPO / ".pgdata"

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
    """Return the URL of the server under test (without a test-database prefix)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    return embedded_server().url("postgres")


def django_database(url: str) -> dict[str, Any]:
    """Translate a libpq URL into the test project's ``DATABASES`` entry."""
    return database_settings(url, TEST={"NAME": os.environ.get("PGQUEUE_TEST_DBNAME") or None})
