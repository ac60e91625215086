"""The catalog: ``schema.sql`` (index validity). Read-only."""

from __future__ import annotations

from collections.abc import Sequence

from django_pgqueue.store.reports import InvalidIndex
from django_pgqueue.store.statements.base import StoreBase


class SchemaStatements(StoreBase):
    """The catalog statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    # sql/schema.sql: the migrations' index helper, system check W002 and the lag page.
    def index_validity(self, table_name: str, index_name: str) -> bool | None:
        """Return whether ``index_name`` on ``table_name`` is valid; None if it is missing."""
        rows = self._run("index_validity", table_name=table_name, index_name=index_name).rows
        return bool(rows[0][0]) if rows else None

    def invalid_indexes(self, table_names: Sequence[str]) -> list[InvalidIndex]:
        """Return the INVALID indexes on ``table_names`` (missing tables are ignored)."""
        rows = self._run("invalid_indexes", table_names=list(table_names)).dicts()
        return [InvalidIndex(**row) for row in rows]
