"""Concurrent index builds that survive an interruption, and the queue's INVALID indexes.

A ``CREATE INDEX CONCURRENTLY`` or ``REINDEX ... CONCURRENTLY`` that fails or is cancelled
(a ``statement_timeout``, ``pg_cancel_backend``, a lost connection) leaves its index in
the catalog marked INVALID: every write still maintains it, no query can use it, and a
re-run with ``IF NOT EXISTS`` sees the name and skips it. :class:`EnsureIndexConcurrently`
is how our migrations build an index concurrently, so that running ``migrate`` again
repairs such a leftover. :func:`index_problems` finds INVALID indexes on the queue's
tables, whoever left them, with the one command that repairs each (system check W002 and
the admin's lag page show them).

This module is not in ``migrations/`` because Django's loader takes every module there
for a migration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import RenameIndex, SeparateDatabaseAndState
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

from django_pgqueue.exceptions import InvalidIndexStatement
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.reports import InvalidIndex
from django_pgqueue.store.runners import DjangoRunner
from django_pgqueue.store.tables import queue_tables

if TYPE_CHECKING:
    from django.db.backends.postgresql.schema import DatabaseSchemaEditor

__all__ = [
    "APP_LABEL",
    "EnsureIndexConcurrently",
    "IndexProblem",
    "RemoveIndexConcurrentlyExactly",
    "index_problems",
    "queue_tables",
]

APP_LABEL = "django_pgqueue"

_CREATE = (
    r"\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r'(?:"{name}"|{name})\s+ON\s'
)
# REINDEX CONCURRENTLY builds a copy named <index>_ccnew[N], swaps it in, and drops the
# original, renamed <index>_ccold[N]: an interruption leaves one of them INVALID.
_REINDEX_COPY = re.compile(r"_ccnew[0-9]*$")
_REINDEX_ORIGINAL = re.compile(r"_ccold[0-9]*$")


def _check_builds(name: str, sql: str) -> None:
    """Raise InvalidIndexStatement unless ``sql`` builds the index ``name`` concurrently."""
    if not re.match(_CREATE.format(name=re.escape(name)), sql, re.IGNORECASE):
        raise InvalidIndexStatement(name, sql)


def _with_statement(kwargs: dict[str, Any], sql: str | None, comment: str | None) -> dict[str, Any]:
    """Return ``kwargs`` with the ``sql`` and ``comment`` an operation was given, if any."""
    if sql is not None:
        kwargs["sql"] = sql
    if comment is not None:
        kwargs["comment"] = comment
    return kwargs


class EnsureIndexConcurrently(AddIndexConcurrently):
    """Add ``index`` with CREATE INDEX CONCURRENTLY; running it again repairs a failed build.

    On the database, an index of that name on the model's table is left alone if it is
    valid, dropped concurrently and built again if it is INVALID (an earlier build failed
    or was cancelled), and built if it is missing. The model state gets ``index`` as with
    ``AddIndex``; reversing drops it concurrently.

    ``sql`` replaces Django's statement when the index needs what
    :class:`~django.db.models.Index` cannot say (a BRIN ``pages_per_range``); it must be
    ``CREATE [UNIQUE] INDEX CONCURRENTLY "<index.name>" ON ...``, else
    :class:`~django_pgqueue.exceptions.InvalidIndexStatement` is raised. ``comment`` is set
    with COMMENT ON INDEX, for DBAs. Locks: the builds' and drops' SHARE UPDATE EXCLUSIVE
    on the table only, so enqueues and workers carry on. The migration must set
    ``atomic = False``.
    """

    def __init__(
        self,
        model_name: str,
        index: models.Index,
        *,
        sql: str | None = None,
        comment: str | None = None,
    ) -> None:
        super().__init__(model_name, index)
        if sql is not None:
            _check_builds(index.name, sql)
        self.sql = sql
        self.comment = comment

    def describe(self) -> str:
        """Return the line ``migrate --plan`` prints."""
        return (
            f"Concurrently create index {self.index.name} on model {self.model_name}, "
            "rebuilding it if an earlier build left it invalid"
        )

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        """Return what rebuilds this operation, ``sql`` and ``comment`` included."""
        name, args, kwargs = super().deconstruct()
        return name, args, _with_statement(kwargs, self.sql, self.comment)

    def reduce(self, operation: Operation, app_label: str) -> bool | list[Operation]:
        """Never fold a rename into this operation: ``sql`` names the index."""
        if isinstance(operation, RenameIndex) and operation.old_name == self.index.name:
            return False
        result: bool | list[Operation] = super().reduce(operation, app_label)
        return result

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        """Build the index unless a valid one of that name exists; replace an INVALID one."""
        self._ensure_not_in_transaction(schema_editor)
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        valid: bool | None = None
        if not schema_editor.collect_sql:  # sqlmigrate prints the build as on a new table
            store = QueueStore(DjangoRunner(schema_editor.connection.alias))
            valid = store.index_validity(model._meta.db_table, self.index.name)
        postgresql_editor = cast("DatabaseSchemaEditor", schema_editor)
        if valid is False:
            postgresql_editor.remove_index(model, self.index, concurrently=True)
        if not valid:
            if self.sql is None:
                postgresql_editor.add_index(model, self.index, concurrently=True)
            else:
                schema_editor.execute(self.sql, params=None)
        if self.comment is not None:
            # Set even on a valid index: an interruption may have come between the two.
            name = schema_editor.quote_name(self.index.name)
            value = schema_editor.quote_value(self.comment)
            schema_editor.execute(f"COMMENT ON INDEX {name} IS {value}", params=None)


class RemoveIndexConcurrentlyExactly(RemoveIndexConcurrently):
    """Drop an index with DROP INDEX CONCURRENTLY; reversing rebuilds it as it was.

    Django's reverse builds the index from the model state, which cannot say everything
    (a BRIN index's ``pages_per_range``); this one runs ``sql`` instead, through
    :class:`EnsureIndexConcurrently` (so an interrupted rebuild is repaired by running
    the migration again), and restores ``comment``.
    """

    def __init__(self, model_name: str, name: str, *, sql: str, comment: str | None = None) -> None:
        super().__init__(model_name, name)
        _check_builds(name, sql)  # now, not when someone first migrates backwards
        self.sql = sql
        self.comment = comment

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        """Return what rebuilds this operation, ``sql`` and ``comment`` included."""
        name, args, kwargs = super().deconstruct()
        return name, args, _with_statement(kwargs, self.sql, self.comment)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        """Rebuild the dropped index with ``sql``, concurrently."""
        index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
        rebuild = EnsureIndexConcurrently(
            self.model_name, index, sql=self.sql, comment=self.comment
        )
        rebuild.database_forwards(app_label, schema_editor, from_state, to_state)


@dataclass(frozen=True, slots=True)
class IndexProblem:
    """An INVALID index on a queue table, what left it there, and what repairs it."""

    index: InvalidIndex
    #: What left it INVALID, in a sentence for an operator.
    cause: str
    #: The one command that repairs it: a shell command or an SQL statement.
    repair: str

    @property
    def building(self) -> bool:
        """Return whether a concurrent build is under way on the table (maybe this one)."""
        return self.index.building_pid is not None


def index_problems(using: str = DEFAULT_DB_ALIAS) -> list[IndexProblem]:
    """Return the INVALID indexes on the queue's tables in ``using``, each with its repair.

    Reads the catalog (and, only if it finds one, the applied migrations); takes no lock.
    Raises :class:`django.db.Error` if the database cannot be reached.
    """
    invalid = QueueStore(DjangoRunner(using)).invalid_indexes(queue_tables())
    if not invalid:
        return []
    pending = _pending_index_names(using)
    return [_diagnose(index, using, pending) for index in invalid]


def _diagnose(index: InvalidIndex, using: str, pending: set[str]) -> IndexProblem:
    quote = connections[using].ops.quote_name
    target = f"{quote(index.schema_name)}.{quote(index.index_name)}"
    if _REINDEX_COPY.search(index.index_name):
        return IndexProblem(
            index,
            "the unfinished copy of an interrupted REINDEX CONCURRENTLY; "
            "the original index is still in use",
            f"DROP INDEX CONCURRENTLY IF EXISTS {target};",
        )
    if _REINDEX_ORIGINAL.search(index.index_name):
        return IndexProblem(
            index,
            "the old index of a REINDEX CONCURRENTLY interrupted after the swap; "
            "the rebuilt index is in use",
            f"DROP INDEX CONCURRENTLY IF EXISTS {target};",
        )
    if index.index_name in pending:
        database = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
        return IndexProblem(
            index,
            f"an interrupted build of a {APP_LABEL} migration not applied yet",
            f"python manage.py migrate {APP_LABEL}{database}",
        )
    return IndexProblem(
        index,
        "an interrupted CREATE INDEX CONCURRENTLY or REINDEX CONCURRENTLY",
        f"REINDEX INDEX CONCURRENTLY {target};",
    )


def _pending_index_names(using: str) -> set[str]:
    """Return the indexes our unapplied migrations build (and would rebuild) concurrently."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[using], ignore_no_migrations=True)
    applied = loader.applied_migrations or {}
    return {
        operation.index.name
        for key, migration in loader.disk_migrations.items()
        if key[0] == APP_LABEL and key not in applied
        for operation in _flatten(migration.operations)
        if isinstance(operation, EnsureIndexConcurrently)
    }


def _flatten(operations: Iterable[Operation]) -> Iterator[Operation]:
    for operation in operations:
        if isinstance(operation, SeparateDatabaseAndState):
            yield from _flatten(operation.database_operations)
        else:
            yield operation
