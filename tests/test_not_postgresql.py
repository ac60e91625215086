"""A project whose queue database is not PostgreSQL: one clear error, nothing buried.

Enqueueing (or reading a result) raises :class:`NotPostgreSQL`, naming the setting to
change, instead of the database's syntax error at the first placeholder; and the checks
report E001 alone, not under a warning per commented column of the queue's models.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.apps import apps
from django.db import connections

from django_pgqueue.compat import task
from django_pgqueue.exceptions import ConfigurationError, NotPostgreSQL
from django_pgqueue.models import Job
from django_pgqueue.tasks.backend import PgQueueBackend

pytestmark = pytest.mark.timeout(120)

SQLITE_PROJECT_SETTINGS = """
import django

SECRET_KEY = "not-a-secret"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rangefilter",
    "django_pgqueue",
    "probe_app",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # the backport of django.tasks
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default"],
    }
}
USE_TZ = True
"""

PROBE_TASKS = """
from django_pgqueue import task


@task()
def probe():
    return 1
"""


@pytest.fixture
def not_postgres() -> Iterator[str]:
    """A SQLite alias, added for one test: only its vendor is looked at, never queried."""
    connections.settings["not_postgres"] = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
    }
    yield "not_postgres"
    connections["not_postgres"].close()
    del connections.settings["not_postgres"]


@task
def plain() -> None:
    """A task to enqueue (it never reaches a worker)."""


def test_enqueue_raises_the_typed_error_naming_the_backends_database_option(not_postgres):
    backend = PgQueueBackend("x", {"QUEUES": ["default"], "OPTIONS": {"DATABASE": not_postgres}})
    with pytest.raises(NotPostgreSQL) as raised:
        backend.enqueue(plain, (), {})
    assert isinstance(raised.value, ConfigurationError)
    message = str(raised.value)
    assert "TASKS['x']['OPTIONS']['DATABASE']" in message
    assert "'not_postgres', which is sqlite" in message
    assert "django_pgqueue.E001" in message
    with pytest.raises(NotPostgreSQL):
        backend.enqueue_many(plain, [((), {})])
    with pytest.raises(NotPostgreSQL):
        backend.get_result("1")


def test_the_queue_manager_names_the_databases_engine(not_postgres):
    with pytest.raises(NotPostgreSQL, match=r"DATABASES\['not_postgres'\]\['ENGINE'\]"):
        Job.objects.store(not_postgres)


def test_the_queue_models_add_no_comment_warnings_on_sqlite(not_postgres):
    models = apps.get_app_config("django_pgqueue").get_models()
    commented = [
        field
        for model in models
        for field in model._meta.local_fields
        if getattr(field, "db_comment", None)
    ]
    assert len(commented) > 20  # what Django would warn about, one by one
    messages = [message for model in models for message in model.check(databases=[not_postgres])]
    assert [message.id for message in messages] == []


def test_a_sqlite_project_gets_e001_alone_and_the_typed_error_at_enqueue(tmp_path):
    (tmp_path / "sqlite_settings.py").write_text(SQLITE_PROJECT_SETTINGS)
    (tmp_path / "probe_app").mkdir()
    (tmp_path / "probe_app" / "__init__.py").write_text("")
    (tmp_path / "probe_app" / "tasks.py").write_text(PROBE_TASKS)
    env = {"DJANGO_SETTINGS_MODULE": "sqlite_settings", "PYTHONPATH": str(tmp_path), "PATH": ""}

    def django(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    check = django("check", "--database", "default")
    assert check.returncode == 1
    assert "(django_pgqueue.E001)" in check.stderr
    assert "identified 1 issue" in check.stderr, check.stderr
    assert "W163" not in check.stderr
    assert "W046" not in check.stderr

    enqueue = django("shell", "-c", "from probe_app.tasks import probe\nprobe.enqueue()")
    assert enqueue.returncode == 1
    last_line = enqueue.stderr.strip().splitlines()[-1]
    assert last_line == (
        "django_pgqueue.exceptions.NotPostgreSQL: TASKS['default'] stores its jobs in "
        "database 'default', which is sqlite, not PostgreSQL (django_pgqueue.E001): set "
        "DATABASES['default']['ENGINE'] to 'django.db.backends.postgresql'"
    ), enqueue.stderr
    assert "OperationalError" not in enqueue.stderr
