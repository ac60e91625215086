"""``manage.py ensure_admin``: create a superuser, or reset the password of an existing one."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = (
        "Create the superuser USERNAME, or reset its password if it exists. The password "
        "comes from the DJANGO_SUPERUSER_PASSWORD environment variable, as for "
        "createsuperuser --noinput."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the arguments."""
        parser.add_argument("username")
        parser.add_argument("--email", default="admin@example.com")

    def handle(self, *args: Any, **options: Any) -> None:
        """Create or update the user; never print the password."""
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        if not password:
            raise CommandError("set DJANGO_SUPERUSER_PASSWORD")
        user_model = get_user_model()
        user, created = user_model._default_manager.get_or_create(
            **{user_model.USERNAME_FIELD: options["username"]},
            defaults={"email": options["email"]},
        )
        user.is_staff = True
        user.is_superuser = True
        user.is_active = True
        user.set_password(password)
        user.save()
        action = "created" if created else "password reset"
        self.stdout.write(f"superuser {options['username']!r}: {action}")
