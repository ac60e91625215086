"""A model of what the queue must do, for the model-based test (``test_state_model.py``).

Plain Python, no database: jobs with their status, attempts, lease, partition,
concurrency key, rate bucket, coalesce key and dependencies, and the rules that say
which jobs a claim may and must take. The test drives the real store and this model side
by side and compares them after every step.

Time is the model's own clock in whole seconds (see the test's docstring): every delay
is a multiple of 100 s, so the real time an example takes (well under a second) never
flips a comparison.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import Lease

__all__ = ["KEYS", "RATED", "ModelJob", "QueueModel", "claim_order"]

#: Concurrency keys and their limits; RATED also starts at most one job per RATE_PERIOD.
KEYS = {"k1": 1, "k2": 2}
RATED = "r1"
RATE_PERIOD = 100
FINISHED = frozenset({JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED})
FAILED = frozenset({JobStatus.DEAD_LETTER, JobStatus.CANCELLED})


@dataclass
class ModelJob:
    """What the model knows about one job."""

    id: int
    queue: str
    priority: int
    max_attempts: int
    partition: str | None = None
    key: str | None = None
    coalesce: str | None = None
    status: JobStatus = JobStatus.PENDING
    attempts: int = 0
    #: Times its handler snoozed (no attempt used); reset by a retry.
    snoozes: int = 0
    ready_at: int = 0
    lease: Lease | None = None
    lease_expires: int | None = None
    #: The lease it finished under: a batched completion sent again with it is done.
    finished_under: Lease | None = None
    #: An operator asked to cancel it while it ran: it ends cancelled with its attempt.
    cancel_requested: bool = False
    #: Its handler ran past its timeout: still running (its lease kept) until it returns.
    overdue: bool = False
    generations: list[int] = field(default_factory=list)
    #: Jobs it was enqueued after= (blocked until they are settled), and the policy.
    after: list[int] = field(default_factory=list)
    on_failure: str = "cancel"
    #: The blockers through which a failure cancelled it (the edges marked
    #: cancelled_job): retrying one of them with its dependents may revive it.
    cancelled_via: set[int] = field(default_factory=set)


def claim_order(job: ModelJob, available: Mapping[int, Any] | None = None) -> tuple[Any, ...]:
    """Return the claim order: priority first (higher runs first), then ready time, id.

    ``available`` gives the jobs' stored ready times: jobs made ready in the same model
    second (a release, a retry) are ordered by the moment the database recorded.
    """
    ready = job.ready_at if available is None else available[job.id]
    return (-job.priority, ready, job.id)


class QueueModel:
    """Every job, the clock, the paused queues and the rate bucket, with the rules."""

    def __init__(self) -> None:
        self.jobs: dict[int, ModelJob] = {}
        self.now = 0
        self.paused: set[str] = set()
        #: Starts of the rate-limited key: one token per RATE_PERIOD, at most one held.
        self.rate_starts: list[int] = []

    # ------------------------------------------------------------------ views
    def running(self) -> list[ModelJob]:
        return [job for job in self.jobs.values() if job.status == JobStatus.PROCESSING]

    def in_flight(self, key: str) -> int:
        return sum(1 for job in self.running() if job.key == key)

    def tokens(self) -> int:
        """Return the rate-limited key's whole tokens now (its bucket holds one)."""
        if not self.rate_starts:
            return 1
        return 1 if self.now - self.rate_starts[-1] >= RATE_PERIOD else 0

    def limit_of(self, key: str) -> int:
        return KEYS.get(key, 10**9)

    def partition_head(self, partition: str) -> ModelJob | None:
        """Return the oldest job of ``partition`` not started yet (pending or blocked)."""
        waiting = [
            job
            for job in self.jobs.values()
            if job.partition == partition and job.status in (JobStatus.PENDING, JobStatus.BLOCKED)
        ]
        return min(waiting, key=lambda job: job.id) if waiting else None

    def claimable(self, queue: str, available: Mapping[int, Any] | None = None) -> list[ModelJob]:
        """Return the jobs of ``queue`` a claim may take now, in claim order.

        Per concurrency key, only as many as it has free slots (and, for the rated key,
        tokens): the best ones of the key. ``available`` orders ties (see claim_order).
        """
        if queue in self.paused:
            return []
        busy = {job.partition for job in self.running() if job.partition is not None}
        ready = sorted(
            (
                job
                for job in self.jobs.values()
                if job.status == JobStatus.PENDING
                and job.queue == queue
                and job.ready_at <= self.now
            ),
            key=lambda job: claim_order(job, available),
        )
        taken: Counter[str] = Counter()
        result = []
        for job in ready:
            if job.partition is not None and (
                job.partition in busy or self.partition_head(job.partition) is not job
            ):
                continue
            if job.key is not None:
                free = self.limit_of(job.key) - self.in_flight(job.key)
                if job.key == RATED:
                    free = min(free, self.tokens())
                if taken[job.key] >= free:
                    continue
                taken[job.key] += 1
            result.append(job)
        return result

    def blocked_behind(self, job: ModelJob) -> list[ModelJob]:
        return [self.jobs[b] for b in job.after if b in self.jobs]

    def coalescing_holder(self, coalesce: str, task_path: str = "") -> ModelJob | None:
        """Return the job holding ``coalesce``: pending and never left pending since."""
        for job in self.jobs.values():
            if job.coalesce == coalesce and job.status == JobStatus.PENDING:
                return job
        return None

    # ------------------------------------------------------------------ moves
    def settled_for(self, blocker: ModelJob | None, dependent: ModelJob) -> bool:
        if blocker is None:  # pruned after it finished: it settled long ago
            return True
        if blocker.status == JobStatus.SUCCEEDED:
            return True
        return dependent.on_failure == "run" and blocker.status in FAILED

    def settle(self, finished: ModelJob) -> None:
        """Mirror the settling trigger: ``finished`` just ended; settle its dependents.

        A failure cancels, in one go, every blocked job reachable through "cancel" edges
        (marking each edge walked); each job cancelled then settles its own dependents
        with policy "run", as its own trigger does.
        """
        cancelled: list[ModelJob] = []
        if finished.status in FAILED:
            frontier = [finished.id]
            walked: set[tuple[int, int]] = set()
            while frontier:
                nxt = []
                for blocker_id in frontier:
                    for job in self.jobs.values():
                        edge = (job.id, blocker_id)
                        if (
                            blocker_id in job.after
                            and job.on_failure == "cancel"
                            and job.status == JobStatus.BLOCKED
                            and edge not in walked
                        ):
                            walked.add(edge)
                            job.cancelled_via.add(blocker_id)
                            if job not in cancelled:
                                cancelled.append(job)
                                nxt.append(job.id)
                frontier = nxt
            for job in cancelled:
                job.status = JobStatus.CANCELLED
        for source in [finished, *cancelled]:
            for job in sorted(self.jobs.values(), key=lambda job: job.id):
                if (
                    job.status == JobStatus.BLOCKED
                    and source.id in job.after
                    and all(self.settled_for(self.jobs.get(b), job) for b in job.after)
                ):
                    job.status = JobStatus.PENDING
                    job.ready_at = max(job.ready_at, self.now)

    def end_attempt(self, job: ModelJob, status: JobStatus, *, ready_at: int | None = None) -> None:
        """The attempt holding ``job`` ended: record ``status`` (a cancel overrides it)."""
        if job.cancel_requested:
            status = JobStatus.CANCELLED
        job.lease = None
        job.lease_expires = None
        job.overdue = False
        job.status = status
        if status == JobStatus.PENDING:
            job.coalesce = None  # it let go of its coalesce key
            job.ready_at = self.now if ready_at is None else ready_at
        if status in FINISHED:
            self.settle(job)

    def retry_outcomes(self, retried: set[int]) -> dict[int, JobStatus | None]:
        """Return what a retry of ``retried`` makes of each: pending, blocked, or None.

        None: left alone, because a failed blocker not retried with it would cancel it
        again (policy "cancel"), directly or through another retried job left alone.
        """
        held_back: set[int] = set()
        changed = True
        while changed:
            changed = False
            for job_id in retried - held_back:
                job = self.jobs[job_id]
                for b in job.after:
                    blocker = self.jobs.get(b)
                    if job.on_failure != "cancel" or blocker is None:
                        continue
                    if b in held_back or (b not in retried and blocker.status in FAILED):
                        held_back.add(job_id)
                        changed = True
                        break
        outcomes: dict[int, JobStatus | None] = {}
        for job_id in retried:
            if job_id in held_back:
                outcomes[job_id] = None
                continue
            job = self.jobs[job_id]
            waits = any(
                (b in retried and b not in held_back) or (self.jobs[b].status not in FINISHED)
                for b in job.after
                if b in self.jobs
            )
            outcomes[job_id] = JobStatus.BLOCKED if waits else JobStatus.PENDING
        return outcomes

    def revive(self, retried: list[int]) -> list[int]:
        """Mirror revive_dependents: what the retried jobs' failure cancelled waits again."""
        tree: set[int] = set()
        frontier = set(retried)
        while frontier:
            found = {job.id for job in self.jobs.values() if job.cancelled_via & frontier}
            frontier = found - tree
            tree |= found
        candidates = {job_id for job_id in tree if self.jobs[job_id].status == JobStatus.CANCELLED}
        held_back = {
            job_id
            for job_id in candidates
            if self.jobs[job_id].on_failure == "cancel"
            and any(
                (blocker := self.jobs.get(b)) is not None
                and b not in retried
                and b not in candidates
                and blocker.status in FAILED
                for b in self.jobs[job_id].after
            )
        }
        changed = True
        while changed:  # and, transitively, what they would cancel again
            changed = False
            for job_id in candidates - held_back:
                job = self.jobs[job_id]
                if job.on_failure == "cancel" and any(b in held_back for b in job.after):
                    held_back.add(job_id)
                    changed = True
        revived = []
        for job_id in sorted(candidates - held_back):
            job = self.jobs[job_id]
            job.status = JobStatus.BLOCKED
            job.cancelled_via = set()
            revived.append(job_id)
        return revived
