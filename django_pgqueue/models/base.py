"""What every queue model shares: no "comments unsupported" warnings, and a BRIN index."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage
from django.db import models

#: Django's warnings that a database keeps no comments on tables and columns.
#: Comments on columns and tables, and (HistoryClass) a NULLS NOT DISTINCT constraint:
#: what PostgreSQL has and other databases do not.
COMMENT_WARNINGS = frozenset({"fields.W163", "models.W046", "models.W047"})


def no_comment_warnings[M: models.Model](model: type[M]) -> type[M]:
    """Leave Django's "comments unsupported" warnings out of ``model``'s checks.

    The queue needs PostgreSQL, which keeps every comment. Where a model would live in
    another database (SQLite, say), its 37 commented columns and tables would each add a
    warning and bury the one error that says what is wrong: E001, "needs PostgreSQL".
    """

    def check(cls: type[models.Model], /, **kwargs: Any) -> list[CheckMessage]:
        messages: list[CheckMessage] = super(model, cls).check(**kwargs)  # type: ignore[misc]
        return [message for message in messages if message.id not in COMMENT_WARNINGS]

    setattr(model, "check", classmethod(check))  # noqa: B010 - a method, set once
    return model


class BrinIndex(models.Index):
    """A BRIN index, without requiring ``django.contrib.postgres`` in INSTALLED_APPS."""

    suffix = "brin"

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        """Return the CREATE INDEX statement with ``USING brin``."""
        return super().create_sql(model, schema_editor, using=" USING brin", **kwargs)
