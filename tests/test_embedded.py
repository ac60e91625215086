"""The suite's embedded server: a restart always ends with the server running again."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.db import connections

from django_pgqueue.models import Job, LiveJob
from django_pgqueue.tools.embedded import EmbeddedPostgresError
from tests.database import embedded_server, rebuild_embedded_server

pytestmark = [pytest.mark.server_control, pytest.mark.timeout(120)]


def test_a_restart_whose_shutdown_outlasts_its_timeout_kills_and_starts_the_server():
    server = embedded_server()
    before = server.postmaster_pid()
    # A smart shutdown waits for every client to leave; this one never does.
    with psycopg.connect(server.url(), autocommit=True) as stubborn:
        server.restart("smart", timeout=2)
        assert server.is_running()
        assert server.postmaster_pid() not in (None, before)
        with pytest.raises(psycopg.OperationalError):
            stubborn.execute("SELECT 1")
    with psycopg.connect(server.url(), autocommit=True) as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.skipif(
    bool(os.environ.get("DATABASE_URL")), reason="the test database is on DATABASE_URL's server"
)
def test_a_server_that_cannot_start_again_is_rebuilt_with_a_migrated_test_database(
    transactional_db,
):
    server = embedded_server()
    LiveJob.objects.create(task_path="tests.tasks.noop", queue="default")
    connections.close_all()
    server.stop("fast")
    # A value the server refuses at start-up stands in for a crash recovery that fails.
    with (server.datadir / "postgresql.auto.conf").open("a") as conf:
        conf.write("\nwork_mem = 'not a size'\n")
    with pytest.raises(EmbeddedPostgresError, match="work_mem"):
        server.start()

    rebuild_embedded_server()

    assert server.is_running()
    assert "not a size" not in (server.datadir / "postgresql.auto.conf").read_text()
    assert Job.objects.count() == 0  # a new, empty, migrated test database
    LiveJob.objects.create(task_path="tests.tasks.noop", queue="default")
    assert Job.objects.count() == 1
