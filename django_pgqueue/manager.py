"""The queue manager: the only code that executes queue SQL.

:class:`QueueStore` runs the named statements of ``sql/*.sql`` on one connection and
returns typed values (:mod:`django_pgqueue.values`). It is bound either to a Django
connection (a :class:`~django_pgqueue.runners.DjangoRunner`, so enqueueing joins the
caller's transaction and shows up in Django's query logging) or to a worker's own psycopg
connection (a :class:`~django_pgqueue.runners.PsycopgRunner`, server-side binding and
prepared statements). What an enqueue checks before it writes is in
:mod:`django_pgqueue.enqueueing`. :class:`JobManager` is ``Job.objects``: the public
entry point.

The values and runners are importable from here too, as they were before they had
modules of their own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, models

from .coalescing import check_coalescing
from .conf import conf
from .enqueueing import (
    EnqueueDefaults,
    check_blocker_databases,
    dependent_status,
    jobs_document,
    validated,
    validated_calls,
    validated_many,
)
from .exceptions import InvalidOption, LeaseLost, NotPostgreSQL, UnknownDependency
from .limits import JOB_ID_MAX, JOB_ID_MIN
from .notices import flow_channel, lease_channel
from .payload import check_text
from .retry import RetryPolicy
from .runners import DjangoRunner, PsycopgRunner, Result, Runner, load_json
from .sql import QUERIES
from .states import BlockerFailure, JobStatus
from .values import (
    ClaimedJob,
    ClaimRound,
    DeadLetterGroup,
    DueSchedule,
    Enqueued,
    FailOutcome,
    Failure,
    FireResult,
    InvalidIndex,
    JobSnapshot,
    JobSpec,
    Lease,
    LeaseExtension,
    LiveWorker,
    OperatorResult,
    PartitionBlocker,
    PausedQueue,
    PausedSchedule,
    QueueCounts,
    QueueLag,
    QueueMinute,
    QueueTotals,
    QueueWorkers,
    ReapedJob,
    ScheduleDefinition,
    StuckKind,
    StuckWork,
    TableHealth,
    WorkerHeartbeat,
    WorkerLoad,
)

if TYPE_CHECKING:
    from .models import Job

__all__ = [
    "ClaimRound",
    "ClaimedJob",
    "DjangoRunner",
    "DueSchedule",
    "Enqueued",
    "FailOutcome",
    "Failure",
    "FireResult",
    "InvalidIndex",
    "JobManager",
    "JobSnapshot",
    "JobSpec",
    "Lease",
    "LeaseExtension",
    "OperatorResult",
    "PausedQueue",
    "PausedSchedule",
    "PsycopgRunner",
    "QueueStore",
    "ReapedJob",
    "ScheduleDefinition",
]

# Fixed key of the housekeeping advisory lock: the first 8 bytes of sha1("django_pgqueue").
HOUSEKEEPING_LOCK_KEY = 0x1F2B_8D6A_4C3E_5A71
# Fixed key of the schedule sync lock: the next 8 bytes of sha1("django_pgqueue").
SCHEDULE_SYNC_LOCK_KEY = 0x3B6F_0E2D_91C4_7A58
# Largest number of ids an operator statement handles at once.
OPERATOR_CHUNK = 1000
#: How long (seconds) a cancel keeps trying a job whose row is locked before it reports
#: the job busy: longer than any bookkeeping statement, shorter than an admin's patience.
CANCEL_PATIENCE = 1.0
# Urgent signals one fold takes, and partitions and keys one wake-up wakes (the claim
# folds and wakes before it claims).
FOLD_BATCH = 1000
# Lazy signals one fold_lazy_signals takes (housekeeping, off the claim path).
LAZY_FOLD_BATCH = 2000


# ---------------------------------------------------------------------- the store
class QueueStore:
    """Every queue operation, bound to one connection.

    Methods ending in ``_if_leased`` apply only while the caller holds the lease they
    name; single-job ones raise :class:`LeaseLost` otherwise (changing nothing), batch
    ones return the ids that applied.
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def _run(self, name: str, **params: Any) -> Result:
        return self.runner.run(QUERIES[name], params)

    def _run_fenced(self, name: str, lease: Lease, **params: Any) -> tuple[Any, ...]:
        """Run a single-job ``_if_leased`` statement; return its row or raise LeaseLost."""
        rows = self._run(
            name,
            job_id=lease.job_id,
            lease_generation=lease.lease_generation,
            worker_id=lease.worker_id,
            **params,
        ).rows
        if not rows:
            raise LeaseLost(lease.job_id, lease.lease_generation, lease.worker_id)
        row: tuple[Any, ...] = rows[0]
        return row

    # ------------------------------------------------------------------ producers
    def enqueue(self, spec: JobSpec) -> Enqueued:
        """Insert one job, or return the existing one holding its idempotency key.

        Runs in the connection's current transaction: the job exists (and workers are
        woken) only once that transaction commits. Raises an :class:`EnqueueError`
        subclass, before touching the database, for any invalid field.
        """
        params = validated(spec, EnqueueDefaults.read())
        channel = conf.NOTIFY_CHANNEL
        after = params.pop("after")
        if after:
            check_blocker_databases(spec.after, self.runner.alias)
        on_failure = params.pop("on_blocker_failure")
        if spec.coalesce_key is not None:
            return self._enqueue_coalesced(spec, params)
        if after:
            return self._enqueue_after(params, after, on_failure)
        if params["idempotency_key"] is None:
            # The common cases get plain INSERT statements (see sql/enqueue.sql).
            unkeyed = {k: v for k, v in params.items() if k != "idempotency_key"}
            if (
                params["available_at"] is None
                and params["partition_key"] is None
                and params["concurrency_key"] is None
            ):
                del unkeyed["available_at"]
                row = self._run("enqueue", channel=channel, **unkeyed).rows[0]
            else:
                row = self._run(
                    "enqueue_at", channel=channel, flow_channel=flow_channel(), **unkeyed
                ).rows[0]
            return Enqueued(None, True, self.runner.alias, pending=(row[0], row[1], row[2], params))
        found = self._run(
            "enqueue_idempotent", channel=channel, flow_channel=flow_channel(), **params
        ).dicts()
        if found:
            return Enqueued(
                JobSnapshot.from_row(found[0]), bool(found[0]["created"]), self.runner.alias
            )
        # The key's holder committed after this statement's snapshot began: read it now.
        assert spec.idempotency_key is not None
        existing = self._by_idempotency_keys([spec.idempotency_key])
        if spec.idempotency_key in existing:
            return Enqueued(existing[spec.idempotency_key], False, self.runner.alias)
        # The holder was deleted in between (pruned or discarded): the key is free again.
        return self.enqueue(spec)

    def _enqueue_coalesced(self, spec: JobSpec, params: dict[str, Any]) -> Enqueued:
        key, seconds = check_coalescing(spec.coalesce_key, spec.debounce, spec.idempotency_key)
        unkeyed = {k: v for k, v in params.items() if k != "idempotency_key"}
        found = self._run(
            "enqueue_coalesced",
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
            coalesce_key=key,
            debounce_seconds=seconds,
            **unkeyed,
        ).dicts()
        if found:
            return Enqueued(
                JobSnapshot.from_row(found[0]), bool(found[0]["created"]), self.runner.alias
            )
        # The key is held by a pending job of another task (left unchanged): return it.
        holder = self._run("select_by_coalesce_key", coalesce_key=key).dicts()
        if holder:
            return Enqueued(JobSnapshot.from_row(holder[0]), False, self.runner.alias)
        return self._enqueue_coalesced(spec, params)  # claimed in between: the key is free

    def enqueue_many(self, specs: Iterable[JobSpec]) -> list[Enqueued]:
        """Insert many jobs with one statement; return one outcome per spec, in order.

        Validates every spec before writing anything. Specs sharing an idempotency key
        (with each other or with existing jobs) resolve to the same job. Specs with a
        coalesce key are enqueued one statement each, in input order, after the others
        (two of them sharing a key resolve to the same job, with the later one's
        arguments). The outcomes carry snapshots; ``outcome.job`` builds a model
        instance only when asked for.
        """
        specs = list(specs)
        if not specs:
            return []
        defaults = EnqueueDefaults.read()
        prepared = validated_many(specs, defaults)
        dependencies = [(p.pop("after"), p.pop("on_blocker_failure")) for p in prepared]
        for spec, (after, _) in zip(specs, dependencies, strict=True):
            if after:  # every spec checked before the first is written
                check_blocker_databases(spec.after, self.runner.alias)
        if any(spec.coalesce_key is not None for spec in specs):
            plain = [index for index, spec in enumerate(specs) if spec.coalesce_key is None]
            results: dict[int, Enqueued] = dict(
                zip(plain, self.enqueue_many([specs[index] for index in plain]), strict=True)
            )
            for index, spec in enumerate(specs):
                if spec.coalesce_key is not None:
                    results[index] = self._enqueue_coalesced(spec, prepared[index])
            return [results[index] for index in range(len(specs))]
        if any(after for after, _ in dependencies):
            # Each dependent locks its blockers and reads their status: one at a time,
            # in order (a later spec cannot name an earlier one's id: it has none yet).
            return [
                self._enqueue_after(params, after, on_failure)
                if after
                else self.enqueue_many([spec])[0]
                for spec, params, (after, on_failure) in zip(
                    specs, prepared, dependencies, strict=True
                )
            ]
        if all(params["idempotency_key"] is None for params in prepared):
            return self._insert_unkeyed(prepared)
        rows = _inserted_rows(
            self._run(
                "enqueue_many",
                channel=conf.NOTIFY_CHANNEL,
                flow_channel=flow_channel(),
                jobs=jobs_document(prepared),
            )
        )
        alias = self.runner.alias
        outcomes: list[Enqueued | None] = []
        by_key: dict[str, JobSnapshot] = {}
        position = 0
        for params in prepared:
            key = params["idempotency_key"]
            if key is not None and key in by_key:
                outcomes.append(Enqueued(by_key[key], False, alias))
                continue
            row = rows[position] if position < len(rows) else None
            # The returned arrays follow the insert order (ORDER BY position); a row
            # skipped by ON CONFLICT is simply absent, so the next one has another key.
            if row is not None and row[3] == key:
                position += 1
                outcome = Enqueued(None, True, alias, pending=(row[0], row[1], row[2], params))
                if key is not None:
                    by_key[key] = outcome.snapshot
                outcomes.append(outcome)
            elif key is not None:
                outcomes.append(None)  # an existing job holds the key
            else:
                raise AssertionError("enqueue_many: RETURNING rows out of input order")
        if position != len(rows):
            raise AssertionError("enqueue_many: more rows returned than matched")
        if None in outcomes:
            missing = [
                p["idempotency_key"] for p, o in zip(prepared, outcomes, strict=True) if o is None
            ]
            existing = self._by_idempotency_keys(missing)
            for index, spec in enumerate(specs):
                if outcomes[index] is None:
                    key = spec.idempotency_key
                    assert key is not None
                    if key in existing:
                        outcomes[index] = Enqueued(existing[key], False, alias)
                    else:  # deleted in between: enqueue it again
                        outcomes[index] = self.enqueue(spec)
        return [outcome for outcome in outcomes if outcome is not None]

    def enqueue_calls(
        self, template: JobSpec, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[Enqueued]:
        """Insert one job per ``(args, kwargs)``, each with every other field of ``template``.

        What ``Task.enqueue_many`` sends: the same as :meth:`enqueue_many` with one spec
        per call, but the options are checked once and no spec is built per call. A
        template with dependencies, an idempotency key or a coalesce key takes the
        per-spec path.
        """
        calls = list(calls)
        if not calls:
            return []
        prepared = validated_calls(template, calls, EnqueueDefaults.read())
        if prepared is None:
            return self.enqueue_many(
                [replace(template, args=args, kwargs=kwargs) for args, kwargs in calls]
            )
        return self._insert_unkeyed(prepared)

    def _insert_unkeyed(self, prepared: list[dict[str, Any]]) -> list[Enqueued]:
        """Insert checked jobs without idempotency keys or dependencies, in one statement."""
        rows = _inserted_rows(
            self._run(
                "enqueue_many_unkeyed",
                channel=conf.NOTIFY_CHANNEL,
                flow_channel=flow_channel(),
                jobs=jobs_document(prepared),
            )
        )
        if len(rows) != len(prepared):  # nothing can skip a row of this statement
            raise AssertionError("enqueue_many: a row was not inserted")
        alias = self.runner.alias
        return [
            Enqueued(None, True, alias, pending=(row[0], row[1], row[2], params))
            for row, params in zip(rows, prepared, strict=True)
        ]

    def _enqueue_after(
        self, params: dict[str, Any], blocker_ids: list[int], on_failure: str
    ) -> Enqueued:
        """Insert a job that runs after ``spec.after``: blocked, pending or cancelled.

        The blockers are locked first (until the caller commits), so none can finish
        unseen between reading its status and recording the edge; missing ids raise
        :class:`UnknownDependency` before anything is written.
        """
        rows = self._run("lock_blockers", blocker_ids=blocker_ids).rows
        statuses = {row[0]: JobStatus(row[1]) for row in rows}
        missing = [job_id for job_id in blocker_ids if job_id not in statuses]
        if missing:
            raise UnknownDependency(missing)
        status, last_error, cancelled_by = dependent_status(blocker_ids, statuses, on_failure)
        row = self._run(
            "enqueue_after",
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
            status=status,
            last_error=last_error,
            cancelled_by=cancelled_by,
            on_failure=on_failure,
            blocker_ids=blocker_ids,
            **{k: v for k, v in params.items() if k != "idempotency_key"},
        ).rows[0]
        params = {**params, "status": status, "last_error": last_error}
        return Enqueued(None, True, self.runner.alias, pending=(row[0], row[1], row[2], params))

    def _by_idempotency_keys(self, keys: list[str]) -> dict[str, JobSnapshot]:
        rows = self._run("select_by_idempotency_keys", idempotency_keys=keys).dicts()
        return {row["idempotency_key"]: JobSnapshot.from_row(row) for row in rows}

    # ------------------------------------------------------------------ workers
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

        A plain round sends ``claim_batch_plain`` alone: the claim without partitions
        and concurrency keys, which reads no flow-control state at all. What a worker
        sends while nothing says a partition or key of its queues can start: producers,
        operators and completions that make one startable say so on the flow channel
        (:func:`~django_pgqueue.notices.flow_channel`), and a worker also sends a full
        round at least once per poll interval.
        """
        limits = [per_queue] * len(queues) if isinstance(per_queue, int) else list(per_queue)
        if len(limits) != len(queues):
            raise ValueError("per_queue needs one limit per queue")
        masks: list[str | None] = (
            list(bucket_masks) if bucket_masks is not None else [None] * len(queues)
        )
        total = sum(limits) if total_limit is None else total_limit
        claimed, signalled, folded, flow_open = self._claim_batch(
            worker_id,
            queues,
            limits,
            masks=masks,
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
        loads = _loads_json
        signalled = False
        flow_open = False
        for row in result.rows:
            if row[0] is None:  # the last row: signals to fold? flow that could start?
                signalled = bool(row[-2])
                flow_open = bool(row[-1])
                continue
            claimed.append(
                ClaimedJob(
                    id=row[0],
                    queue=row[1],
                    task_path=row[2],
                    args=loads(row[3]),
                    kwargs=loads(row[4]),
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
                    prior_workers=loads(row[16]),
                    worker_id=worker_id,
                    unknown_task_since=row[17],
                    traceparent=row[18],
                    concurrency_key=row[19],
                )
            )
        return claimed, signalled, folded, flow_open

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
                    "succeeded_under_leases", worker_id=worker_id, leases=_leases_document(missing)
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
            leases=_leases_document(leases),
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

    def release_many_if_leased(
        self, worker_id: str, leases: Sequence[Lease], *, reason: str | None = None
    ) -> set[int]:
        """Give many jobs back at once (shutdown); return the ids that were released."""
        if not leases:
            return set()
        rows = self._run(
            "release_many_if_leased",
            worker_id=worker_id,
            leases=_leases_document(leases),
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

    # ------------------------------------------------------------------ maintenance
    def try_housekeeping_lock(self) -> bool:
        """Take the transaction-level housekeeping lock if free; call inside a transaction."""
        rows = self._run("try_housekeeping_lock", lock_key=HOUSEKEEPING_LOCK_KEY).rows
        return bool(rows[0][0])

    def reap_expired(
        self,
        *,
        limit: int = 1000,
        policy: RetryPolicy | None = None,
        job_ids: Sequence[int] | None = None,
    ) -> list[ReapedJob]:
        """Recover up to ``limit`` jobs whose lease expired (optionally only ``job_ids``).

        Each goes back to pending after a backoff, or to dead_letter if that was its last
        attempt. Rows locked by someone else (a late completion in progress) are skipped.
        """
        policy = policy or RetryPolicy.from_settings()
        rows = self._run(
            "reap_expired",
            limit=limit,
            job_ids=list(job_ids) if job_ids is not None else None,
            lease_channel=lease_channel(),
            **policy.sql_params(),
        ).rows
        return [ReapedJob(job_id, JobStatus(status), queue) for job_id, status, queue in rows]

    def expired_job_ids(self, *, limit: int) -> list[int]:
        """Return up to ``limit`` ids of jobs whose lease expired, longest expired first."""
        return [row[0] for row in self._run("expired_job_ids", limit=limit).rows]

    def prune_finished(self, *, retention_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` succeeded/cancelled jobs older than the retention."""
        return self._run(
            "prune_finished", retention_seconds=retention_seconds, limit=limit
        ).rowcount

    def prune_dead_letters(self, *, retention_seconds: float, limit: int) -> int:
        """Delete up to ``limit`` dead letters older than the retention."""
        return self._run(
            "prune_dead_letters", retention_seconds=retention_seconds, limit=limit
        ).rowcount

    def partitions_out_of_date(
        self, *, after_key: str = "", scan_limit: int = 10_000
    ) -> tuple[list[str], str | None]:
        """Return the partitions whose claim state disagrees with the job table.

        Scans at most ``scan_limit`` partitions with pending jobs after ``after_key``;
        also returns where to resume (None: the scan reached the end).
        """
        rows = self._run("partitions_out_of_date", after_key=after_key, scan_limit=scan_limit).rows
        keys = [key for key, kind in rows if kind != "scanned"]
        resume = next(key for key, kind in rows if kind == "scanned")
        return keys, resume

    def prune_idle_concurrency_keys(self, *, limit: int = 1000) -> int:
        """Forget rate-limited keys without jobs whose bucket is full again; return how many."""
        return len(self._run("prune_idle_concurrency_keys", limit=limit).rows)

    def repair_partitions(self, partition_keys: Sequence[str]) -> int:
        """Recompute the claim state of ``partition_keys`` from the job table."""
        if not partition_keys:
            return 0
        rows = self._run("repair_partitions", partition_keys=list(partition_keys)).rows
        return int(rows[0][0] or 0)

    def missing_tables(self, tables: Sequence[str]) -> list[str]:
        """Return those of ``tables`` that do not exist (``migrate`` was not run)."""
        return [row[0] for row in self._run("missing_tables", tables=list(tables)).rows]

    def register_worker(
        self,
        worker_id: str,
        *,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        metadata: Mapping[str, Any],
        timeout_seconds: float,
    ) -> bool:
        """Add the worker to the registry (alive); return False if a live worker has the id.

        A row left by a dead worker, or one silent for longer than ``timeout_seconds``,
        is taken over.
        """
        rows = self._run(
            "register_worker",
            worker_id=worker_id,
            hostname=hostname,
            pid=pid,
            queues=json.dumps(list(queues)),
            concurrency=concurrency,
            metadata=json.dumps(dict(metadata)),
            timeout_seconds=timeout_seconds,
        ).rows
        return bool(rows)

    def heartbeat_worker(
        self,
        worker_id: str,
        *,
        status: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        metadata: Mapping[str, Any],
    ) -> datetime:
        """Refresh the worker's registry row (re-creating it if needed)."""
        rows = self._run(
            "heartbeat_worker",
            worker_id=worker_id,
            status=status,
            hostname=hostname,
            pid=pid,
            queues=json.dumps(list(queues)),
            concurrency=concurrency,
            metadata=json.dumps(dict(metadata)),
        ).rows
        seen_at: datetime = rows[0][0]
        return seen_at

    def set_worker_status(self, worker_id: str, status: str) -> bool:
        """Set the worker's registry status; return whether its row exists."""
        return bool(self._run("set_worker_status", worker_id=worker_id, status=status).rows)

    def live_workers(self, *, timeout_seconds: float) -> list[LiveWorker]:
        """Return alive workers heard from within the timeout, sorted by id."""
        rows = self._run("live_workers", timeout_seconds=timeout_seconds).rows
        return [LiveWorker(worker_id, tuple(load_json(queues))) for worker_id, queues in rows]

    def mark_silent_workers_dead(self, *, timeout_seconds: float) -> list[str]:
        """Mark workers silent for longer than the timeout dead; return their ids."""
        rows = self._run("mark_silent_workers_dead", timeout_seconds=timeout_seconds).rows
        return [row[0] for row in rows]

    def prune_dead_workers(self, *, retention_seconds: float) -> int:
        """Delete dead workers' rows older than the retention."""
        return self._run("prune_dead_workers", retention_seconds=retention_seconds).rowcount

    def record_queue_stats(self, counts: Sequence[QueueCounts]) -> None:
        """Add finished-job counts to the current minute of each queue."""
        if not counts:
            return
        self._run(
            "record_queue_stats",
            queues=[count.queue for count in counts],
            succeeded=[count.succeeded for count in counts],
            failed=[count.failed for count in counts],
            dead_lettered=[count.dead_lettered for count in counts],
            wait_ms_max=[count.wait_ms_max for count in counts],
        )

    def prune_queue_stats(self, *, retention_seconds: float) -> int:
        """Delete per-minute statistics older than the retention."""
        return self._run("prune_queue_stats", retention_seconds=retention_seconds).rowcount

    # ------------------------------------------------------------------ operators
    # Each raises InvalidOption, before any SQL, for an id that is not a bigint integer.
    def retry(self, job_ids: Iterable[int], *, revive_dependents: bool = False) -> OperatorResult:
        """Revive dead-lettered or cancelled jobs (attempts reset, ready now).

        A job that runs after others (``after=``) that have not all finished comes back
        ``blocked``, and runs once they have; one whose failed blocker would cancel it
        again is skipped (retry that blocker with ``revive_dependents`` instead). A job
        whose row, or a blocker's, stays locked for about a second is listed in ``busy``.

        With ``revive_dependents``, the jobs their failure cancelled (and, transitively,
        the dependents those cancelled) become blocked again, in the same transaction
        (one is opened if the connection is not in one already); see
        :meth:`revive_dependents`.
        """
        ids = _unique_ids(job_ids)
        with self.runner.atomic():
            result = self._operate_patiently(
                "retry_jobs", ids, channel=conf.NOTIFY_CHANNEL, flow_channel=flow_channel()
            )
            if revive_dependents and result.done:
                self.revive_dependents(result.done)
        return result

    def revive_dependents(self, job_ids: Iterable[int]) -> list[int]:
        """Make the dependents the failure of ``job_ids`` cancelled blocked again.

        Call it in the transaction that retried ``job_ids``; return the revived ids.
        """
        ids = _unique_ids(job_ids)
        return [row[0] for row in self._run("revive_dependents", job_ids=ids).rows]

    def cancelled_dependents(self, job_ids: Iterable[int]) -> dict[int, list[int]]:
        """Return, per job, the dependents its failure cancelled (still cancelled)."""
        found: dict[int, list[int]] = {}
        for blocker_id, job_id, *_ in self._run(
            "cancelled_dependents", job_ids=_unique_ids(job_ids)
        ).rows:
            found.setdefault(blocker_id, []).append(job_id)
        return found

    def mark_awaited(self, job_id: int) -> tuple[JobStatus, bool] | None:
        """Ask for a NOTIFY when ``job_id`` finishes; return (status, awaited) or None.

        ``awaited`` is False only while another transaction holds the row (try again).
        """
        rows = self._run("mark_awaited", job_id=job_id).rows
        if not rows:
            return None
        return JobStatus(rows[0][0]), bool(rows[0][1])

    def run_now(self, job_ids: Iterable[int]) -> OperatorResult:
        """Make scheduled or backing-off pending jobs ready now."""
        return self._operate(
            "run_jobs_now", job_ids, channel=conf.NOTIFY_CHANNEL, flow_channel=flow_channel()
        )

    def cancel(self, job_ids: Iterable[int], *, reason: str | None = None) -> OperatorResult:
        """Cancel pending, blocked and running jobs; finished ones are skipped.

        A pending or blocked job ends ``cancelled`` at once. A running one is asked to
        stop: its worker is told at once (``context.cancelled`` turns true), and the job
        keeps its lease, partition turn and concurrency slot until its handler returns;
        it then ends ``cancelled``, its result dropped. Such jobs are listed in
        ``running`` as well as ``done``. Never waits on a row lock for long: a job whose
        row stays locked for about a second (held by an atomic task's open transaction)
        is skipped and listed in ``busy``.
        """
        if reason is not None:
            check_text("reason", reason)
        ids = _unique_ids(job_ids)
        running: list[int] = []

        def note_running(row: tuple[Any, ...]) -> None:
            if row[2]:
                running.append(row[0])

        result = self._operate_patiently(
            "cancel_jobs",
            ids,
            on_row=note_running,
            reason=reason,
            flow_channel=flow_channel(),
            lease_channel=lease_channel(),
        )
        return replace(result, running=tuple(sorted(running)))

    def _operate_patiently(
        self,
        name: str,
        ids: list[int],
        *,
        on_row: Callable[[tuple[Any, ...]], None] | None = None,
        **params: Any,
    ) -> OperatorResult:
        """Run an operator statement whose rows say (id, applied, ...), retrying busy ids.

        A row locked for an instant (a claim, a completion, a lease extension) is free
        again within milliseconds; only a long transaction outlasts the patience.
        """
        done: list[int] = []
        waiting = ids
        deadline = time.monotonic() + CANCEL_PATIENCE
        pause = 0.02
        while True:
            busy: list[int] = []
            for start in range(0, len(waiting), OPERATOR_CHUNK):
                rows = self._run(
                    name, job_ids=waiting[start : start + OPERATOR_CHUNK], **params
                ).rows
                for row in rows:
                    if row[1]:
                        done.append(row[0])
                        if on_row is not None:
                            on_row(row)
                    else:
                        busy.append(row[0])
            if not busy or time.monotonic() + pause > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
            waiting = sorted(busy)
        result = _operator_result(ids, done)
        return OperatorResult(result.done, result.skipped, tuple(sorted(busy)))

    def discard(self, job_ids: Iterable[int]) -> OperatorResult:
        """Delete finished jobs; pending and running ones are skipped."""
        return self._operate("discard_jobs", job_ids)

    def requeue_expired(self, job_ids: Iterable[int]) -> OperatorResult:
        """Recover the given jobs now if their lease has expired; others are skipped."""
        ids = _unique_ids(job_ids)
        done: list[int] = []
        for start in range(0, len(ids), OPERATOR_CHUNK):
            chunk = ids[start : start + OPERATOR_CHUNK]
            done.extend(job.job_id for job in self.reap_expired(limit=len(chunk), job_ids=chunk))
        return _operator_result(ids, done)

    def _operate(self, name: str, job_ids: Iterable[int], **params: Any) -> OperatorResult:
        ids = _unique_ids(job_ids)
        done: list[int] = []
        for start in range(0, len(ids), OPERATOR_CHUNK):
            chunk = ids[start : start + OPERATOR_CHUNK]
            done.extend(row[0] for row in self._run(name, job_ids=chunk, **params).rows)
        return _operator_result(ids, done)

    # ------------------------------------------------------------------ admin (read-only)
    # The admin pages' queries (sql/admin.sql). None writes or locks; each uses an index.
    def estimated_job_count(self) -> int | None:
        """Return the planner's estimate of the job table's rows; None if never analyzed."""
        rows = self._run("estimated_job_count").rows
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def job_table_health(self) -> TableHealth | None:
        """Return the job table's size and vacuum statistics (None if it is not visible)."""
        rows = self._run("job_table_health").dicts()
        return TableHealth(**rows[0]) if rows else None

    def known_queues(self, configured: Iterable[str] = ()) -> list[str]:
        """Return the queues worth showing, sorted: ``configured`` and every queue in use."""
        rows = self._run("known_queues", configured=sorted(set(configured))).rows
        return [row[0] for row in rows]

    def queue_lag(self, queues: Sequence[str], *, count_limit: int = 10_000) -> list[QueueLag]:
        """Return the backlog of each queue, sorted by name; counts stop at ``count_limit``."""
        rows = self._run("queue_lag", queues=list(queues), count_limit=count_limit).dicts()
        return [QueueLag(**row, count_limit=count_limit) for row in rows]

    def queue_minutes(self, queues: Sequence[str], *, minutes: int = 60) -> list[QueueMinute]:
        """Return the per-minute counters of ``queues`` over the last ``minutes``, oldest first."""
        rows = self._run("queue_minutes", queues=list(queues), minutes=minutes).dicts()
        return [QueueMinute(**row) for row in rows]

    def dead_letter_groups(self, *, limit: int = 500) -> list[DeadLetterGroup]:
        """Return dead letters grouped by task and error class, the largest groups first."""
        rows = self._run("dead_letter_groups", limit=limit).dicts()
        return [DeadLetterGroup(**row) for row in rows]

    def partition_blocker(self, job_id: int, partition_key: str) -> PartitionBlocker | None:
        """Return the job a pending partitioned job waits for; None if it is the head."""
        rows = self._run("partition_blocker", job_id=job_id, partition_key=partition_key).rows
        return PartitionBlocker(rows[0][0], JobStatus(rows[0][1])) if rows else None

    def partition_waiting(
        self, job_id: int, partition_key: str, *, include_older: bool, limit: int
    ) -> list[int]:
        """Return up to ``limit`` ids of the partition's pending jobs queued behind a job.

        ``include_older`` counts every other pending job (the job is running); otherwise
        only younger ones (the job is pending: older ones run before it).
        """
        rows = self._run(
            "partition_waiting",
            job_id=job_id,
            partition_key=partition_key,
            include_older=include_older,
            limit=limit,
        ).rows
        return [row[0] for row in rows]

    def jobs_in_flight(self, worker_ids: Sequence[str]) -> dict[str, WorkerLoad]:
        """Return the running jobs of each of ``worker_ids`` that holds any, by worker id."""
        if not worker_ids:
            return {}
        rows = self._run("jobs_in_flight", worker_ids=list(worker_ids)).dicts()
        return {row["worker_id"]: WorkerLoad(**row) for row in rows}

    def stuck_work(
        self,
        queues: Sequence[str],
        *,
        timeout_seconds: float,
        count_limit: int = 10_000,
        row_limit: int = 20,
    ) -> list[StuckWork]:
        """Return what is stuck: expired leases, silent workers, unserved queues, full keys.

        ``queues`` are the queues to look at for a live worker; a worker counts as live
        while it heartbeated within ``timeout_seconds``. At most ``row_limit`` of each
        kind, the longest stuck first; job counts stop at ``count_limit``.
        """
        rows = self._run(
            "stuck_work",
            queues=list(queues),
            timeout_seconds=timeout_seconds,
            count_limit=count_limit,
            row_limit=row_limit,
        ).dicts()
        return [StuckWork(**{**row, "kind": StuckKind(row["kind"])}) for row in rows]

    # ------------------------------------------------------------------ metrics (read-only)
    # sql/metrics.sql: what django_pgqueue.metrics adds to the admin's queries.
    def queue_finished_totals(self, queues: Sequence[str], *, minutes: int) -> list[QueueTotals]:
        """Return each queue's finished attempts over the last ``minutes``, sorted by queue."""
        rows = self._run("queue_finished_totals", queues=list(queues), minutes=minutes).dicts()
        return [QueueTotals(**row) for row in rows]

    def queue_workers(self, queues: Sequence[str], *, timeout_seconds: float) -> list[QueueWorkers]:
        """Return how many live, draining and silent workers serve each queue."""
        rows = self._run(
            "queue_workers", queues=list(queues), timeout_seconds=timeout_seconds
        ).dicts()
        return [QueueWorkers(**row) for row in rows]

    # ------------------------------------------------------------------ probes (read-only)
    # sql/health.sql: manage.py queuehealth.
    def worker_heartbeats(
        self, *, hostname: str | None = None, worker_id: str | None = None
    ) -> list[WorkerHeartbeat]:
        """Return the registry rows that are not dead of ``hostname`` or ``worker_id``."""
        rows = self._run("worker_heartbeats", hostname=hostname, worker_id=worker_id).dicts()
        return [WorkerHeartbeat(**row) for row in rows]

    # ------------------------------------------------------------------ paused queues
    # sql/flow.sql: pause and resume; claim_batch (sql/lease.sql) skips paused queues.
    def pause_queue(self, queue: str, *, paused_by: str, reason: str) -> PausedQueue:
        """Pause ``queue`` (from the next claim round on); return its pause.

        A queue already paused keeps its first pause, returned with ``created`` False.
        Runs in the connection's current transaction: the pause holds once it commits.
        """
        rows = self._run("pause_queue", queue=queue, paused_by=paused_by, reason=reason).dicts()
        if not rows:  # a concurrent pause committed after this statement's snapshot
            return self.pause_queue(queue, paused_by=paused_by, reason=reason)
        return PausedQueue(**rows[0])

    def resume_queue(self, queue: str) -> PausedQueue | None:
        """Resume ``queue`` and wake its workers; return the pause removed (None: none)."""
        rows = self._run("resume_queue", queue=queue, channel=conf.NOTIFY_CHANNEL).rows
        if not rows:
            return None
        name, paused_at, paused_by, reason, _notified = rows[0]
        return PausedQueue(name, paused_at, paused_by, reason, created=False)

    def paused_queues(self) -> dict[str, PausedQueue]:
        """Return every paused queue, by name."""
        return {
            row["queue"]: PausedQueue(**row, created=False)
            for row in self._run("paused_queues").dicts()
        }

    # ------------------------------------------------------------------ schedules
    # sql/schedules.sql: the workers' sync and firing, the Schedules admin page's actions.
    def lock_schedule_sync(self, *, timeout_seconds: float | None = None) -> None:
        """Wait for the schedule sync lock; call inside a transaction (released at COMMIT).

        With ``timeout_seconds``, every lock wait of the rest of the transaction is bounded
        by it: past it the statement fails with ``LockNotAvailable``.
        """
        if timeout_seconds is not None:
            self._run(
                "limit_schedule_sync_wait",
                lock_timeout=f"{max(1, round(timeout_seconds * 1000))}ms",
            )
        self._run("lock_schedule_sync", lock_key=SCHEDULE_SYNC_LOCK_KEY)

    def database_now(self) -> datetime:
        """Return the database clock (``statement_timestamp()``)."""
        now: datetime = self._run("schedule_clock").rows[0][0]
        return now

    def upsert_schedule(self, definition: ScheduleDefinition, *, next_fire_at: datetime) -> str:
        """Write one declared schedule; return ``"added"``, ``"changed"`` or ``""``.

        ``next_fire_at`` applies to a new schedule or one whose timing changed.
        """
        values = {name: getattr(definition, name) for name in definition.__dataclass_fields__}
        values["schedule_name"] = values.pop("name")
        values["args"] = json.dumps(definition.args)
        values["kwargs"] = json.dumps(definition.kwargs)
        rows = self._run("upsert_schedule", next_fire_at=next_fire_at, **values).rows
        if not rows:
            return ""
        return "added" if rows[0][1] else "changed"

    def delete_undeclared_schedules(self, declared: Sequence[str]) -> list[str]:
        """Delete the schedules not in ``declared``; return their names."""
        rows = self._run("delete_undeclared_schedules", names=list(declared)).rows
        return sorted(row[0] for row in rows)

    def due_schedules(self, *, limit: int = 100) -> list[DueSchedule]:
        """Return up to ``limit`` active schedules, the earliest next fire first."""
        return [DueSchedule(**row) for row in self._run("due_schedules", limit=limit).dicts()]

    def fire_schedule(
        self,
        schedule: DueSchedule,
        *,
        keys: Sequence[str],
        last_fire_at: datetime | None,
        next_fire_at: datetime,
    ) -> FireResult:
        """Advance ``schedule`` past its due fire times and insert a job per key.

        Applies only if the row still has the ``next_fire_at`` and timing it was read
        with, and is not paused; one statement, so one short transaction in autocommit.
        """
        row = self._run(
            "fire_schedule",
            schedule_name=schedule.name,
            expected_next_fire_at=schedule.next_fire_at,
            timing=schedule.timing,
            next_fire_at=next_fire_at,
            last_fire_at=last_fire_at,
            keys=list(keys),
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        ).rows[0]
        return FireResult(advanced=bool(row[0]), inserted=int(row[1]))

    def pause_schedules(self, names: Sequence[str]) -> list[str]:
        """Pause the active schedules among ``names``; return those it paused."""
        return sorted(row[0] for row in self._run("pause_schedules", names=list(names)).rows)

    def paused_schedules(self, names: Sequence[str]) -> list[PausedSchedule]:
        """Return the paused schedules among ``names``."""
        rows = self._run("paused_schedules", names=list(names)).dicts()
        return [PausedSchedule(**row) for row in rows]

    def resume_schedule(self, schedule: PausedSchedule, *, next_fire_at: datetime) -> bool:
        """Resume ``schedule`` if still paused with the same timing; return whether it did."""
        rows = self._run(
            "resume_schedule",
            schedule_name=schedule.name,
            timing=schedule.timing,
            next_fire_at=next_fire_at,
        ).rows
        return bool(rows)

    def run_schedules_now(self, keys: Mapping[str, str]) -> dict[str, int]:
        """Insert one job now for each schedule name of ``keys`` (name -> idempotency key).

        Returns the new job id per name; a name whose schedule is gone, or whose key is
        already taken (a resubmitted confirmation), is missing.
        """
        names = list(keys)
        rows = self._run(
            "run_schedule_now",
            names=names,
            keys=[keys[name] for name in names],
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        ).rows
        by_key = {row[1]: row[0] for row in rows}
        return {name: by_key[key] for name, key in keys.items() if key in by_key}

    def jobs_by_keys(self, keys: Sequence[str]) -> dict[str, tuple[int, str]]:
        """Return ``(job id, status)`` of the jobs holding ``keys``, by key."""
        rows = self._run("jobs_by_keys", keys=list(keys)).rows
        return {row[0]: (row[1], row[2]) for row in rows}

    # ------------------------------------------------------------------ schema (catalog)
    # sql/schema.sql: the migrations' index helper, system check W002 and the lag page.
    def index_validity(self, table_name: str, index_name: str) -> bool | None:
        """Return whether ``index_name`` on ``table_name`` is valid; None if it is missing."""
        rows = self._run("index_validity", table_name=table_name, index_name=index_name).rows
        return bool(rows[0][0]) if rows else None

    def invalid_indexes(self, table_names: Sequence[str]) -> list[InvalidIndex]:
        """Return the INVALID indexes on ``table_names`` (missing tables are ignored)."""
        rows = self._run("invalid_indexes", table_names=list(table_names)).dicts()
        return [InvalidIndex(**row) for row in rows]


def _inserted_rows(result: Result) -> list[tuple[int, datetime, datetime, str | None]]:
    """Return ``(id, created_at, available_at, idempotency_key)`` per job a bulk insert wrote.

    The statements answer with one row of arrays (see ``enqueue_many`` in enqueue.sql),
    leaving out the available times and keys when they say nothing new.
    """
    ids, created_at, available_at, keys, _notified = result.rows[0]
    if ids is None:
        return []
    count = len(ids)
    if available_at is None:
        available_at = [created_at] * count
    if keys is None:
        keys = [None] * count
    # strict: arrays of different lengths raise rather than pair the wrong jobs.
    return list(zip(ids, [created_at] * count, available_at, keys, strict=True))


def _loads_json(text: str) -> Any:
    """``json.loads``, with the empty array and object most jobs carry decoded for free.

    A claim decodes three documents per job (arguments, keyword arguments, the workers
    of earlier attempts); for a job with none of them that was a tenth of a worker's
    time. Fresh containers each time: a task may change what it is given.
    """
    if text == "[]":
        return []
    if text == "{}":
        return {}
    return json.loads(text)


def _leases_document(leases: Sequence[Lease]) -> str:
    return "[" + ",".join(f"[{lease.job_id},{lease.lease_generation}]" for lease in leases) + "]"


def _unique_ids(job_ids: Iterable[int]) -> list[int]:
    ids = []
    for job_id in job_ids:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise InvalidOption("job_ids", f"must be integers, not {job_id!r}")
        if not JOB_ID_MIN <= job_id <= JOB_ID_MAX:
            # Checked here: PostgreSQL would refuse the array and abort the transaction.
            raise InvalidOption("job_ids", f"{job_id} is outside the range of job ids (bigint)")
        ids.append(job_id)
    return sorted(set(ids))


def _operator_result(requested: list[int], done: Iterable[int]) -> OperatorResult:
    done_set = set(done)
    return OperatorResult(
        done=tuple(sorted(done_set)),
        skipped=tuple(job_id for job_id in requested if job_id not in done_set),
    )


# ---------------------------------------------------------------------- Job.objects
class JobManager(models.Manager["Job"]):
    """``Job.objects``: read jobs with the ORM, change them only through these methods."""

    def store(self, using: str | None = None) -> QueueStore:
        """Return a :class:`QueueStore` on the Django connection for ``using``.

        Raises :class:`~django_pgqueue.exceptions.NotPostgreSQL` if that database is not
        PostgreSQL (its statements would fail with a syntax error naming nothing).
        """
        alias = using or self.db
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            raise NotPostgreSQL(alias, vendor, f"DATABASES[{alias!r}]['ENGINE']")
        return QueueStore(DjangoRunner(alias))

    def enqueue(
        self,
        task_path: str,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int | None = None,
        available_at: datetime | None = None,
        idempotency_key: str | None = None,
        partition_key: str | None = None,
        coalesce_key: str | None = None,
        debounce: timedelta | float | None = None,
        after: Sequence[Any] = (),
        on_blocker_failure: str = BlockerFailure.CANCEL,
        using: str | None = None,
    ) -> Job:
        """Enqueue one job in the current transaction; see :meth:`QueueStore.enqueue`.

        ``after``: jobs (ids, jobs or task results) it runs after; it is stored
        ``blocked`` until they have all succeeded.
        """
        spec = JobSpec(
            task_path=task_path,
            queue=queue,
            args=args,
            kwargs=kwargs or {},
            priority=priority,
            max_attempts=max_attempts,
            available_at=available_at,
            idempotency_key=idempotency_key,
            partition_key=partition_key,
            coalesce_key=coalesce_key,
            debounce=debounce,
            after=tuple(after),
            on_blocker_failure=on_blocker_failure,
        )
        return self.store(using).enqueue(spec).job

    def enqueue_many(self, specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
        """Enqueue many jobs with one statement; see :meth:`QueueStore.enqueue_many`."""
        return [outcome.job for outcome in self.store(using).enqueue_many(specs)]

    def retry(
        self,
        job_ids: Iterable[int],
        *,
        revive_dependents: bool = False,
        using: str | None = None,
    ) -> OperatorResult:
        """Revive dead-lettered or cancelled jobs (and, if asked, what they cancelled)."""
        return self.store(using).retry(job_ids, revive_dependents=revive_dependents)

    def run_now(self, job_ids: Iterable[int], *, using: str | None = None) -> OperatorResult:
        """Make scheduled pending jobs ready now."""
        return self.store(using).run_now(job_ids)

    def cancel(
        self, job_ids: Iterable[int], *, reason: str | None = None, using: str | None = None
    ) -> OperatorResult:
        """Cancel pending and running jobs; see :meth:`QueueStore.cancel`."""
        return self.store(using).cancel(job_ids, reason=reason)

    def discard(self, job_ids: Iterable[int], *, using: str | None = None) -> OperatorResult:
        """Delete finished jobs."""
        return self.store(using).discard(job_ids)

    def requeue_expired(
        self, job_ids: Iterable[int], *, using: str | None = None
    ) -> OperatorResult:
        """Recover jobs whose lease expired, now rather than at the next housekeeping."""
        return self.store(using).requeue_expired(job_ids)

    def reap_expired(self, *, limit: int = 1000, using: str | None = None) -> list[ReapedJob]:
        """Recover jobs whose lease expired (housekeeping does this on its own)."""
        return self.store(using).reap_expired(limit=limit)
