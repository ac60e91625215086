"""Settings of the example shop: a Django site whose background work runs on django-pgqueue.

The database is ``DATABASE_URL`` if set, otherwise the embedded PostgreSQL of this
checkout (``.pgdata``, started on demand) with its own ``pgqueue_demo`` database.
"""

from __future__ import annotations

import os
from pathlib import Path

import django

from shop.database import database_url, django_database

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-shop-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # The queue's admin pages use its date range filters.
    "rangefilter",
    "django_pgqueue",
    "orders",
]
if django.VERSION < (6, 0):
    # Django 5.2 LTS: django.tasks comes from the backport (django-tasks-pgqueue[backport]).
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": django_database(database_url())}

# ---------------------------------------------------------------- the job queue
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        # Every queue a task names must be listed; `runqueueworker` serves all of them
        # unless given --queue.
        "QUEUES": ["default", "emails", "reports"],
    }
}

# A short backoff, so the demo's flaky job reaches the dead letters within a minute
# (1, 2, 4 seconds...). Production keeps the default: 2 seconds doubling up to an hour.
# The tests set it to 0 to run every retry in one `runqueueworker --burst`.
PGQUEUE_RETRY_BASE_SECONDS = float(os.environ.get("PGQUEUE_RETRY_BASE_SECONDS", "1"))
PGQUEUE_RETRY_MAX_SECONDS = 60.0

# E-mails stay in the worker's memory; every one sent is also recorded as a SentEmail
# row, which the admin shows. A real site would configure SMTP here.
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEFAULT_FROM_EMAIL = "shop@example.com"

# With a handler on "django_pgqueue", runqueueworker leaves logging to the project: one
# line per job start and outcome, retries and dead letters as warnings.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "short": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s", "datefmt": "%X"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "short"}},
    "loggers": {
        "django_pgqueue": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "orders": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # Django logs each failed attempt again, with its traceback. The job log above
        # already has the error and the job row keeps the traceback (see the admin), so
        # the demo's terminal shows Django's records only if they are critical.
        "django.tasks": {"handlers": ["console"], "level": "CRITICAL", "propagate": False},
    },
}
