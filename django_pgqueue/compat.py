"""Every difference between the supported Django series lives here.

Django 6.x ships ``django.tasks``; Django 5.2 LTS gets the same API from the ``django-tasks``
backport (``pip install django-tasks-pgqueue[backport]``). Nothing else in the package imports
either of them directly.
"""

from __future__ import annotations

import django
from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASKS_LOGGER_NAME",
    "TASK_DECORATOR_TAKES_OPTIONS",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

#: True when Django itself provides ``django.tasks`` (6.0 and later).
NATIVE_TASKS = django.VERSION >= (6, 0)
#: True when ``@task(max_attempts=...)`` reaches the backend's task class. Django 6.1 and
#: the 5.2 backport pass unknown keyword arguments on; Django 6.0's decorator accepts only
#: its own parameters, so there ``django_pgqueue.task`` is the way to set our options.
TASK_DECORATOR_TAKES_OPTIONS = not ((6, 0) <= django.VERSION < (6, 1))
#: The logger Django's own task signal receivers write to.
TASKS_LOGGER_NAME = "django.tasks" if NATIVE_TASKS else "django_tasks"

if NATIVE_TASKS:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:  # pragma: no cover - exercised by the Django 5.2 CI leg
    try:
        from django_tasks import (  # type: ignore[no-redef]
            DEFAULT_TASK_BACKEND_ALIAS,
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task,
            task_backends,
        )
        from django_tasks import checks as _register_checks  # noqa: F401
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
        from django_tasks.base import (  # type: ignore[no-redef]
            DEFAULT_TASK_PRIORITY,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskError,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            TaskResultDoesNotExist,
        )
        from django_tasks.signals import (  # type: ignore[no-redef]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json  # type: ignore[no-redef]
    except ImportError as error:
        raise ImproperlyConfigured(
            "django-pgqueue needs django.tasks: use Django 6.0 or later, or on Django 5.2 "
            "install the backport with `pip install django-tasks-pgqueue[backport]`."
        ) from error
