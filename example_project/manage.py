#!/usr/bin/env python
"""``python example_project/manage.py``: management commands of the example shop."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a management command with the shop's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
