"""Load the named SQL blocks from the ``*.sql`` files next to this module.

A block starts with ``-- name: <identifier>``, followed by comment lines describing it,
then the statement. Parameters are psycopg named placeholders (``%(name)s``); nothing is
ever interpolated into the text. Status values are literals on purpose: PostgreSQL only
uses a partial index when it can prove the query's WHERE clause implies the index
predicate, which it cannot do for a bound parameter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Final

__all__ = ["QUERIES", "Query", "parse"]

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$")
_PARAM = re.compile(r"%\(([a-z_][a-z0-9_]*)\)s")


@dataclass(frozen=True, slots=True)
class Query:
    """One named SQL statement."""

    name: str
    description: str
    text: str
    source: str

    @property
    def parameters(self) -> frozenset[str]:
        """Return the names of the statement's placeholders."""
        return frozenset(_PARAM.findall(self.text))


def parse(text: str, source: str) -> dict[str, Query]:
    """Split ``text`` into its named blocks."""
    queries: dict[str, Query] = {}
    name: str | None = None
    description: list[str] = []
    body: list[str] = []

    def flush() -> None:
        if name is None:
            return
        statement = "\n".join(body).strip().rstrip(";").strip()
        if not statement:
            raise ValueError(f"{source}: query {name!r} has no statement")
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        queries[name] = Query(name, " ".join(description).strip(), statement, source)

    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            flush()
            name, description, body = match.group(1), [], []
        elif name is not None and not body and line.startswith("--"):
            description.append(line[2:].strip())
        elif name is not None:
            body.append(line)
    flush()
    return queries


def _load_all() -> dict[str, Query]:
    loaded: dict[str, Query] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda item: item.name):
        if not entry.name.endswith(".sql"):
            continue
        for query in parse(entry.read_text(encoding="utf-8"), entry.name).values():
            if query.name in loaded:
                raise ValueError(f"query {query.name!r} is defined in two files")
            loaded[query.name] = query
    return loaded


#: Every named query of the package, loaded once at import.
QUERIES: Final = MappingProxyType(_load_all())
