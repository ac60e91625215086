"""django-pgqueue: a durable PostgreSQL job queue and django.tasks backend.

Public names only; models live in ``django_pgqueue.models`` (import them after setup).
"""

from typing import TYPE_CHECKING

from django_pgqueue.exceptions import (
    EnqueueError,
    InvalidArguments,
    InvalidBatchResult,
    InvalidOption,
    JobNotFound,
    JobTimeout,
    LeaseLost,
    PayloadTooLarge,
    PermanentError,
    PgQueueError,
    Snooze,
    SnoozeLimitReached,
    UnknownQueue,
    UnknownTask,
)
from django_pgqueue.states import JobStatus, WorkerStatus

if TYPE_CHECKING:
    # Type checkers see the real names; at run time __getattr__ imports them lazily.
    from django_pgqueue.features.pausing import pause_queue, paused_queues, resume_queue
    from django_pgqueue.tasks.batches import BatchJob
    from django_pgqueue.tasks.decorators import task

__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> object:
    # ``task`` pulls in the backend; importing it lazily keeps ``import django_pgqueue``
    # (in a settings module, say) free of side effects.
    if name == "task":
        from django_pgqueue.tasks.decorators import task

        return task
    if name == "BatchJob":
        from django_pgqueue.tasks.batches import BatchJob

        return BatchJob
    if name in ("pause_queue", "resume_queue", "paused_queues"):
        # Pausing needs the models, hence settings: imported on first use too.
        from django_pgqueue.features import pausing

        return getattr(pausing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchJob",
    "EnqueueError",
    "InvalidArguments",
    "InvalidBatchResult",
    "InvalidOption",
    "JobNotFound",
    "JobStatus",
    "JobTimeout",
    "LeaseLost",
    "PayloadTooLarge",
    "PermanentError",
    "PgQueueError",
    "Snooze",
    "SnoozeLimitReached",
    "UnknownQueue",
    "UnknownTask",
    "WorkerStatus",
    "__version__",
    "pause_queue",
    "paused_queues",
    "resume_queue",
    "task",
]
