"""Waiting for a job to finish without polling: :func:`wait` and :func:`await_result`.

The waiter LISTENs on ``django_pgqueue_finished`` on a connection of its own, then flags
the job ``awaited`` (statement ``mark_awaited``); the settling trigger of migration 0009
NOTIFYs that channel, with the job id, when an awaited job finishes. Only awaited jobs
(and jobs with dependents) ever run that trigger, so plain jobs pay nothing.

The notification is a hint: the waiter re-reads the job on every wake-up, at its
timeout, and at least every :data:`REREAD_SECONDS`, so a lost notification costs one
re-read, never a wrong answer. A LISTEN connection that dies (a restart,
``pg_terminate_backend``) is replaced, and the job re-read, before waiting on.
The flag is set with SKIP LOCKED: while a handler's open transaction holds the row (an
atomic task), the waiter re-reads on a short backoff instead of queueing behind it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from django_pgqueue.compat import TaskResult, task_backends
from django_pgqueue.exceptions import JobNotFound
from django_pgqueue.store.pgconn import connect
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner

__all__ = ["FINISHED_CHANNEL", "REREAD_SECONDS", "WaitTimeout", "await_result", "wait"]

#: NOTIFY channel of the settling trigger (payload: the job id). Fixed in migration 0009.
FINISHED_CHANNEL = "django_pgqueue_finished"
#: Longest time between two re-reads, whatever the notifications say.
REREAD_SECONDS = 5.0
_FINISHED = frozenset({"succeeded", "dead_letter", "cancelled"})
_LOCKED_BACKOFF = (0.01, 0.5)


class WaitTimeout(TimeoutError):
    """The job had not finished when the wait's timeout passed."""

    def __init__(self, job_id: int, timeout: float, status: str) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} is still {status} after {timeout:g}s")


def _target(result: TaskResult | int | str, backend: str | None) -> tuple[int, str]:  # type: ignore[type-arg]
    if isinstance(result, TaskResult):
        return int(result.id), backend or result.backend
    return int(result), backend or "default"


def wait(
    result: TaskResult | int | str,  # type: ignore[type-arg]
    *,
    timeout: float,
    backend: str | None = None,
) -> TaskResult:  # type: ignore[type-arg]
    """Block until the job finishes; return its refreshed ``TaskResult``.

    ``result`` is what ``enqueue()`` returned, or a job id (then ``backend`` names the
    ``TASKS`` alias, "default" if omitted). Finished means succeeded, dead-lettered or
    cancelled. Raises :class:`WaitTimeout` after ``timeout`` seconds and
    :class:`~django_pgqueue.exceptions.JobNotFound` if the job does not exist.
    """
    job_id, alias = _target(result, backend)
    task_backend = task_backends[alias]
    database = getattr(task_backend, "database", "default")
    deadline = time.monotonic() + timeout
    waiter = _Waiter(database, job_id)
    try:
        status = waiter.run(deadline)
    finally:
        waiter.close()
    if status not in _FINISHED:
        raise WaitTimeout(job_id, timeout, status)
    refreshed: TaskResult = task_backend.get_result(str(job_id))  # type: ignore[type-arg]
    return refreshed


async def await_result(
    result: TaskResult | int | str,  # type: ignore[type-arg]
    *,
    timeout: float,
    backend: str | None = None,
) -> TaskResult:  # type: ignore[type-arg]
    """The async twin of :func:`wait` (the LISTEN runs in a worker thread)."""
    return await asyncio.to_thread(_wait_closing, result, timeout, backend)


def _wait_closing(result: Any, timeout: float, backend: str | None) -> TaskResult:  # type: ignore[type-arg]
    from django.db import connections

    try:
        return wait(result, timeout=timeout, backend=backend)
    finally:
        # The executor's thread may never run Django code again: do not leave its
        # connections to the garbage collector.
        connections.close_all()


class _Waiter:
    """One LISTEN connection, replaced when it dies."""

    def __init__(self, database: str, job_id: int) -> None:
        self.database = database
        self.job_id = job_id
        self.connection: psycopg.Connection[Any] | None = None
        self.awaited = False

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _connect(self) -> psycopg.Connection[Any]:
        self.close()
        connection = connect(self.database, application_name="pgqueue-wait", prepare=False)
        # LISTEN before flagging and reading: a NOTIFY sent after the read is not missed.
        connection.execute(f"LISTEN {FINISHED_CHANNEL}")
        self.connection = connection
        return connection

    def _read(self) -> str:
        """Flag the job awaited (if not yet) and return its status."""
        assert self.connection is not None
        found = QueueStore(PsycopgRunner(self.connection, self.database)).mark_awaited(self.job_id)
        if found is None:
            raise JobNotFound(str(self.job_id))
        status, self.awaited = found
        return status.value

    def run(self, deadline: float) -> str:
        backoff = _LOCKED_BACKOFF[0]
        status = "pending"
        while True:
            try:
                if self.connection is None or self.connection.closed:
                    self._connect()
                status = self._read()
                if status in _FINISHED:
                    return status
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return status
                if self.awaited:
                    pause = min(remaining, REREAD_SECONDS)
                else:
                    # The row is locked by another transaction: re-read soon.
                    pause = min(remaining, backoff)
                    backoff = min(backoff * 2, _LOCKED_BACKOFF[1])
                self._sleep(pause)
            except psycopg.OperationalError:
                # The LISTEN connection died: a new one, then a re-read (the NOTIFY may
                # have been sent while nobody listened).
                self.close()
                if time.monotonic() >= deadline:
                    return status
                time.sleep(0.05)

    def _sleep(self, seconds: float) -> None:
        """Return at our job's notification or after ``seconds``."""
        assert self.connection is not None
        payload = str(self.job_id)
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            for notify in self.connection.notifies(timeout=left, stop_after=1):
                if notify.payload == payload:
                    return
