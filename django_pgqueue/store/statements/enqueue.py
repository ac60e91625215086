"""Producers.

``enqueue.sql`` (single, bulk, idempotent, coalesced enqueues) and the links of ``after=``
(``dependencies.sql``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from django_pgqueue.conf import conf
from django_pgqueue.exceptions import UnknownDependency
from django_pgqueue.states import JobStatus
from django_pgqueue.store.coalescing import check_coalescing
from django_pgqueue.store.intake import (
    EnqueueDefaults,
    check_blocker_databases,
    dependent_status,
    jobs_document,
    validated,
    validated_calls,
    validated_many,
)
from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.statements.base import StoreBase, inserted_rows
from django_pgqueue.store.values import Enqueued, JobSnapshot, JobSpec


class EnqueueStatements(StoreBase):
    """Producers statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

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
        # The key is taken: read its holder, in either tier, in a new snapshot (one that
        # committed while the insert waited for it is in it).
        assert spec.idempotency_key is not None
        existing = self._by_idempotency_keys([spec.idempotency_key])
        if spec.idempotency_key in existing:
            return Enqueued(existing[spec.idempotency_key], False, self.runner.alias)
        # The holder was deleted in between (pruned or discarded): the key is free again.
        return self.enqueue(spec)

    def _enqueue_coalesced(self, spec: JobSpec, params: dict[str, Any]) -> Enqueued:
        key, seconds = check_coalescing(spec.coalesce_key, spec.debounce, spec.idempotency_key)
        unkeyed = {k: v for k, v in params.items() if k != "idempotency_key"}
        (row,) = self._run(
            "enqueue_coalesced",
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
            coalesce_key=key,
            debounce_seconds=seconds,
            **unkeyed,
        ).dicts()
        return Enqueued(JobSnapshot.from_row(row), bool(row["created"]), self.runner.alias)

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
        rows = inserted_rows(
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
        rows = inserted_rows(
            self._run(
                "enqueue_many",
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
        rows = self._run_retrying_moves("lock_blockers", blocker_ids=blocker_ids).rows
        statuses = {row[0]: JobStatus(row[1]) for row in rows}
        missing = [job_id for job_id in blocker_ids if job_id not in statuses]
        if missing:
            # One that moved to the history while the statement ran is in neither of its
            # snapshots; the next statement's snapshot sees it there.
            rows = self._run_retrying_moves("lock_blockers", blocker_ids=blocker_ids).rows
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
