"""Pause and resume queues at run time: the public functions behind the admin and commands.

A pause is a row in ``django_pgqueue_queue_pause``. The claim statement reads it on every
round (sql/lease.sql, claim_batch), so once :func:`pause_queue` has committed, no worker
starts another job of that queue, however many workers and hosts there are, without a
restart or a signal. Jobs already running finish; enqueueing carries on.
"""

from __future__ import annotations

from django.db import router, transaction

from django_pgqueue.exceptions import InvalidOption, UnknownQueue
from django_pgqueue.limits import QUEUE_MAX_LENGTH
from django_pgqueue.store.payload import check_text
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.reports import PausedQueue
from django_pgqueue.tasks.backend import configured_queues

__all__ = ["PausedQueue", "pause_queue", "paused_queues", "resume_queue"]

#: Longest ``by`` accepted (the column's length).
PAUSED_BY_MAX_LENGTH = 150


def pause_queue(
    queue: str, *, by: str = "", reason: str = "", using: str | None = None
) -> PausedQueue:
    """Pause ``queue``: no worker starts its jobs from the next claim round on.

    ``by`` and ``reason`` are shown in the admin and by ``queuehealth``. Pausing a paused
    queue keeps the first pause (returned with ``created`` False). Commits at once unless
    called inside a transaction (then the pause holds once that commits). Raises
    :class:`UnknownQueue` if no backend in ``TASKS`` lists the queue, and
    :class:`InvalidOption` for an over-long ``by``.
    """
    _check_known(queue)
    if not isinstance(by, str) or len(by) > PAUSED_BY_MAX_LENGTH:
        raise InvalidOption("by", f"must be a string of at most {PAUSED_BY_MAX_LENGTH} characters")
    if not isinstance(reason, str):
        raise InvalidOption("reason", "must be a string")
    check_text("by", by)
    check_text("reason", reason)
    alias = _alias(using)
    with transaction.atomic(using=alias):
        return _store(alias).pause_queue(queue, paused_by=by, reason=reason)


def resume_queue(queue: str, *, using: str | None = None) -> PausedQueue | None:
    """Resume ``queue`` and wake its workers; return the pause removed (None: not paused).

    Raises :class:`UnknownQueue` if the queue is neither paused nor listed in ``TASKS``
    (a queue paused and then removed from the settings can still be resumed).
    """
    _check_name(queue)
    alias = _alias(using)
    with transaction.atomic(using=alias):
        resumed = _store(alias).resume_queue(queue)
        if resumed is None:
            _check_known(queue)
        return resumed


def paused_queues(*, using: str | None = None) -> dict[str, PausedQueue]:
    """Return the paused queues by name, with who paused them, when and why."""
    return _store(_alias(using)).paused_queues()


def _check_name(queue: object) -> None:
    if not isinstance(queue, str) or not queue or len(queue) > QUEUE_MAX_LENGTH:
        raise InvalidOption(
            "queue", f"must be a queue name of 1 to {QUEUE_MAX_LENGTH} characters, not {queue!r}"
        )


def _check_known(queue: str) -> None:
    _check_name(queue)
    known = configured_queues()
    if queue not in known:
        raise UnknownQueue(queue, known)


def _alias(using: str | None) -> str:
    if using is not None:
        return using
    from django_pgqueue.models import Job

    return router.db_for_write(Job)


def _store(alias: str) -> QueueStore:
    from django_pgqueue.models import Job

    return Job.objects.store(alias)
