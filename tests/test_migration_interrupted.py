"""An upgrade interrupted mid-build: 0003's concurrent index builds cancelled, then repaired.

For each index 0003 builds, on a job table large enough that the build takes a while:
migrate back to 0002, migrate forward while a second connection cancels that build with
``pg_cancel_backend`` as soon as it shows in ``pg_stat_progress_create_index`` (as a
``statement_timeout`` or a lost deploy connection would). The migration fails, leaving
the index INVALID; check W002 names it and says to run ``migrate``; running ``migrate``
again ends with every index valid, the check silent and the lag page clear.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.core.management import call_command
from django.db import OperationalError

from django_pgqueue import checks as pgqueue_checks
from tests.admin_fixtures import login, url
from tests.indexes import APP, seed_finished_jobs, validity

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]

#: 0003's indexes, in the order it builds them.
BUILDS = ["pgq_job_revivable", "pgq_job_dead_queue", "pgq_job_filter_brin"]
#: About 160 MB of heap: each build scans it for a tenth of a second or more, long enough
#: for a watcher polling every millisecond to cancel it mid-way.
ROWS = 400_000

_PROGRESS = """
SELECT progress.pid, progress.phase
FROM pg_stat_progress_create_index AS progress
JOIN pg_class ON pg_class.oid = progress.index_relid
WHERE pg_class.relname = %s
"""


class Canceller(threading.Thread):
    """Cancel the build of one index the moment it shows in the progress view."""

    def __init__(self, conn, index_name: str, timeout: float = 120) -> None:
        super().__init__(daemon=True)
        self.conn = conn
        self.index_name = index_name
        self.timeout = timeout
        self.watching = threading.Event()
        self.phase: str | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        self.watching.set()
        while time.monotonic() < deadline:
            row = self.conn.execute(_PROGRESS, [self.index_name]).fetchone()
            if row:
                self.conn.execute("SELECT pg_cancel_backend(%s)", [row[0]])
                self.phase = row[1]
                return
            time.sleep(0.001)


@pytest.fixture
def big_job_table(observer):
    """A job table of ROWS finished jobs at the latest migration; left migrated at the end."""
    seed_finished_jobs(observer, ROWS)
    observer.execute("ANALYZE django_pgqueue_job")
    yield observer
    call_command("migrate", APP, verbosity=0)  # whatever happened, leave it usable


@pytest.mark.parametrize("cancelled", BUILDS)
def test_a_cancelled_build_of_0003_is_repaired_by_migrate_again(big_job_table, client, cancelled):
    conn = big_job_table
    call_command("migrate", APP, "0002", verbosity=0)
    assert [validity(conn, name) for name in BUILDS] == [None, None, None]

    canceller = Canceller(conn, cancelled)
    canceller.start()
    assert canceller.watching.wait(10)
    # "DID NOT RAISE" here means the build finished before the cancel landed: raise ROWS.
    with pytest.raises(OperationalError) as raised:
        call_command("migrate", APP, verbosity=0)
    assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
    canceller.join(10)
    # Seen (and cancelled) mid-way, typically in "building index: scanning table".
    assert canceller.phase is not None

    position = BUILDS.index(cancelled)
    expected = [True] * position + [False] + [None] * (len(BUILDS) - position - 1)
    assert [validity(conn, name) for name in BUILDS] == expected, canceller.phase

    # The check names the INVALID index and the command that repairs it.
    messages = pgqueue_checks.check_invalid_indexes(databases=["default"])
    assert [message.id for message in messages] == ["django_pgqueue.W002"]
    assert f"'{cancelled}'" in messages[0].msg
    assert messages[0].hint == f"Repair it with: python manage.py migrate {APP}"

    # (The lag page, which this release's admin serves only on a migrated schema, lists
    # INVALID indexes too: test_check_invalid_indexes.py.)

    # Running the migration again repairs it: every index valid, the check silent.
    call_command("migrate", APP, verbosity=0)
    assert [validity(conn, name) for name in BUILDS] == [True, True, True]
    assert pgqueue_checks.check_invalid_indexes(databases=["default"]) == []
    login(client, superuser=True)
    page = client.get(url("django_pgqueue_lag"))
    assert page.context["invalid_indexes"] == []
    assert 'id="pgq-no-invalid-indexes"' in page.text
