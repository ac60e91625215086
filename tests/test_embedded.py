"""The suite's embedded server: a restart always ends with the server running again."""

from __future__ import annotations

import psycopg
import pytest

from tests.database import embedded_server

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
