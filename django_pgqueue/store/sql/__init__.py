"""Load the named SQL blocks from the ``*.sql`` files next to this module.

A block starts with ``-- name: <identifier>``, followed by comment lines describing it,
then the statement. Parameters are psycopg named placeholders (``%(name)s``); nothing is
ever interpolated into the text. Status values are literals on purpose: PostgreSQL only
uses a partial index when it can prove the query's WHERE clause implies the index
predicate, which it cannot do for a bound parameter.

A block may also declare ``-- variant: <identifier> without <section>``: a second
statement, the same text minus every stretch of lines between ``-- begin <section>``
and ``-- end <section>`` (one source for two statements that must not drift apart).
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
_VARIANT = re.compile(r"^variant: ([a-z_][a-z0-9_]*) without ([a-z_]+)$")
_SECTION = re.compile(r"^\s*-- (begin|end) ([a-z_]+)\s*$")


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

    def add(query_name: str, about: str, lines: list[str]) -> None:
        statement = "\n".join(lines).strip().rstrip(";").strip()
        if not statement:
            raise ValueError(f"{source}: query {query_name!r} has no statement")
        if query_name in queries:
            raise ValueError(f"{source}: query {query_name!r} is defined twice")
        queries[query_name] = Query(query_name, about, statement, source)

    def flush() -> None:
        if name is None:
            return
        variants = [_VARIANT.match(line) for line in description]
        about = " ".join(line for line, v in zip(description, variants, strict=True) if not v)
        add(name, about.strip(), body)
        for variant in filter(None, variants):
            variant_name, section = variant.groups()
            add(variant_name, f"{name} without its {section} sections.", _without(body, section))

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


def _without(lines: list[str], section: str) -> list[str]:
    """Return ``lines`` minus the stretches between ``-- begin/end <section>``."""
    kept: list[str] = []
    inside = False
    found = False
    for line in lines:
        marker = _SECTION.match(line)
        if marker and marker.group(2) == section:
            opening = marker.group(1) == "begin"
            if opening == inside:
                raise ValueError(f"unbalanced '-- {marker.group(1)} {section}'")
            inside, found = opening, True
        elif not inside:
            kept.append(line)
    if inside or not found:
        raise ValueError(f"section {section!r} is {'not closed' if inside else 'missing'}")
    return kept


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
