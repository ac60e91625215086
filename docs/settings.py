"""Minimal Django settings so autodoc can import the package."""

SECRET_KEY = "docs-only"  # noqa: S105
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.admin",
    "rangefilter",
    "django_pgqueue",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "docs"}}
TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
USE_TZ = True
