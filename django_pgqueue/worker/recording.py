"""The recorder: outcomes written in batches, each fenced by its lease, off the claim path."""

from __future__ import annotations

import json
import logging
import time
from queue import Empty
from typing import Any

import psycopg

from django_pgqueue.exceptions import JobTimeout, LeaseLost, SnoozeLimitReached
from django_pgqueue.states import JobStatus
from django_pgqueue.store.reports import QueueCounts
from django_pgqueue.store.storable import storable_failure, storable_text
from django_pgqueue.store.values import ClaimedJob, Failure
from django_pgqueue.worker import observe
from django_pgqueue.worker.connection import CONNECTION_ERRORS, TRANSIENT_ERRORS
from django_pgqueue.worker.execution import Outcome, OutcomeKind
from django_pgqueue.worker.logfields import job_extra
from django_pgqueue.worker.state import WorkerState

__all__ = ["OutcomeRecorder"]

logger = logging.getLogger("django_pgqueue.worker")
job_logger = logging.getLogger("django_pgqueue.jobs")

#: Outcomes of an attempt that never started are no run of the job (see ``_finish``).
_NOT_RUN = frozenset({OutcomeKind.LOST, OutcomeKind.RELEASE})
_SNOOZE_LIMIT_CLASS = f"{SnoozeLimitReached.__module__}.{SnoozeLimitReached.__qualname__}"


class OutcomeRecorder(WorkerState):
    """Writes finished attempts' outcomes, batched and lease-fenced, on its own connection."""

    def _record_forever(self) -> None:
        """The recorder thread: write outcomes as they arrive, in batches.

        Outcomes that arrive while a write is under way go in the next one, so the batch
        grows with the rate. An error that is not the database's (a bug) stops the
        worker as it would have in the dispatcher: the dispatcher re-raises it.
        """
        try:
            while not self._recorder_stop.is_set():
                first = None
                if not self._undelivered:
                    try:
                        first = self._outcomes.get(timeout=0.1)
                    except Empty:
                        continue
                # Finished attempts take no slot while they are written (see _loop): the
                # dispatcher may claim the next batch during this write.
                self._wake.set()
                with self._record_lock:
                    if first is not None:
                        self._undelivered.append(first)  # before those queued behind it
                    recorded = self._record_outcomes()
                self._wake.set()  # capacity came free: the dispatcher may claim
                if not recorded:
                    self._recorder_stop.wait(0.2)  # not written (see _record_outcomes): retry soon
        except BaseException as error:
            logger.exception("worker %s: the recorder failed", self.id)
            self._recorder_error = error
            self._wake.set()

    def _stop_recorder(self) -> None:
        """Stop the recorder thread after its current write; outcomes then wake the loop."""
        self._wake_on_deliver = True
        self._recorder_stop.set()
        if self._recorder is not None:
            # A write to a server that stopped answering ends at the connection's
            # timeouts; until then, _record_lock keeps the dispatcher's writes apart.
            self._recorder.join(self.options.grace_seconds)

    def _record_outcomes(self) -> bool:
        """Write every delivered outcome; return False if they must be written again.

        Recording never crashes the worker: an outcome the database refuses is written
        on its own, made storable, and as a last resort recorded as a failure of that
        job alone (see _write_one). Call with ``_record_lock`` held.
        """
        outcomes = self._undelivered
        self._undelivered = []
        while True:
            try:
                outcomes.append(self._outcomes.get_nowait())
            except Empty:
                break
        if not outcomes:
            return True
        self._adaptive.finished(
            len(outcomes), run_times=[outcome.duration / outcome.shared_by for outcome in outcomes]
        )
        for outcome in outcomes:
            self._settle_timeout(outcome)
        self._write_started = time.monotonic()
        try:
            self._recorder_slot.run(lambda store: self._write_outcomes(store, outcomes))
        except TRANSIENT_ERRORS + CONNECTION_ERRORS as error:
            # A deadlock victim or a lock timeout keeps its connection (ConnectionSlot);
            # either way the unwritten outcomes go again after a short pause.
            logger.warning("recording %d outcomes failed (%s); will retry", len(outcomes), error)
            self._undelivered = [outcome for outcome in outcomes if not outcome.written]
            return False
        finally:
            self._write_started = None
        return True

    def _settle_timeout(self, outcome: Outcome) -> None:
        """Turn the late outcome of a handler that outlived its timeout into JobTimeout."""
        flight = outcome.flight
        if not flight.overdue or flight.abandoned:
            return
        if outcome.kind not in (OutcomeKind.SUCCEEDED, OutcomeKind.FAILED, OutcomeKind.SNOOZED):
            return
        assert flight.entry is not None
        outcome.kind = OutcomeKind.FAILED
        outcome.failure = Failure(
            exception_class=f"{JobTimeout.__module__}.{JobTimeout.__qualname__}",
            message=f"{flight.job.task_path} ran longer than its timeout of "
            f"{flight.entry.timeout}s (it returned after {outcome.duration:.1f}s; its "
            "result was discarded)",
        )

    def _write_outcomes(self, store: Any, outcomes: list[Outcome]) -> None:
        pending = [o for o in outcomes if not o.written]
        successes = [
            o for o in pending if o.kind is OutcomeKind.SUCCEEDED and not o.flight.abandoned
        ]
        if successes:
            try:
                done = store.complete_many_outcomes(
                    self.id, [(o.flight.job.lease, o.result_json) for o in successes]
                )
            except CONNECTION_ERRORS + TRANSIENT_ERRORS:
                raise
            except psycopg.Error as error:
                # One result the database refuses must not fail the others: write each
                # on its own (below).
                logger.warning("recording %d results together failed (%s)", len(successes), error)
            else:
                for outcome in successes:
                    self._finish(outcome, _completion_label(done.get(outcome.flight.job.id)))
        for outcome in pending:
            if outcome.written:
                continue
            self._write_one(store, outcome)

    def _write_one(self, store: Any, outcome: Outcome) -> None:
        flight = outcome.flight
        try:
            if outcome.kind is OutcomeKind.COMMITTED:
                # The atomic task completed the job in its own transaction: that is what
                # the database recorded, whatever happened to the lease since.
                self._finish(outcome, "succeeded")
            elif flight.abandoned or outcome.kind is OutcomeKind.LOST:
                self._finish(outcome, "abandoned" if flight.abandoned else "lease lost")
            elif outcome.kind is OutcomeKind.SUCCEEDED:
                self._complete_one(store, outcome)
            elif outcome.kind is OutcomeKind.FAILED:
                self._fail_one(store, outcome)
            elif outcome.kind is OutcomeKind.RELEASE:
                try:
                    store.release_if_leased(
                        flight.job.lease,
                        delay_seconds=outcome.delay,
                        reason=storable_text(outcome.reason or "", 10_000) or None,
                        reason_class=outcome.reason_class,
                        unknown_since=outcome.unknown_since,
                    )
                    label = "cancelled" if flight.cancel_requested else "released"
                except LeaseLost:
                    label = "release refused (lease lost)"
                self._finish(outcome, label)
            elif outcome.kind is OutcomeKind.SNOOZED:
                self._snooze_one(store, outcome)
        except CONNECTION_ERRORS + TRANSIENT_ERRORS:
            raise
        except psycopg.Error:
            logger.exception(
                "job %s: its outcome could not be recorded; its lease will expire and it "
                "will be retried",
                flight.job.id,
                extra=job_extra(flight.job),
            )
            self._finish(outcome, "not recorded")

    def _complete_one(self, store: Any, outcome: Outcome) -> None:
        lease = outcome.flight.job.lease
        try:
            done = store.complete_many_outcomes(self.id, [(lease, outcome.result_json)])
        except CONNECTION_ERRORS + TRANSIENT_ERRORS:
            raise
        except psycopg.Error as error:
            # The work is done: a retry would do it twice. Keep the success, not the value.
            logger.warning(
                "job %s: its result could not be stored (%s); recording the success with a "
                "note instead of the result",
                lease.job_id,
                type(error).__name__,
                extra=job_extra(outcome.flight.job),
            )
            note = json.dumps(
                {
                    "django_pgqueue": "result not stored",
                    "reason": storable_text(str(error).splitlines()[0] if str(error) else "", 500),
                }
            )
            done = store.complete_many_outcomes(self.id, [(lease, note)])
        self._finish(outcome, _completion_label(done.get(lease.job_id)))

    def _snooze_one(self, store: Any, outcome: Outcome) -> None:
        flight = outcome.flight
        assert flight.entry is not None
        try:
            snoozed = store.snooze_if_leased(
                flight.job.lease,
                delay_seconds=outcome.delay,
                max_snoozes=flight.entry.max_snoozes,
            )
        except LeaseLost:
            self._finish(outcome, "snooze refused (lease lost)")
            return
        if snoozed.status is JobStatus.DEAD_LETTER:
            outcome.failure = Failure(
                exception_class=_SNOOZE_LIMIT_CLASS,
                message=f"asked to snooze again after {snoozed.snoozes} snoozes "
                f"(max_snoozes={flight.entry.max_snoozes})",
                permanent=True,
            )
            self._finish(outcome, "dead-lettered")
            return
        label = _FAILURE_LABELS.get(snoozed.status, "snoozed")
        self._finish(outcome, label)

    def _fail_one(self, store: Any, outcome: Outcome) -> None:
        assert outcome.failure is not None
        lease = outcome.flight.job.lease
        failure = storable_failure(outcome.failure)
        outcome.failure = failure
        try:
            try:
                result = store.fail_if_leased(lease, failure, self._retry_policy)
            except CONNECTION_ERRORS + TRANSIENT_ERRORS:
                raise
            except psycopg.Error as error:
                logger.warning(
                    "job %s: its failure could not be stored as raised (%s); recording a "
                    "plain failure",
                    lease.job_id,
                    type(error).__name__,
                    extra=job_extra(outcome.flight.job),
                )
                plain = Failure(
                    exception_class=storable_text(failure.exception_class, 255),
                    message="the error could not be stored "
                    f"({type(error).__name__}); see the worker's log",
                    permanent=failure.permanent,
                )
                result = store.fail_if_leased(lease, plain, self._retry_policy)
            label = _FAILURE_LABELS.get(result.status, "failed, will retry")
        except LeaseLost:
            label = "failed (lease lost)"
        self._finish(outcome, label)

    def _finish(self, outcome: Outcome, label: str) -> None:
        outcome.written = True
        flight = outcome.flight
        job = flight.job
        with self._flights_lock:
            # Only this attempt's entry: a newer attempt of the same job is left alone.
            if self._flights.get(flight.key) is flight:
                del self._flights[flight.key]
        # --max-jobs counts executed attempts: a job handed back unstarted (its task
        # unknown here, or at shutdown) or lost before it started ran nothing.
        if flight.started_at is not None or outcome.kind not in _NOT_RUN:
            self.processed += 1
        if job.partition_key is not None or job.concurrency_key is not None:
            # A partition turn or a slot came free: the next claim reads them.
            self._flow_open = True
        self._count(job.queue, label)
        self._tally.add(label)
        observe.current.job_finished(job, label, outcome.duration)
        failure = outcome.failure if label != "succeeded" else None
        if outcome.unknown_since is not None:
            # Its WARNING (once per job) said it all; a line per release would repeat it
            # every few seconds until the task is deployed.
            job_logger.debug("job %s %s: unknown task", job.id, label, extra=job_extra(job))
            return
        # A success is a DEBUG line (-v 2): the summary line counts them at -v 1 (see
        # tally.py). Anything else that ends an attempt is worth a line of its own.
        level = (
            logging.WARNING if failure else logging.DEBUG if label == "succeeded" else logging.INFO
        )
        if job_logger.isEnabledFor(level):
            message = "job %s %s: task=%s queue=%s attempt=%d/%d duration=%.3fs"
            args = (
                job.id,
                label,
                job.task_path,
                job.queue,
                job.attempts,
                job.max_attempts,
                outcome.duration,
            )
            if failure is None:
                job_logger.log(
                    level,
                    message,
                    *args,
                    extra=job_extra(job, outcome=label, duration=outcome.duration),
                )
            elif label == "dead-lettered" and failure.traceback:
                # The traceback once, where someone will look: retries get one line each.
                job_logger.error(
                    message + " error=%s: %s\n%s",
                    *args,
                    failure.exception_class,
                    failure.message,
                    failure.traceback.rstrip(),
                    extra=job_extra(job, outcome=label, duration=outcome.duration),
                )
            else:
                job_logger.warning(
                    message + " error=%s: %s",
                    *args,
                    failure.exception_class,
                    failure.message,
                    extra=job_extra(job, outcome=label, duration=outcome.duration),
                )

    # ------------------------------------------------------------------ statistics
    def _note_waits(self, claimed: list[ClaimedJob]) -> None:
        with self._counts_lock:
            for job in claimed:
                wait_ms = int((job.claimed_at - job.available_at).total_seconds() * 1000)
                counts = self._counts.setdefault(job.queue, [0, 0, 0, 0])
                counts[3] = max(counts[3], wait_ms)

    def _count(self, queue: str, label: str) -> None:
        with self._counts_lock:
            counts = self._counts.setdefault(queue, [0, 0, 0, 0])
            if label == "succeeded":
                counts[0] += 1
            elif label == "dead-lettered":
                counts[2] += 1
            elif label.startswith("failed"):
                counts[1] += 1

    def _take_counts(self) -> list[QueueCounts]:
        with self._counts_lock:
            taken, self._counts = self._counts, {}
        return [QueueCounts(queue, *values) for queue, values in taken.items() if any(values)]


_FAILURE_LABELS = {
    JobStatus.DEAD_LETTER: "dead-lettered",
    JobStatus.CANCELLED: "cancelled",
}


def _completion_label(status: JobStatus | None) -> str:
    """Return how a completion ended: succeeded, cancelled (while it ran), or lease lost."""
    if status is None:
        return "lease lost"
    return "cancelled" if status is JobStatus.CANCELLED else "succeeded"
