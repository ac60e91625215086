"""A database without the queue's tables, and a project without the app: one clear line.

Forgetting ``migrate`` is the first mistake of many new users. The check (E007), the
worker's start and enqueue all name the fix instead of printing a ProgrammingError.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_pgqueue import checks as pgqueue_checks
from django_pgqueue.compat import task_backends
from django_pgqueue.exceptions import AppNotInstalled, NotMigrated
from django_pgqueue.tasks.backend import PgQueueBackend
from django_pgqueue.tools.embedded import database_settings
from tests import tasks
from tests.scratch import scratch_database
from tests.workers import WorkerProcess

pytestmark = pytest.mark.timeout(90)

SCRATCH_TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default"],
    },
    "scratch": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"DATABASE": "scratch"},
    },
}


@pytest.fixture
def empty_database() -> Iterator[str]:
    """Return the URL of a fresh database without any table."""
    with scratch_database("unmigrated") as url:
        yield url


@pytest.fixture
def scratch_alias(empty_database: str, django_db_blocker) -> Iterator[str]:
    """Add the empty database as alias ``scratch`` for one test."""
    extra = connections.configure_settings(
        {
            "default": dict(connections.settings["default"]),
            "scratch": database_settings(empty_database),
        }
    )
    connections.settings["scratch"] = extra["scratch"]
    with django_db_blocker.unblock():
        yield "scratch"
        connections["scratch"].close()
    del connections["scratch"]
    del connections.settings["scratch"]


def test_e007_reports_missing_tables_and_migrate_still_runs(scratch_alias):
    with override_settings(TASKS=SCRATCH_TASKS):
        messages = pgqueue_checks.check_tables(databases=[scratch_alias])
        assert [message.id for message in messages] == ["django_pgqueue.E007"]
        assert "django_pgqueue_job" in messages[0].msg
        assert messages[0].hint == "Run python manage.py migrate --database scratch."
        # migrate runs the database checks first: E007 must not stop the command that fixes it.
        call_command("migrate", database=scratch_alias, skip_checks=False, verbosity=0)
        assert pgqueue_checks.check_tables(databases=[scratch_alias]) == []


def test_e007_needs_database_access():
    assert pgqueue_checks.check_tables(databases=None) == []


def test_enqueue_without_tables_says_run_migrate(scratch_alias):
    with override_settings(TASKS=SCRATCH_TASKS):
        with pytest.raises(NotMigrated) as raised:
            tasks.add.using(backend="scratch").enqueue(1, 2)
        with pytest.raises(NotMigrated):
            tasks.add.using(backend="scratch").enqueue_many([((1, 2), {})])
        with pytest.raises(NotMigrated):
            task_backends["scratch"].get_result("1")
    assert str(raised.value) == (
        "the job queue's tables are missing from database 'scratch': run manage.py migrate"
    )
    assert raised.value.__suppress_context__


def test_worker_without_tables_stops_with_one_line(empty_database):
    worker = WorkerProcess(empty_database, "--burst")
    try:
        assert worker.wait(60) == 2, worker.output()
        lines = worker.output().strip().splitlines()
    finally:
        worker.stop()
    assert lines == [
        "CommandError: the job queue's tables are missing from database 'default' "
        "(django_pgqueue_job, django_pgqueue_dependency, django_pgqueue_partition, "
        "django_pgqueue_partition_signal, django_pgqueue_concurrency, "
        "django_pgqueue_concurrency_signal, django_pgqueue_worker, django_pgqueue_queuestat, "
        "django_pgqueue_schedule, django_pgqueue_queue_pause, django_pgqueue_sql_settings, "
        "django_pgqueue_job_key, django_pgqueue_job_history, django_pgqueue_coalesce_key): "
        "run manage.py migrate"
    ]


def test_enqueue_without_the_app_reports_e003():
    without_app = ["django.contrib.contenttypes", "django.contrib.auth", "tests"]
    with (
        override_settings(INSTALLED_APPS=without_app),
        pytest.raises(AppNotInstalled, match=r"django_pgqueue\.E003"),
    ):
        tasks.add.enqueue(1, 2)


def test_e001_hint_names_only_what_the_user_set():
    implicit = PgQueueBackend("x", {"QUEUES": ["default"]})
    assert "OPTIONS" not in implicit._postgresql_hint()
    assert "DATABASES['default']['ENGINE']" in implicit._postgresql_hint()
    explicit = PgQueueBackend("x", {"QUEUES": ["default"], "OPTIONS": {"DATABASE": "other"}})
    assert "TASKS['x']['OPTIONS']['DATABASE']" in explicit._postgresql_hint()
