"""The worker behind ``manage.py runqueueworker``, importable without the command."""

import logging

from django_pgqueue.compat import TASKS_LOGGER_NAME
from django_pgqueue.worker.loop import Worker
from django_pgqueue.worker.options import WorkerOptions, default_worker_id

__all__ = ["Worker", "WorkerOptions", "default_worker_id", "quiet_django_task_logs"]


def quiet_django_task_logs() -> None:
    """Silence Django's own task logger in the worker unless the project configured it.

    Django's ``task_started``/``task_finished`` receivers log every job at INFO and every
    failed attempt at ERROR with its full traceback. The worker's own lines (logger
    ``django_pgqueue.jobs``) say the same in one line per attempt, with the traceback
    once, when the job is dead-lettered; Django's would repeat it on every retry. Give
    ``django.tasks`` a handler or a level in ``LOGGING`` to keep its records.
    """
    tasks_logger = logging.getLogger(TASKS_LOGGER_NAME)
    if not tasks_logger.handlers and tasks_logger.level == logging.NOTSET:
        tasks_logger.setLevel(logging.CRITICAL)
