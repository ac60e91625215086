"""A lazily (re)opened dedicated connection, shared safely between threads."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from django.db import utils as django_db_utils
from psycopg import pq

from django_pgqueue.store.pgconn import connect
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner

__all__ = ["CONNECTION_ERRORS", "TRANSIENT_ERRORS", "ConnectionSlot"]

logger = logging.getLogger("django_pgqueue.worker")

T = TypeVar("T")

#: Errors that mean "the connection is gone or unusable": server restart or crash,
#: pg_terminate_backend, network loss, or a session the server ended because it sat idle
#: in a transaction (a paused process: see worker/housekeeping.py; that FATAL error is an
#: InternalError by its SQLSTATE class). Anything else is a bug or a data problem.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.IdleInTransactionSessionTimeout,
    django_db_utils.OperationalError,
    django_db_utils.InterfaceError,
)


#: Errors after which the same statement may well succeed on the same connection: the
#: statement was chosen as a deadlock victim, hit a lock or statement timeout, or a
#: serialization failure. Retried; never a reason to stop a worker, nor to reconnect.
#: psycopg makes each of them an OperationalError, so a handler of these must come
#: before one of CONNECTION_ERRORS (tests/test_transient_errors.py checks every one).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
    psycopg.errors.QueryCanceled,
    psycopg.errors.SerializationFailure,
)


class ConnectionSlot:
    """One dedicated autocommit connection of a worker, reopened after it breaks."""

    def __init__(self, alias: str, name: str, *, claims: bool = False) -> None:
        self.alias = alias
        self.name = name
        #: Whether the connection sends claims (its session plans them safely: pgconn).
        self.claims = claims
        self._connection: psycopg.Connection[Any] | None = None
        self._store: QueueStore | None = None
        self._lock = threading.RLock()

    @property
    def store(self) -> QueueStore:
        """Return a store on the connection, opening it first if needed."""
        with self._lock:
            if self._store is None or self._connection is None or self._connection.closed:
                self._connection = connect(
                    self.alias, application_name=self.name, claims=self.claims
                )
                self._store = QueueStore(PsycopgRunner(self._connection, self.alias))
            return self._store

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """Return the open connection (opening it first if needed)."""
        with self._lock:
            self.store  # noqa: B018 - opens the connection
            assert self._connection is not None
            return self._connection

    def run(self, operation: Callable[[QueueStore], T]) -> T:
        """Run ``operation`` with the store; on a connection error, reset and re-raise.

        A transient error (a deadlock victim, a lock timeout) leaves the connection as
        it is: the session is fine, and reconnecting would only cost a new backend.
        """
        with self._lock:
            store = self.store
            try:
                return operation(store)
            except TRANSIENT_ERRORS:
                raise
            except CONNECTION_ERRORS:
                self.reset()
                raise

    def reset(self) -> None:
        """Close the connection; the next use opens a new one."""
        with self._lock:
            connection, self._connection, self._store = self._connection, None, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                logger.debug("closing broken connection %s failed", self.name, exc_info=True)

    close = reset

    def cancel_statement(self) -> bool:
        """Cancel the statement running on the connection now; return whether one was.

        Callable from any thread: it takes no lock, since the thread running the
        statement holds the slot's. The cancelled statement raises QueryCanceled there.
        """
        connection = self._connection
        if connection is None or connection.closed:
            return False
        if connection.pgconn.transaction_status != pq.TransactionStatus.ACTIVE:
            return False
        connection.cancel_safe(timeout=5.0)
        return True
