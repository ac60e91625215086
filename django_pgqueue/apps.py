"""Django application configuration."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PgQueueConfig(AppConfig):
    """The ``django_pgqueue`` app: models, migrations, admin, commands and checks."""

    name = "django_pgqueue"
    label = "django_pgqueue"
    verbose_name = _("Job queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks."""
        from django_pgqueue import checks  # noqa: F401 - registers on import
