"""System checks: one test per check ID."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings

from django_pgqueue import checks as pgqueue_checks
from django_pgqueue.conf import SETTINGS
from django_pgqueue.tasks.backend import PgQueueBackend

pytestmark = pytest.mark.timeout(60)


def _ids(messages):
    return sorted(message.id for message in messages)


def test_the_test_project_passes_all_checks(db):
    call_command("check", "--database", "default", "--fail-level", "WARNING")


@pytest.fixture
def not_postgres():
    """A SQLite alias, added for one test: only its vendor is looked at, never queried."""
    extra = connections.configure_settings(
        {
            "default": dict(connections.settings["default"]),
            "not_postgres": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        }
    )
    connections.settings["not_postgres"] = extra["not_postgres"]
    yield "not_postgres"
    connections["not_postgres"].close()
    del connections.settings["not_postgres"]


def test_e001_jobs_in_a_non_postgresql_database(not_postgres):
    backend = PgQueueBackend("x", {"QUEUES": ["default"], "OPTIONS": {"DATABASE": "not_postgres"}})
    assert _ids(backend.check()) == ["django_pgqueue.E001"]


def test_e002_postgresql_older_than_14(db, monkeypatch):
    assert pgqueue_checks.check_database_version(databases=["default"]) == []
    monkeypatch.setattr(connection, "pg_version", 130012)
    messages = pgqueue_checks.check_database_version(databases=["default"])
    assert _ids(messages) == ["django_pgqueue.E002"]
    assert "13" in messages[0].msg


def test_e002_is_skipped_without_database_access():
    assert pgqueue_checks.check_database_version(databases=None) == []


def test_e003_backend_without_the_app():
    apps_without = [
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "tests",
    ]
    with override_settings(INSTALLED_APPS=apps_without):
        backend = PgQueueBackend("x", {"QUEUES": ["default"]})
        assert _ids(backend.check()) == ["django_pgqueue.E003"]


def test_e004_admin_without_rangefilter():
    apps_without = [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django_pgqueue",
        "tests",
    ]
    with override_settings(INSTALLED_APPS=apps_without):
        assert "django_pgqueue.E004" in _ids(pgqueue_checks.check_apps())


@pytest.mark.parametrize("queues", [[], ["q" * 101], [""]])
def test_e005_invalid_queue_names(queues):
    backend = PgQueueBackend("x", {"QUEUES": queues})
    assert _ids(backend.check()) == ["django_pgqueue.E005"]


def test_e006_database_alias_not_configured():
    backend = PgQueueBackend("x", {"QUEUES": ["default"], "OPTIONS": {"DATABASE": "missing"}})
    assert _ids(backend.check()) == ["django_pgqueue.E006"]


BAD_VALUES = {
    "MAX_ATTEMPTS": 0,
    "MAX_SNOOZES": -1,
    "MIDDLEWARE": "myapp.Middleware",
    "STUCK_HANDLER_GRACE_SECONDS": -1,
    "MAX_PAYLOAD_BYTES": "big",
    "RETRY_BASE_SECONDS": -1,
    "RETRY_MAX_SECONDS": float("nan"),
    "RETRY_JITTER": 1.5,
    "LEASE_SECONDS": 0,
    "HEARTBEAT_SECONDS": True,
    "WORKER_TIMEOUT_SECONDS": 0,
    "POLL_INTERVAL_SECONDS": "1",
    "CONCURRENCY": 0,
    "BATCH_SIZE": 10**9,
    "PREFETCH": -1,
    "PREFETCH_WINDOW_SECONDS": -0.5,
    "GRACE_SECONDS": -5,
    "LOG_SUMMARY_SECONDS": float("inf"),
    "HOUSEKEEPING_INTERVAL_SECONDS": 0,
    "RETENTION_SECONDS": -1,
    "DEAD_LETTER_RETENTION_SECONDS": "forever",
    "PRUNE_BATCH_SIZE": 0,
    "UNKNOWN_TASK_TIMEOUT_SECONDS": -1,
    "NOTIFY_CHANNEL": "no spaces; allowed",
    "PARTITION_VNODES": 0,
    "METRICS_TOKEN": "short",
    "CONCURRENCY_LIMITS": {"task:tests.tasks.noop": 0},
    "RATE_LIMITS": {"task:tests.tasks.noop": "20/0s"},
    "RETENTION": {"finished": 1},
    "HISTORY_PERIOD": "month",
    "HISTORY_PREMAKE": 0,
    "SEGMENT_JOBS": 0,
    "SEGMENT_LIMIT": 65,
    "CLAIM_FLOOR_AFTER_SECONDS": -0.5,
}


def test_every_setting_has_a_check_id_and_a_bad_value():
    names = {spec.name for spec in SETTINGS}
    assert names == set(pgqueue_checks.SETTING_CHECK_IDS) == set(BAD_VALUES)
    assert len(set(pgqueue_checks.SETTING_CHECK_IDS.values())) == len(names)


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_e1xx_invalid_setting(name):
    with override_settings(**{f"PGQUEUE_{name}": BAD_VALUES[name]}):
        messages = pgqueue_checks.check_settings()
    assert _ids(messages) == [pgqueue_checks.SETTING_CHECK_IDS[name]]
    assert f"PGQUEUE_{name}" in messages[0].msg


def test_e107_heartbeat_must_fit_twice_into_the_lease():
    with override_settings(PGQUEUE_LEASE_SECONDS=10, PGQUEUE_HEARTBEAT_SECONDS=6):
        assert _ids(pgqueue_checks.check_settings()) == ["django_pgqueue.E107"]


def test_w001_app_installed_but_no_backend_uses_it():
    dummy = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
    other = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=dummy):
        assert "django_pgqueue.W001" not in _ids(pgqueue_checks.check_apps())
    if not _has_native_tasks():
        other = {"default": {"BACKEND": "django_tasks.backends.dummy.DummyBackend"}}
    with override_settings(TASKS=other):
        messages = pgqueue_checks.check_apps()
    assert _ids(messages) == ["django_pgqueue.W001"]
    assert all(isinstance(message, checks.CheckMessage) for message in messages)


def _has_native_tasks():
    from django_pgqueue.compat import NATIVE_TASKS

    return NATIVE_TASKS


def test_every_check_id_in_the_code_is_documented():
    import re
    from pathlib import Path

    import django_pgqueue

    source = "\n".join(
        path.read_text() for path in Path(django_pgqueue.__file__).parent.rglob("*.py")
    )
    used = set(re.findall(r'id="(django_pgqueue\.[EW]\d{3})"', source))
    # Schedule declarations report (check id, message) pairs (django_pgqueue/periodic.py).
    used |= set(re.findall(r'\(\s*"(django_pgqueue\.[EW]\d{3})",', source))
    assert used == set(pgqueue_checks.CHECK_IDS)


def test_e301_a_limit_names_an_unknown_queue():
    with override_settings(
        PGQUEUE_CONCURRENCY_LIMITS={"queue:nope": 2, "queue:emails": 2},
        PGQUEUE_RATE_LIMITS={"queue:nada": "5/s"},
    ):
        messages = pgqueue_checks.check_flow_limits()
    assert _ids(messages) == ["django_pgqueue.E301", "django_pgqueue.E301"]
    assert "'nope'" in messages[0].msg
    assert "'nada'" in messages[1].msg


def test_e302_a_limit_names_an_unknown_task():
    with override_settings(
        PGQUEUE_CONCURRENCY_LIMITS={"task:tests.tasks.missing": 2, "task:tests.tasks.noop": 2},
        PGQUEUE_RATE_LIMITS={"task:tests.tasks.not_a_task": "5/s"},
    ):
        messages = pgqueue_checks.check_flow_limits()
    assert _ids(messages) == ["django_pgqueue.E302", "django_pgqueue.E302"]
    assert "tests.tasks.missing" in messages[0].msg


@pytest.mark.parametrize(
    ("setting", "value", "check_id"),
    [
        ("CONCURRENCY_LIMITS", {"queue:emails": 0}, "django_pgqueue.E123"),
        ("CONCURRENCY_LIMITS", {"tenant:1": 2}, "django_pgqueue.E123"),
        ("RATE_LIMITS", {"queue:emails": "0/s"}, "django_pgqueue.E124"),
        ("RATE_LIMITS", {"queue:emails": "5/-1s"}, "django_pgqueue.E124"),
    ],
)
def test_bad_limits_in_settings(setting, value, check_id):
    with override_settings(**{f"PGQUEUE_{setting}": value}):
        assert _ids(pgqueue_checks.check_settings()) == [check_id]
        assert pgqueue_checks.check_flow_limits() == []


def test_a_bad_limit_on_a_task_fails_at_declaration():
    from django_pgqueue import task
    from django_pgqueue.exceptions import InvalidOption

    with pytest.raises(InvalidOption, match="concurrency_limit"):
        task(concurrency_limit=0)(lambda: None)
    with pytest.raises(InvalidOption, match="rate_limit"):
        task(rate_limit="10/0s")(lambda: None)
    with pytest.raises(InvalidOption, match="not both"):
        task(partition_key="p", concurrency_limit=2)(lambda: None)
