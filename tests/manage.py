"""``python -m tests.manage``: management commands against the test settings."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a management command with ``tests.settings``."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.core.management import execute_from_command_line

    from tests.database import ensure_server

    ensure_server()

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
