"""Where handlers run: a fixed pool of threads for sync tasks, an event loop for async ones."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from queue import SimpleQueue
from typing import Any

from django.db import close_old_connections, connections

from django_pgqueue.worker.execution import Outcome, OutcomeKind
from django_pgqueue.worker.failures import cancelled_failure, failure_from
from django_pgqueue.worker.flight import InFlight, Start
from django_pgqueue.worker.logfields import job_extra

__all__ = ["AsyncRunner", "ThreadPool"]

logger = logging.getLogger("django_pgqueue.worker")

Sink = Callable[[Outcome], None]
#: A batched task's leader returns one outcome per job of its batch.
Outcomes = Outcome | list[Outcome]


def _expired_before_start(flight: InFlight) -> Outcome:
    """Give back a job whose lease may have run out while it waited to start.

    The process was paused or starved for longer than a lease: another worker may hold
    the job by now. The release is fenced (it applies only if the lease is still this
    one) and refunds the attempt, which never started.
    """
    logger.warning(
        "job %s: not started, its lease may have expired while it waited (the process "
        "was paused or starved); giving it back",
        flight.job.id,
    )
    return Outcome(
        flight, OutcomeKind.RELEASE, reason="its lease may have expired before it started"
    )


class ThreadPool:
    """``size`` threads taking jobs from one queue; each outcome goes to ``sink``.

    A job abandoned while it waited (its lease was released at shutdown or lost) is
    skipped without running. Threads are daemons: a handler stuck past the grace period
    does not keep the process alive.
    """

    def __init__(self, size: int, run: Callable[[InFlight], Outcomes], sink: Sink) -> None:
        self._run = run
        self._sink = sink
        self._queue: SimpleQueue[InFlight | None] = SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"pgqueue-job-{index}", daemon=True)
            for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, flight: InFlight) -> None:
        """Queue ``flight`` for the next free thread."""
        self._queue.put(flight)

    def shutdown(self) -> None:
        """Ask every thread to exit once its current job is done (does not wait)."""
        for _ in self._threads:
            self._queue.put(None)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the threads to exit."""
        for thread in self._threads:
            thread.join(timeout)

    def _work(self) -> None:
        try:
            while (flight := self._queue.get()) is not None:
                start = flight.start()
                if start is not Start.RUN:
                    if start is Start.GONE:
                        self._sink(Outcome(flight, OutcomeKind.LOST))
                    elif start is Start.EXPIRED:
                        self._sink(_expired_before_start(flight))
                    continue
                try:
                    outcome = self._run(flight)
                except BaseException as error:
                    logger.exception(
                        "job %s: the runner itself failed",
                        flight.job.id,
                        extra=job_extra(flight.job),
                    )
                    outcome = Outcome(flight, OutcomeKind.FAILED, failure=failure_from(error))
                if isinstance(outcome, list):
                    for each in outcome:
                        self._sink(each)
                else:
                    self._sink(outcome)
                if self._queue.empty():
                    close_old_connections()  # the end of a burst of work, as after a request
        finally:
            connections.close_all()


class AsyncRunner:
    """An event loop in its own thread, started on first use, running coroutine tasks."""

    def __init__(
        self, run: Callable[[InFlight], Coroutine[Any, Any, Outcomes]], sink: Sink
    ) -> None:
        self._run = run
        self._sink = sink
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._lock = threading.Lock()

    def submit(self, flight: InFlight) -> None:
        """Start ``flight``'s coroutine on the loop."""
        self.submit_many([flight])

    def submit_many(self, flights: list[InFlight]) -> None:
        """Start the coroutines of ``flights`` on the loop, with one wake-up of the loop.

        Each wake-up of the loop from another thread is a write to its self-pipe: one
        per claimed batch, not one per job.
        """
        if flights:
            self._ensure_loop().call_soon_threadsafe(self._start_many, flights)

    def cancel(self, flight: InFlight) -> None:
        """Cancel ``flight``'s coroutine if it is running.

        Never a batch's: cancelling one job must not stop its mates. The batch runs on,
        and the cancelled job's outcome is recorded as cancelled (as for a sync handler).
        """
        if self._loop is None or (flight.entry is not None and flight.entry.batch_size):
            return
        self._loop.call_soon_threadsafe(self._cancel, flight.key)

    def shutdown(self) -> None:
        """Stop the loop (running coroutines are cancelled)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(2)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                ready = threading.Event()

                def serve() -> None:
                    loop = asyncio.new_event_loop()
                    asyncio.set_event_loop(loop)
                    self._loop = loop
                    ready.set()
                    try:
                        loop.run_forever()
                    finally:
                        for task in asyncio.all_tasks(loop):
                            task.cancel()
                        loop.close()
                        connections.close_all()

                self._thread = threading.Thread(target=serve, name="pgqueue-async", daemon=True)
                self._thread.start()
                ready.wait()
            assert self._loop is not None
            return self._loop

    def _start_many(self, flights: list[InFlight]) -> None:
        for flight in flights:
            self._tasks[flight.key] = asyncio.ensure_future(self._guarded(flight))

    def _cancel(self, key: tuple[int, int]) -> None:
        task = self._tasks.get(key)
        if task is not None:
            task.cancel()

    async def _guarded(self, flight: InFlight) -> None:
        outcome: Outcomes
        try:
            start = flight.start()
            if start is Start.BATCHED:
                return
            if start is Start.GONE:
                outcome = Outcome(flight, OutcomeKind.LOST)
            elif start is Start.EXPIRED:
                outcome = _expired_before_start(flight)
            else:
                outcome = await self._run(flight)
        except asyncio.CancelledError:
            if flight.cancel_requested and not flight.abandoned:
                # An operator's cancel: the job keeps its lease until this is recorded.
                stopped = cancelled_failure("its coroutine was cancelled")
                outcome = Outcome(flight, OutcomeKind.FAILED, failure=stopped)
            else:
                outcome = Outcome(flight, OutcomeKind.LOST)
        except BaseException as error:
            logger.exception(
                "job %s: the async runner itself failed",
                flight.job.id,
                extra=job_extra(flight.job),
            )
            outcome = Outcome(flight, OutcomeKind.FAILED, failure=failure_from(error))
        finally:
            self._tasks.pop(flight.key, None)
        if isinstance(outcome, list):
            for each in outcome:
                self._sink(each)
        else:
            self._sink(outcome)
