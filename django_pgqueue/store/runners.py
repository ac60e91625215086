"""How the store's statements reach PostgreSQL.

:class:`DjangoRunner` uses Django's connection, so enqueueing joins the caller's
transaction and shows up in Django's query logging; :class:`PsycopgRunner` uses a
worker's own psycopg connection, with server-side binding and prepared statements.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.db import connections, transaction
from psycopg.errors import FeatureNotSupported
from psycopg.pq import TransactionStatus

from django_pgqueue.store.sql import Query

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "DjangoRunner",
    "PsycopgRunner",
    "Result",
    "Runner",
    "load_json",
]


# The worker's connections are the ones that prepare statements.
logger = logging.getLogger("django_pgqueue.worker")

#: Where the server refuses a prepared statement whose result columns changed under it
#: ("cached plan must not change result type"): the function, since the message may be
#: translated and the SQLSTATE (feature not supported) says little.
_STALE_PLAN_SOURCE = "RevalidateCachedQuery"

# Columns whose values arrive as JSON text (Django's psycopg setup loads jsonb as text so
# JSONField can decode it; the worker's connections share that setup).
_JSON_COLUMNS = frozenset(
    {"args", "kwargs", "errors", "result", "prior_workers", "metadata", "queues"}
)


@dataclass(slots=True)
class Result:
    """Rows returned by one statement."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    rowcount: int

    def dicts(self) -> list[dict[str, Any]]:
        """Return the rows as dicts, JSON columns decoded."""
        json_positions = [i for i, name in enumerate(self.columns) if name in _JSON_COLUMNS]
        decoded = []
        for row in self.rows:
            values = dict(zip(self.columns, row, strict=True))
            for position in json_positions:
                name = self.columns[position]
                values[name] = load_json(values[name])
            decoded.append(values)
        return decoded


def load_json(value: Any) -> Any:
    """Decode a JSON column's value if it arrived as text (see ``_JSON_COLUMNS``)."""
    if isinstance(value, str | bytes):
        return json.loads(value)
    return value


class Runner(Protocol):
    """Executes one named statement on one connection."""

    @property
    def alias(self) -> str:
        """Return the Django database alias the connection belongs to."""
        ...

    def run(self, query: Query, params: Mapping[str, Any]) -> Result:
        """Execute ``query`` with ``params`` and return its rows."""
        ...

    def run_many(self, statements: Sequence[tuple[Query, Mapping[str, Any]]]) -> list[Result]:
        """Execute several statements in order (in one round trip where possible)."""
        ...

    def atomic(self) -> AbstractContextManager[None]:
        """Return a context that runs the statements inside it in one transaction.

        Inside a transaction already, a savepoint of it.
        """
        ...


class DjangoRunner:
    """Runs statements on Django's connection for ``alias``, inside any open transaction."""

    def __init__(self, alias: str) -> None:
        self._alias = alias

    @property
    def alias(self) -> str:
        """Return the Django database alias."""
        return self._alias

    def run(self, query: Query, params: Mapping[str, Any]) -> Result:
        """Execute ``query`` through a Django cursor (logged, wrapped, in the transaction)."""
        with connections[self._alias].cursor() as cursor:
            cursor.execute(query.text, params)
            description = cursor.description  # built anew on each access: read it once
            if description is None:
                return Result((), [], cursor.rowcount)
            columns = tuple(column.name for column in description)
            return Result(columns, cursor.fetchall(), cursor.rowcount)

    def run_many(self, statements: Sequence[tuple[Query, Mapping[str, Any]]]) -> list[Result]:
        """Execute ``statements`` one after the other (a round trip each)."""
        return [self.run(query, params) for query, params in statements]

    def atomic(self) -> AbstractContextManager[None]:
        """Return ``transaction.atomic`` for the connection (a savepoint inside one)."""
        return transaction.atomic(using=self._alias)


class PsycopgRunner:
    """Runs statements on a dedicated psycopg connection (a worker's own).

    Its statements are prepared after a few uses. A migration that adds a column to a
    table a statement returns whole (``RETURNING *``) makes the server refuse that
    prepared statement from then on ("cached plan must not change result type"), until
    the connection closes. The store's statements name their columns; should one not,
    the runner forgets the session's prepared statements when that happens and runs the
    statement again, prepared anew.
    """

    def __init__(self, connection: psycopg.Connection[Any], alias: str) -> None:
        self.connection = connection
        self._alias = alias
        #: A statement met a stale plan inside a transaction, where DEALLOCATE cannot
        #: run: the next statement outside one deallocates first.
        self._stale = False

    @property
    def alias(self) -> str:
        """Return the Django database alias the connection was opened for."""
        return self._alias

    def run(self, query: Query, params: Mapping[str, Any]) -> Result:
        """Execute ``query`` with server-side binding (prepared after a few uses)."""
        try:
            return self._run(query, params)
        except FeatureNotSupported as error:
            if not self._forget_plans(error):
                raise
        return self._run(query, params)

    def _run(self, query: Query, params: Mapping[str, Any]) -> Result:
        self._deallocate_if_stale()
        with self.connection.cursor() as cursor:
            cursor.execute(query.text, params)
            return _result(cursor)

    def run_many(self, statements: Sequence[tuple[Query, Mapping[str, Any]]]) -> list[Result]:
        """Execute ``statements`` in order, in one round trip (pipeline mode).

        Each sees what the ones before it did; in autocommit each commits on its own.
        After a stale plan they all run again, so each must be safe to repeat (the
        claim's fold, wake-up and claim are: the worker repeats them at every claim).
        """
        try:
            return self._run_many(statements)
        except FeatureNotSupported as error:
            if not self._forget_plans(error):
                raise
        return self._run_many(statements)

    def _run_many(self, statements: Sequence[tuple[Query, Mapping[str, Any]]]) -> list[Result]:
        self._deallocate_if_stale()
        with self.connection.pipeline():
            cursors = []
            for query, params in statements:
                cursor = self.connection.cursor()
                cursor.execute(query.text, params)
                cursors.append(cursor)
        try:
            return [_result(cursor) for cursor in cursors]
        finally:
            for cursor in cursors:
                cursor.close()

    def _forget_plans(self, error: FeatureNotSupported) -> bool:
        """After a stale plan, forget the session's prepared statements; return whether
        the statement can run again now (not inside a transaction, which it aborted)."""
        if error.diag.source_function != _STALE_PLAN_SOURCE:
            return False
        logger.info("a migration changed a prepared statement's result; preparing anew")
        self._stale = True
        if self.connection.info.transaction_status != TransactionStatus.IDLE:
            return False
        self._deallocate_if_stale()
        return True

    def _deallocate_if_stale(self) -> None:
        if self._stale and self.connection.info.transaction_status == TransactionStatus.IDLE:
            # Through execute, so that psycopg forgets its own record of them too.
            self.connection.execute("DEALLOCATE ALL")
            self._stale = False

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Run the statements inside in one transaction (a savepoint inside one)."""
        with self.connection.transaction():
            yield


def _result(cursor: psycopg.Cursor[Any]) -> Result:
    description = cursor.description  # built anew on each access: read it once
    if description is None:
        return Result((), [], cursor.rowcount)
    columns = tuple(column.name for column in description)
    return Result(columns, cursor.fetchall(), cursor.rowcount)
