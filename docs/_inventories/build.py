"""Write ``django.inv``: the few Django objects these docs link to.

The documentation builds without network access, so intersphinx reads this small,
reviewable inventory instead of downloading Django's. Run ``python build.py`` after
editing ENTRIES.
"""

from __future__ import annotations

import zlib
from pathlib import Path

# (name, domain:role, uri relative to https://docs.djangoproject.com/en/6.1/, display)
ENTRIES = [
    ("django.tasks", "py:module", "ref/tasks/#module-django.tasks", "-"),
    ("django.tasks.task", "py:function", "ref/tasks/#django.tasks.task", "-"),
    ("django.tasks.Task", "py:class", "ref/tasks/#django.tasks.Task", "-"),
    ("django.tasks.Task.using", "py:method", "ref/tasks/#django.tasks.Task.using", "-"),
    ("django.tasks.Task.enqueue", "py:method", "ref/tasks/#django.tasks.Task.enqueue", "-"),
    ("django.tasks.TaskResult", "py:class", "ref/tasks/#django.tasks.TaskResult", "-"),
    ("django.tasks.TaskContext", "py:class", "ref/tasks/#django.tasks.TaskContext", "-"),
    ("django.tasks.TaskResultStatus", "py:class", "ref/tasks/#django.tasks.TaskResultStatus", "-"),
    (
        "django.tasks.signals.task_enqueued",
        "py:data",
        "ref/signals/#django.tasks.signals.task_enqueued",
        "-",
    ),
    (
        "django.tasks.signals.task_started",
        "py:data",
        "ref/signals/#django.tasks.signals.task_started",
        "-",
    ),
    (
        "django.tasks.signals.task_finished",
        "py:data",
        "ref/signals/#django.tasks.signals.task_finished",
        "-",
    ),
    ("TASKS", "std:setting", "ref/settings/#std-setting-TASKS", "TASKS"),
    ("DATABASES", "std:setting", "ref/settings/#std-setting-DATABASES", "DATABASES"),
    (
        "django.db.transaction.atomic",
        "py:function",
        "topics/db/transactions/#django.db.transaction.atomic",
        "-",
    ),
    (
        "django.db.transaction.on_commit",
        "py:function",
        "topics/db/transactions/#django.db.transaction.on_commit",
        "-",
    ),
    ("topics/tasks", "std:doc", "topics/tasks/", "Django's Tasks framework"),
    ("topics/db/transactions", "std:doc", "topics/db/transactions/", "Database transactions"),
    ("ref/django-admin", "std:doc", "ref/django-admin/", "django-admin and manage.py"),
    ("topics/checks", "std:doc", "topics/checks/", "System check framework"),
]


def main() -> None:
    header = (
        "# Sphinx inventory version 2\n"
        "# Project: Django\n"
        "# Version: 6.1\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(f"{name} {role} 1 {uri} {display}\n" for name, role, uri, display in ENTRIES)
    target = Path(__file__).with_name("django.inv")
    target.write_bytes(header.encode() + zlib.compress(body.encode()))
    print(f"wrote {len(ENTRIES)} entries to {target}")


if __name__ == "__main__":
    main()
