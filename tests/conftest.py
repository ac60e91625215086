"""Shared fixtures: real PostgreSQL connections to the test database.

Tests that need committed data visible to other connections (threads, worker
subprocesses) use ``transactional_db`` through the fixtures below; pytest-django empties
the tables after each of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg.conninfo import make_conninfo

from django_pgqueue.embedded import EmbeddedPostgresError, with_dbname
from django_pgqueue.manager import PsycopgRunner, QueueStore
from django_pgqueue.pgconn import connect
from tests.database import embedded_server, ensure_server, rebuild_embedded_server
from tests.workers import WorkerProcess


def pytest_configure(config: pytest.Config) -> None:
    """Start the embedded server (unless DATABASE_URL is set) before any test connects."""
    ensure_server()


@pytest.fixture(autouse=True)
def _server_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that restarts the suite's own server, make sure it runs again.

    Such a test fails on its own when a restart goes wrong; without this, every test
    after it would fail too and hide which one broke the server.
    """
    yield
    restarts_ours = request.node.get_closest_marker("server_control") or (
        request.node.get_closest_marker("soak") and not os.environ.get("DATABASE_URL")
    )
    if restarts_ours:
        server = embedded_server()
        if not server.is_running():
            try:
                server.start()
            except EmbeddedPostgresError as exc:
                rebuild_embedded_server()
                pytest.fail(
                    f"{request.node.nodeid} left the embedded PostgreSQL unable to start; "
                    f"its data folder was rebuilt for the tests that follow:\n{exc}"
                )
            pytest.fail(f"{request.node.nodeid} left the embedded PostgreSQL stopped; restarted it")


@pytest.fixture
def db_url(transactional_db: None) -> str:
    """Return a libpq URL of the test database (data committed by tests is visible)."""
    settings = connection.settings_dict
    params = {
        "host": settings["HOST"] or "",
        "port": str(settings["PORT"] or ""),
        "user": settings["USER"] or "",
        "password": settings["PASSWORD"] or "",
    }
    base = make_conninfo(**{k: v for k, v in params.items() if v})
    return with_dbname(base, settings["NAME"])


@pytest.fixture
def open_connection(transactional_db: None) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Return a factory of dedicated autocommit connections, all closed at teardown."""
    opened: list[psycopg.Connection[Any]] = []

    def factory(**kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect("default", **kwargs)
        opened.append(conn)
        return conn

    yield factory
    for conn in opened:
        conn.close()


@pytest.fixture
def store(open_connection: Callable[..., psycopg.Connection[Any]]) -> QueueStore:
    """Return a QueueStore on its own autocommit connection (like a worker's)."""
    return QueueStore(PsycopgRunner(open_connection(), "default"))


@pytest.fixture
def make_store(
    open_connection: Callable[..., psycopg.Connection[Any]],
) -> Callable[[], QueueStore]:
    """Return a factory of QueueStores, each on its own connection."""
    return lambda: QueueStore(PsycopgRunner(open_connection(), "default"))


@pytest.fixture
def workers(db_url: str) -> Iterator[Callable[..., WorkerProcess]]:
    """Return a factory of worker subprocesses on the test database, stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(db_url, *args, **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
        # Captured by pytest and shown only when the test failed: what each worker logged.
        print(f"--- worker {worker.pid} ({' '.join(worker.args)}) ---\n{worker.output()}")


@pytest.fixture
def observer(open_connection: Callable[..., psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """Return an autocommit connection for the test's own reads and writes."""
    return open_connection(prepare=False)
