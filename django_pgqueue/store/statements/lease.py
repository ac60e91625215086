"""Workers.

``lease.sql``: the claim, the signal folds before it, and every lease-fenced outcome
(complete, fail, extend, release, step).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django_pgqueue.conf import conf
from django_pgqueue.exceptions import InvalidOption, SnoozeLimitReached
from django_pgqueue.states import JobStatus
from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.payload import check_text
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.statements.base import (
    FOLD_BATCH,
    LAZY_FOLD_BATCH,
    StoreBase,
    leases_document,
    loads_json,
)
from django_pgqueue.store.values import (
    ClaimedJob,
    ClaimFloor,
    ClaimRound,
    FailOutcome,
    Failure,
    Lease,
    LeaseExtension,
    Snoozed,
)

_SNOOZE_LIMIT_CLASS = f"{SnoozeLimitReached.__module__}.{SnoozeLimitReached.__qualname__}"


class LeaseStatements(StoreBase):
    """Workers statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        *,
        per_queue: int | Sequence[int],
        lease_seconds: float,
        bucket_masks: Sequence[str | None] | None = None,
        total_limit: int | None = None,
    ) -> list[ClaimedJob]:
        """Lease ready jobs from ``queues`` to ``worker_id``, up to a limit per queue.

        ``per_queue`` is one limit for every queue or one per queue; ``total_limit`` caps
        the whole claim (default: the sum), and when it is smaller, queues earlier in
        ``queues`` win ties (rotate the order to take turns). Every queue is looked at.
        ``bucket_masks`` (one per queue, 1024 ``0``/``1`` characters, None for all) limits
        partitioned jobs to the worker's buckets. Takes row locks only for the duration of
        the statement; never waits on a locked row (SKIP LOCKED).
        """
        return self.claim_round(
            worker_id,
            queues,
            per_queue=per_queue,
            lease_seconds=lease_seconds,
            bucket_masks=bucket_masks,
            total_limit=total_limit,
        ).jobs

    def claim_round(
        self,
        worker_id: str,
        queues: Sequence[str],
        *,
        per_queue: int | Sequence[int],
        lease_seconds: float,
        bucket_masks: Sequence[str | None] | None = None,
        total_limit: int | None = None,
        plain: bool = False,
        floors: Sequence[ClaimFloor | None] | None = None,
        partition_floors: Sequence[ClaimFloor | None] | None = None,
        key_floors: Sequence[ClaimFloor | None] | None = None,
    ) -> ClaimRound:
        """Claim like :meth:`claim`; say what else the round found on the way.

        A full round (``plain`` false) first folds producers' urgent signals in and
        wakes the partitions and keys whose wait is over, with statements of their own
        sent in the same round trip (pipeline mode on a worker's connection), so a
        partition whose next job just became ready competes in this very claim, in claim
        order; if more urgent signals were waiting than one fold takes, they are folded
        and the free capacity is claimed again. The fold waits only on other refreshes of
        the same rows; the wake-ups and the claim never wait. ``ClaimRound.flow_open``
        says whether the next round should be a full one again.

        ``floors`` (one per queue, None for the head) starts each queue's plain jobs
        after a :class:`~django_pgqueue.store.values.ClaimFloor`: jobs that sort before
        it are not claimed in this round. ``partition_floors`` and ``key_floors`` do
        the same for the idle partitions and open keys (in the order of their next
        job): one that sorts before its floor waits for a round from the head.

        A plain round sends ``claim_batch_plain`` alone: the claim without partitions
        and concurrency keys, which reads no flow-control state at all. What a worker
        sends while nothing says a partition or key of its queues can start: producers,
        operators and completions that make one startable say so on the flow channel
        (:func:`~django_pgqueue.store.notices.flow_channel`), and a worker also sends a full
        round at least once per poll interval.
        """
        limits = [per_queue] * len(queues) if isinstance(per_queue, int) else list(per_queue)
        if len(limits) != len(queues):
            raise ValueError("per_queue needs one limit per queue")
        masks: list[str | None] = (
            list(bucket_masks) if bucket_masks is not None else [None] * len(queues)
        )
        total = sum(limits) if total_limit is None else total_limit
        starts = _per_queue("floors", floors, queues)
        flow_starts = (
            _per_queue("partition_floors", partition_floors, queues),
            _per_queue("key_floors", key_floors, queues),
        )
        claimed, signalled, folded, flow_open = self._claim_batch(
            worker_id,
            queues,
            limits,
            masks=masks,
            floors=starts,
            flow_floors=flow_starts,
            total=total,
            lease_seconds=lease_seconds,
            fold_first=not plain,
            plain=plain,
        )
        if not signalled:
            return ClaimRound(claimed, folded, flow_open)
        folded_now = self.fold_signals()
        folded += folded_now
        got = dict.fromkeys(queues, 0)
        for job in claimed:
            got[job.queue] += 1
        remaining = [
            max(0, limit - got[queue]) for queue, limit in zip(queues, limits, strict=True)
        ]
        if folded_now > 0 and total > len(claimed) and any(remaining):
            more, signalled, _, flow_open = self._claim_batch(
                worker_id,
                queues,
                remaining,
                masks=masks,
                floors=starts,
                flow_floors=flow_starts,
                total=total - len(claimed),
                lease_seconds=lease_seconds,
            )
            claimed.extend(more)
        else:
            # The fold may have opened what this round's claim could not see.
            flow_open = True
        return ClaimRound(claimed, folded, flow_open, more_signals=signalled)

    def _claim_batch(
        self,
        worker_id: str,
        queues: Sequence[str],
        limits: list[int],
        *,
        masks: Sequence[str | None],
        floors: Sequence[ClaimFloor | None],
        flow_floors: tuple[Sequence[ClaimFloor | None], Sequence[ClaimFloor | None]],
        total: int,
        lease_seconds: float,
        fold_first: bool = False,
        plain: bool = False,
    ) -> tuple[list[ClaimedJob], bool, int, bool]:
        claim = (
            QUERIES["claim_batch_plain" if plain else "claim_batch"],
            {
                "queues": list(queues),
                "bucket_masks": masks,
                "queue_limits": limits,
                **floor_params("", floors),
                **floor_params("part_", flow_floors[0]),
                **floor_params("key_", flow_floors[1]),
                "total_limit": total,
                "worker_id": worker_id,
                "lease_seconds": lease_seconds,
            },
        )
        folded = 0
        if fold_first:
            fold = (QUERIES["fold_signals"], {"batch_size": FOLD_BATCH})
            wake = (QUERIES["wake_due"], {"batch_size": FOLD_BATCH})
            fold_result, wake_result, result = self.runner.run_many([fold, wake, claim])
            folded = int(fold_result.rows[0][0] or 0) + int(wake_result.rows[0][0] or 0)
        else:
            result = self.runner.run(*claim)
        claimed = []
        signalled = False
        flow_open = False
        for row in result.rows:
            if row[0] is None:  # the last row: signals to fold? flow that could start?
                signalled = bool(row[-2])
                flow_open = bool(row[-1])
                continue
            claimed.append(_claimed_job(row, worker_id))
        return claimed, signalled, folded, flow_open

    def claim_batch_mates(
        self,
        worker_id: str,
        *,
        queue: str,
        task_path: str,
        limit: int,
        lease_seconds: float,
        floor: ClaimFloor | None = None,
    ) -> list[ClaimedJob]:
        """Lease up to ``limit`` more ready plain jobs of ``task_path`` in ``queue``.

        For a worker gathering a batch for a task declared with ``batch_size``. Jobs with
        a partition or concurrency key are never taken here (the full claim keeps their
        turns and limits); a paused queue gives nothing. Reads at most ten times
        ``limit`` of the queue's next ready jobs (at least 100, at most 10,000), so a
        backlog of other tasks' jobs costs a bounded scan. Never waits on a locked row.
        With a ``floor``, the scan starts after it (as :meth:`claim_round`'s floors do).
        """
        if limit <= 0:
            return []
        rows = self._run(
            "claim_batch_mates",
            worker_id=worker_id,
            queue=queue,
            task_path=task_path,
            limit=limit,
            scan_limit=min(max(limit * 10, 100), 10_000),
            lease_seconds=lease_seconds,
            floor_priority=None if floor is None else floor.priority,
            floor_available_at=None if floor is None else floor.available_at,
            floor_id=None if floor is None else floor.id,
        ).rows
        return [_claimed_job(row, worker_id) for row in rows]

    def fold_signals(self, *, batch_size: int = FOLD_BATCH) -> int:
        """Fold urgent signals and wake due partitions and keys; return how many changed.

        Two statements (autocommit on a worker's connection): the fold locks partition
        and key rows in key order and waits only on other refreshes of the same rows;
        the wake-ups never wait.
        """
        fold, wake = self.runner.run_many(
            [
                (QUERIES["fold_signals"], {"batch_size": batch_size}),
                (QUERIES["wake_due"], {"batch_size": batch_size}),
            ]
        )
        return int(fold.rows[0][0] or 0) + int(wake.rows[0][0] or 0)

    def fold_partition_signals(self, *, batch_size: int = FOLD_BATCH) -> int:
        """Deprecated name of :meth:`fold_signals`."""
        return self.fold_signals(batch_size=batch_size)

    def fold_lazy_signals(self, *, batch_size: int = LAZY_FOLD_BATCH) -> tuple[int, int]:
        """Fold signals producers left lazily; return (signals taken, rows refreshed).

        Each worker's housekeeping thread sends it a few times a second. Under each row's
        lock, only a partition or key whose row no longer covers its new job is
        refreshed; a key this makes startable wakes its queue's workers.
        """
        row = self._run(
            "fold_lazy_signals", batch_size=batch_size, flow_channel=flow_channel()
        ).rows[0]
        return int(row[0] or 0), int(row[1] or 0)

    def complete_if_leased(self, lease: Lease, result_json: str) -> datetime:
        """Mark the job succeeded with ``result_json``; return its finish time.

        The finish time is the database clock when the statement runs, not the start of
        the surrounding transaction (an atomic task's handler runs inside it).

        Raises :class:`LeaseLost` (changing nothing) if the lease is no longer held. Run on
        the handler's connection inside its transaction, this makes the handler's writes
        and the completion commit or roll back together.
        """
        finished_at: datetime = self._run_fenced(
            "complete_if_leased", lease, result=result_json, flow_channel=flow_channel()
        )[1]
        return finished_at

    def complete_many_if_leased(
        self, worker_id: str, completions: Sequence[tuple[Lease, str]]
    ) -> set[int]:
        """Mark many jobs succeeded; return the ids whose lease was still held.

        A job that already succeeded under the same lease (this write was sent before,
        and its acknowledgement was lost with the connection) is returned too, and left
        as that first write stored it: sending the same completions again is safe.
        A job whose cancel was requested while it ran ends cancelled instead (see
        :meth:`complete_many_outcomes`). Each result must already be JSON text (see
        :func:`payload.encode_result`).
        """
        return set(self.complete_many_outcomes(worker_id, completions))

    def complete_many_outcomes(
        self, worker_id: str, completions: Sequence[tuple[Lease, str]]
    ) -> dict[int, JobStatus]:
        """Complete like :meth:`complete_many_if_leased`; return each held job's new status.

        ``SUCCEEDED``, or ``CANCELLED`` for a job whose cancel was requested while its
        handler ran (its result is dropped). Jobs whose lease was lost are missing.
        """
        if not completions:
            return {}
        # One JSON document for the whole batch: the results are JSON already, so the
        # document is built by joining strings, and the server parses it in C.
        document = (
            "["
            + ",".join(
                f"[{lease.job_id},{lease.lease_generation},{result}]"
                for lease, result in completions
            )
            + "]"
        )
        rows = self._run(
            "complete_many_if_leased",
            worker_id=worker_id,
            completions=document,
            flow_channel=flow_channel(),
        ).rows
        done = {row[0]: JobStatus(row[1]) for row in rows}
        if len(done) < len(completions):
            # Lost leases, or a batch sent before whose answer was lost with the
            # connection: its jobs finished under these very leases, and are done.
            missing = [lease for lease, _ in completions if lease.job_id not in done]
            done.update(
                (row[0], JobStatus(row[1]))
                for row in self._run(
                    "succeeded_under_leases", worker_id=worker_id, leases=leases_document(missing)
                ).rows
            )
        return done

    def fail_if_leased(
        self, lease: Lease, failure: Failure, policy: RetryPolicy | None = None
    ) -> FailOutcome:
        """Record a failed attempt: retry after a backoff, or dead-letter the job.

        The job is dead-lettered when ``failure.permanent`` or its attempts are used up.
        Raises :class:`LeaseLost` (changing nothing) if the lease is no longer held.
        """
        policy = policy or RetryPolicy.from_settings()
        job_id, status, available_at, attempts, max_attempts, _, _ = self._run_fenced(
            "fail_if_leased",
            lease,
            flow_channel=flow_channel(),
            permanent=failure.permanent,
            error_class=failure.exception_class,
            message=failure.message,
            traceback=failure.traceback,
            **policy.sql_params(),
        )
        return FailOutcome(job_id, JobStatus(status), available_at, attempts, max_attempts)

    def extend_lease_if_leased(self, lease: Lease, lease_seconds: float) -> datetime:
        """Push the lease's expiry to now + ``lease_seconds``; return the new expiry.

        Raises :class:`LeaseLost` if the lease is no longer held.
        """
        expires_at: datetime = self._run_fenced(
            "extend_lease_if_leased", lease, lease_seconds=lease_seconds
        )[1]
        return expires_at

    def extend_leases_if_leased(
        self, worker_id: str, leases: Sequence[Lease], lease_seconds: float
    ) -> LeaseExtension:
        """Extend many leases at once, never waiting on a row lock.

        Returns the ids extended and the ids whose rows were locked (still held, try
        again later); any other lease was lost.
        """
        if not leases:
            return LeaseExtension(frozenset(), frozenset())
        rows = self._run(
            "extend_leases_if_leased",
            worker_id=worker_id,
            leases=leases_document(leases),
            lease_seconds=lease_seconds,
        ).rows
        return LeaseExtension(
            held=frozenset((row[0], row[1]) for row in rows if row[2]),
            busy=frozenset((row[0], row[1]) for row in rows if not row[2]),
            cancelling=frozenset((row[0], row[1]) for row in rows if row[3]),
        )

    def release_if_leased(
        self,
        lease: Lease,
        *,
        delay_seconds: float = 0.0,
        reason: str | None = None,
        reason_class: str | None = None,
        unknown_since: datetime | None = None,
    ) -> datetime:
        """Give the job back without using up an attempt; return when it is available.

        The lease generation is bumped, so a late completion by this worker is fenced.
        ``reason``/``reason_class`` are shown as the job's last error; ``unknown_since``
        starts the unknown-task window (kept if it had started already). Raises
        :class:`LeaseLost` if the lease is no longer held.
        """
        available_at: datetime = self._run_fenced(
            "release_if_leased",
            lease,
            delay_seconds=delay_seconds,
            reason=reason,
            reason_class=reason_class,
            unknown_since=unknown_since,
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        )[1]
        return available_at

    def snooze_if_leased(self, lease: Lease, *, delay_seconds: float, max_snoozes: int) -> Snoozed:
        """Put the job back for ``delay_seconds`` without using up an attempt (a snooze).

        A job that has snoozed ``max_snoozes`` times already is dead-lettered with
        :class:`SnoozeLimitReached` instead; one whose cancel was requested ends
        cancelled. Raises :class:`LeaseLost` (changing nothing) if the lease is gone.
        """
        row = self._run_fenced(
            "snooze_if_leased",
            lease,
            delay_seconds=delay_seconds,
            max_snoozes=max_snoozes,
            limit_class=_SNOOZE_LIMIT_CLASS,
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        )
        return Snoozed(row[0], JobStatus(row[1]), row[2], row[3])

    def release_many_if_leased(
        self, worker_id: str, leases: Sequence[Lease], *, reason: str | None = None
    ) -> set[int]:
        """Give many jobs back at once (shutdown); return the ids that were released."""
        if not leases:
            return set()
        rows = self._run(
            "release_many_if_leased",
            worker_id=worker_id,
            leases=leases_document(leases),
            reason=reason,
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        ).rows
        return {row[0] for row in rows}

    def set_step_if_leased(self, lease: Lease, step: str | None) -> None:
        """Record the job's progress marker; raise :class:`LeaseLost` if not held."""
        if step is not None:
            if not isinstance(step, str):
                raise InvalidOption("step", f"must be a string or None, not {step!r}")
            check_text("step", step)
        self._run_fenced("set_step_if_leased", lease, step=step)


def _per_queue(
    name: str, floors: Sequence[ClaimFloor | None] | None, queues: Sequence[str]
) -> list[ClaimFloor | None]:
    """Return one floor (or None) per queue, checked against ``queues``."""
    starts: list[ClaimFloor | None] = list(floors) if floors is not None else [None] * len(queues)
    if len(starts) != len(queues):
        raise ValueError(f"{name} needs one floor (or None) per queue")
    return starts


def floor_params(prefix: str, floors: Sequence[ClaimFloor | None]) -> dict[str, list[Any]]:
    """Return claim_batch's three arrays for one kind of floor."""
    return {
        f"{prefix}floor_priorities": [f.priority if f else None for f in floors],
        f"{prefix}floor_available_ats": [f.available_at if f else None for f in floors],
        f"{prefix}floor_ids": [f.id if f else None for f in floors],
    }


def _claimed_job(row: Sequence[Any], worker_id: str) -> ClaimedJob:
    """Return a claimed job from a row of claim_batch or claim_batch_mates."""
    return ClaimedJob(
        id=row[0],
        queue=row[1],
        task_path=row[2],
        args=loads_json(row[3]),
        kwargs=loads_json(row[4]),
        priority=row[5],
        attempts=row[6],
        max_attempts=row[7],
        lease_generation=row[8],
        step=row[9],
        partition_key=row[10],
        idempotency_key=row[11],
        created_at=row[12],
        available_at=row[13],
        claimed_at=row[14],
        lease_expires_at=row[15],
        prior_workers=loads_json(row[16]),
        worker_id=worker_id,
        unknown_task_since=row[17],
        traceparent=row[18],
        concurrency_key=row[19],
    )
