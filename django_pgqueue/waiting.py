"""Documented import path of :func:`wait` and :func:`await_result`.

The code lives in :mod:`django_pgqueue.features.waiting`; this module only re-exports it.
"""

from django_pgqueue.features.waiting import (
    FINISHED_CHANNEL,
    REREAD_SECONDS,
    WaitTimeout,
    await_result,
    wait,
)

__all__ = ["FINISHED_CHANNEL", "REREAD_SECONDS", "WaitTimeout", "await_result", "wait"]
