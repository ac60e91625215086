"""Batched tasks: one handler call for many jobs of the task, one outcome per job.

A task declared with ``batch_size=N`` is called with a list of :class:`BatchJob` (up to
N jobs, each leased on its own) instead of one job's arguments. It returns None (every
job succeeded, with no result) or a mapping from job id to that job's outcome: a value
(its result), an exception instance (that job fails and is retried alone, by its own
attempts), or a :class:`~django_pgqueue.exceptions.Snooze` (that job runs again later).
Jobs it leaves out of the mapping succeeded with no result, as River's ``WorkMany``
reads its error map. Raising fails (or snoozes) every job of the batch.

Nothing here touches the database: the worker claims the batch
(:mod:`django_pgqueue.worker.batching`) and records each job's outcome with its own
lease-fenced write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django_pgqueue.exceptions import InvalidBatchResult

__all__ = ["BatchJob", "batch_outcomes"]


@dataclass(frozen=True, slots=True, eq=False)
class BatchJob:
    """One job of a batch, as a batched task's handler gets it.

    ``args`` and ``kwargs`` are what the job was enqueued with; ``attempt`` counts from
    1 and is this job's own (a job retried alone comes back in a later batch). Compared
    and hashed by identity: usable as a key of the mapping the handler returns.
    """

    id: int
    args: list[Any]
    kwargs: dict[str, Any]
    attempt: int
    max_attempts: int
    queue: str
    priority: int
    enqueued_at: datetime


def batch_outcomes(returned: object, jobs: list[BatchJob]) -> dict[int, Any]:
    """Return each job's outcome from what a batched handler returned.

    Raises :class:`InvalidBatchResult` for a value that is neither None nor a mapping,
    or a mapping naming a job that is not in the batch (a handler answering for the
    wrong jobs must not decide anything).
    """
    if returned is None:
        return {}
    if not isinstance(returned, Mapping):
        raise InvalidBatchResult(
            f"a batched task returns None or a mapping of job id to outcome, not "
            f"{type(returned).__name__}"
        )
    ids = {job.id for job in jobs}
    outcomes: dict[int, Any] = {}
    strangers: list[object] = []
    for key, outcome in returned.items():
        job_id = key.id if isinstance(key, BatchJob) else key
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id not in ids:
            strangers.append(key)
            continue
        outcomes[job_id] = outcome
    if strangers:
        raise InvalidBatchResult(
            f"the outcome names jobs that are not in the batch: {strangers[:5]!r}"
        )
    return outcomes
