"""The worker behind ``manage.py runqueueworker``, importable without the command."""

from .loop import Worker
from .options import WorkerOptions, default_worker_id

__all__ = ["Worker", "WorkerOptions", "default_worker_id"]
