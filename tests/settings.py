"""Settings of the test project (also used by ``python -m tests.manage``)."""

from __future__ import annotations

import json as _json
import os as _os
from typing import Any as _Any

import django

from django_pgqueue.tools.embedded import database_settings
from tests.database import database_url, django_database

SECRET_KEY = "django-pgqueue-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_pgqueue",
    "tests",
]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": django_database(database_url())}
if _os.environ.get("PGQUEUE_TEST_PREPARED_STATEMENTS"):
    # Django's opt-in to server-side binding and prepared statements, which the
    # performance docs suggest for enqueueing: CI's Django 6.0 leg runs with it.
    DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 2}

TASKS: dict[str, dict[str, _Any]] = {
    "default": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default", "emails", "reports", "high", "low"],
    }
}

if _os.environ.get("PGQUEUE_TEST_PGBOUNCER"):
    # PgBouncer in transaction mode (before 1.21) keeps no prepared statements and no
    # server-side cursors across transactions.
    DATABASES["default"]["OPTIONS"] = {"prepare_threshold": None}
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

if _os.environ.get("PGQUEUE_TEST_SECOND_DATABASE_URL"):
    # A second queue on a database of its own (tests/test_two_databases.py workers).
    DATABASES["second"] = database_settings(_os.environ["PGQUEUE_TEST_SECOND_DATABASE_URL"])
    TASKS["second"] = {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"DATABASE": "second"},
    }

PGQUEUE_RETRY_BASE_SECONDS = 0.05
PGQUEUE_RETRY_MAX_SECONDS = 1.0


# Worker subprocesses of the tests take PGQUEUE_* overrides from their environment,
# as JSON values (PGQUEUE_HOUSEKEEPING_INTERVAL_SECONDS=0.5, say). PGQUEUE_TEST_*,
# PGQUEUE_SOAK_* and PGQUEUE_MODEL_* variables steer the tests themselves.
_env_overrides = {
    key: _json.loads(value)
    for key, value in _os.environ.items()
    if key.startswith("PGQUEUE_")
    and not key.startswith(("PGQUEUE_TEST_", "PGQUEUE_SOAK_", "PGQUEUE_MODEL_"))
}
globals().update(_env_overrides)
