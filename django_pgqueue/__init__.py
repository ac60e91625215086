"""django-pgqueue: a durable PostgreSQL job queue and django.tasks backend.

Public names only; models live in ``django_pgqueue.models`` (import them after setup).
"""

from typing import TYPE_CHECKING

from .exceptions import (
    EnqueueError,
    InvalidArguments,
    InvalidOption,
    JobNotFound,
    JobTimeout,
    LeaseLost,
    PayloadTooLarge,
    PermanentError,
    PgQueueError,
    UnknownQueue,
    UnknownTask,
)
from .states import JobStatus, WorkerStatus

if TYPE_CHECKING:
    # Type checkers see the real decorator; at run time __getattr__ imports it lazily.
    from .decorators import task

__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> object:
    # ``task`` pulls in the backend; importing it lazily keeps ``import django_pgqueue``
    # (in a settings module, say) free of side effects.
    if name == "task":
        from .decorators import task

        return task
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EnqueueError",
    "InvalidArguments",
    "InvalidOption",
    "JobNotFound",
    "JobStatus",
    "JobTimeout",
    "LeaseLost",
    "PayloadTooLarge",
    "PermanentError",
    "PgQueueError",
    "UnknownQueue",
    "UnknownTask",
    "WorkerStatus",
    "__version__",
    "task",
]
