"""Django application configuration."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class PgQueueConfig(AppConfig):
    """The ``django_pgqueue`` app: models, migrations, admin, commands and checks."""

    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = _("Job queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks and the SQL enqueue settings' refresh after migrate."""
        from django_pgqueue import checks  # noqa: F401 - registers on import
        from django_pgqueue.tasks import sqlsync

        post_migrate.connect(sqlsync.after_migrate, sender=self)
