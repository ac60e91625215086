"""The worker behind ``manage.py runqueueworker``, importable without the command."""

import logging

from ..compat import TASKS_LOGGER_NAME
from .loop import Worker
from .options import WorkerOptions, default_worker_id

__all__ = ["Worker", "WorkerOptions", "default_worker_id", "quiet_django_task_logs"]


def quiet_django_task_logs() -> None:
    """Raise Django's own task logger to WARNING unless the project configured it.

    Django's ``task_started``/``task_finished`` receivers log every job at INFO, which
    costs a log record per job even when no handler prints it; the worker's own job lines
    (logger ``django_pgqueue.jobs``) say the same. Failures are still logged.
    """
    tasks_logger = logging.getLogger(TASKS_LOGGER_NAME)
    if not tasks_logger.handlers and tasks_logger.level == logging.NOTSET:
        tasks_logger.setLevel(logging.WARNING)
