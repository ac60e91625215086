"""The backend's documented path: ``"BACKEND": "django_pgqueue.backend.PgQueueBackend"``.

The code lives in :mod:`django_pgqueue.tasks.backend`; this module only re-exports it.
"""

from django_pgqueue.tasks.backend import PgQueueBackend, PgQueueTask

__all__ = ["PgQueueBackend", "PgQueueTask"]
