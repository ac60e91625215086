"""The job and worker state machines: every status, what it means, and the allowed moves.

This is the single definition. The model's CHECK constraints, the SQL in ``sql/*.sql``
(checked by ``tests/test_states.py``), the admin and the docs all follow it.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

__all__ = [
    "TRANSITIONS",
    "BlockerFailure",
    "JobStatus",
    "Transition",
    "WorkerStatus",
]


class JobStatus(models.TextChoices):
    """Where a job is in its life."""

    #: Waiting for the jobs it depends on (``after=``); becomes pending, in the same
    #: transaction, when the last of them succeeds.
    BLOCKED = "blocked", _("Blocked")
    #: Waiting to run; ``available_at`` may lie in the future (scheduled or backing off).
    PENDING = "pending", _("Pending")
    #: Claimed by a worker that holds a lease on it.
    PROCESSING = "processing", _("Processing")
    #: Ran to completion; ``result`` holds the return value.
    SUCCEEDED = "succeeded", _("Succeeded")
    #: Gave up: attempts exhausted or the error was permanent. Only an explicit retry revives it.
    DEAD_LETTER = "dead_letter", _("Dead letter")
    #: Withdrawn by an operator, before it ran or while it ran (a running job ends here
    #: once its handler has returned, or its lease expired: until then it stays
    #: processing, with its slot and partition turn). Only an explicit retry revives it.
    CANCELLED = "cancelled", _("Cancelled")

    @property
    def is_terminal(self) -> bool:
        """Return whether nothing but an explicit retry moves a job out of this status."""
        return self in TERMINAL_STATUSES

    @property
    def is_claimable(self) -> bool:
        """Return whether a worker may claim a job in this status (once it is available)."""
        return self is JobStatus.PENDING


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED})


class Transition(models.TextChoices):
    """Every way a job changes status; each is one queue-manager operation."""

    CLAIM = "claim", _("claimed by a worker")
    COMPLETE = "complete", _("completed by its lease holder")
    RETRY_LATER = "retry_later", _("failed, retry after a backoff")
    DEAD_LETTER = "dead_letter", _("failed for good")
    RELEASE = "release", _("given back by its lease holder without using an attempt")
    REAP = "reap", _("lease expired, retry after a backoff")
    REAP_EXHAUSTED = "reap_exhausted", _("lease expired on the last attempt")
    CANCEL = (
        "cancel",
        _("cancelled by an operator before it ran, or blocked behind a failed job"),
    )
    STOP = (
        "stop",
        _(
            "cancelled by an operator while it ran: ended once its handler returned or its "
            "lease expired"
        ),
    )
    UNBLOCK = "unblock", _("the jobs it depends on finished (succeeded, or policy 'run')")
    REVIVE = "revive", _("the job whose failure cancelled it was retried")
    RETRY = "retry", _("retried by an operator")
    RETRY_BLOCKED = (
        "retry_blocked",
        _("retried by an operator while jobs it runs after have not finished"),
    )
    RUN_NOW = "run_now", _("made ready now by an operator")


#: (transition) -> (statuses it applies to, status it leads to).
TRANSITIONS: dict[Transition, tuple[frozenset[JobStatus], JobStatus]] = {
    Transition.CLAIM: (frozenset({JobStatus.PENDING}), JobStatus.PROCESSING),
    Transition.COMPLETE: (frozenset({JobStatus.PROCESSING}), JobStatus.SUCCEEDED),
    Transition.RETRY_LATER: (frozenset({JobStatus.PROCESSING}), JobStatus.PENDING),
    Transition.DEAD_LETTER: (frozenset({JobStatus.PROCESSING}), JobStatus.DEAD_LETTER),
    Transition.RELEASE: (frozenset({JobStatus.PROCESSING}), JobStatus.PENDING),
    Transition.REAP: (frozenset({JobStatus.PROCESSING}), JobStatus.PENDING),
    Transition.REAP_EXHAUSTED: (frozenset({JobStatus.PROCESSING}), JobStatus.DEAD_LETTER),
    # An operator's cancel, or a blocked job whose blocker failed (policy "cancel").
    Transition.CANCEL: (
        frozenset({JobStatus.PENDING, JobStatus.BLOCKED}),
        JobStatus.CANCELLED,
    ),
    # An operator's cancel of a running job takes effect when the attempt ends (the
    # worker's outcome statement, or the reaper): never while its handler may run.
    Transition.STOP: (frozenset({JobStatus.PROCESSING}), JobStatus.CANCELLED),
    Transition.UNBLOCK: (frozenset({JobStatus.BLOCKED}), JobStatus.PENDING),
    Transition.REVIVE: (frozenset({JobStatus.CANCELLED}), JobStatus.BLOCKED),
    Transition.RETRY: (
        frozenset({JobStatus.DEAD_LETTER, JobStatus.CANCELLED}),
        JobStatus.PENDING,
    ),
    Transition.RETRY_BLOCKED: (
        frozenset({JobStatus.DEAD_LETTER, JobStatus.CANCELLED}),
        JobStatus.BLOCKED,
    ),
    Transition.RUN_NOW: (frozenset({JobStatus.PENDING}), JobStatus.PENDING),
}


def allowed_targets(status: JobStatus) -> frozenset[JobStatus]:
    """Return the statuses a job in ``status`` may move to."""
    return frozenset(target for sources, target in TRANSITIONS.values() if status in sources)


class BlockerFailure(models.TextChoices):
    """What a blocked job does when a job it depends on ends dead-lettered or cancelled."""

    #: Cancel it, with a reason naming the blocker (the default); retrying the blocker
    #: can revive it.
    CANCEL = "cancel", _("cancel the dependent")
    #: Run it anyway, once every job it depends on has finished.
    RUN = "run", _("run the dependent anyway")


class WorkerStatus(models.TextChoices):
    """Where a worker process is in its life, as recorded in the registry."""

    #: Heartbeating and claiming work.
    ALIVE = "alive", _("Alive")
    #: Shutting down: no new claims, finishing or releasing what it holds.
    DRAINING = "draining", _("Draining")
    #: Exited, or silent for longer than the worker timeout.
    DEAD = "dead", _("Dead")
