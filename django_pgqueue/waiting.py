"""Documented import path of :func:`wait` and :func:`await_result`.

The code lives in :mod:`django_pgqueue.features.waiting`; this module only re-exports it.
"""

from django_pgqueue.features.waiting import WaitTimeout, await_result, wait

__all__ = ["WaitTimeout", "await_result", "wait"]
