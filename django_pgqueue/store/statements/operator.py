"""Operators.

``operator.sql``: retry, run now, cancel, discard, requeue; patient with locked rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from django_pgqueue.conf import conf
from django_pgqueue.store.notices import flow_channel, lease_channel
from django_pgqueue.store.payload import check_text
from django_pgqueue.store.statements.base import (
    CANCEL_PATIENCE,
    OPERATOR_CHUNK,
    operator_result,
    unique_ids,
)
from django_pgqueue.store.statements.dependencies import DependencyStatements
from django_pgqueue.store.statements.maintenance import MaintenanceStatements
from django_pgqueue.store.values import OperatorResult


class OperatorStatements(DependencyStatements, MaintenanceStatements):
    """Operators statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

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
        ids = unique_ids(job_ids)
        with self.runner.atomic():
            result = self._operate_patiently(
                "retry_jobs",
                ids,
                # Finished jobs are in the history: back to the job table first, in this
                # transaction (with the dependents to revive), on every try.
                prepare=lambda chunk: self._run(
                    "bring_back", job_ids=chunk, with_dependents=revive_dependents
                ),
                channel=conf.NOTIFY_CHANNEL,
                flow_channel=flow_channel(),
            )
            if revive_dependents and result.done:
                self.revive_dependents(result.done)
        return result

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
        ids = unique_ids(job_ids)
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
        prepare: Callable[[list[int]], object] | None = None,
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
                chunk = waiting[start : start + OPERATOR_CHUNK]

                def attempt(chunk: list[int] = chunk) -> list[tuple[Any, ...]]:
                    if prepare is not None:
                        prepare(chunk)
                    return self._run(name, job_ids=chunk, **params).rows

                rows = self._retrying_moves(attempt)
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
        result = operator_result(ids, done)
        return OperatorResult(result.done, result.skipped, tuple(sorted(busy)))

    def discard(self, job_ids: Iterable[int]) -> OperatorResult:
        """Delete finished jobs; pending and running ones are skipped."""
        return self._operate("discard_jobs", job_ids)

    def requeue_expired(self, job_ids: Iterable[int]) -> OperatorResult:
        """Recover the given jobs now if their lease has expired; others are skipped."""
        ids = unique_ids(job_ids)
        done: list[int] = []
        for start in range(0, len(ids), OPERATOR_CHUNK):
            chunk = ids[start : start + OPERATOR_CHUNK]
            done.extend(job.job_id for job in self.reap_expired(limit=len(chunk), job_ids=chunk))
        return operator_result(ids, done)

    def _operate(self, name: str, job_ids: Iterable[int], **params: Any) -> OperatorResult:
        ids = unique_ids(job_ids)
        done: list[int] = []
        for start in range(0, len(ids), OPERATOR_CHUNK):
            chunk = ids[start : start + OPERATOR_CHUNK]
            rows = self._run_retrying_moves(name, job_ids=chunk, **params).rows
            done.extend(row[0] for row in rows)
        return operator_result(ids, done)
