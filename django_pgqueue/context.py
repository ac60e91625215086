"""Documented import path of :class:`JobContext`.

The code lives in :mod:`django_pgqueue.tasks.context`; this module only re-exports it.
"""

from django_pgqueue.tasks.context import JobContext

__all__ = ["JobContext"]
