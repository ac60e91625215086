"""Every name the docs tell users to import stays importable from where the docs say.

The package's modules moved into layers (docs/explanation/architecture.md); the import
paths the README, the docs and the example project show did not. This reads them all
(``from django_pgqueue... import ...`` lines, cross-references such as
``{class}`~django_pgqueue.exceptions.UnknownQueue```, ``autoclass::`` directives, and
dotted paths in quotes such as a ``TASKS`` backend) and imports each.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
SOURCES = [
    REPO / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
    *sorted((REPO / "example_project").rglob("*.py")),
]
_FROM_IMPORT = re.compile(
    r"^\s*(?:>>> |\.\.\. )?from (django_pgqueue(?:\.\w+)*) import \(?([\w, ]+)\)?", re.M
)
_DOTTED = re.compile(
    r"(?:[`~]|autoclass:: |autofunction:: |autodata:: |[\"'])(django_pgqueue(?:\.\w+)+)"
)


#: Dotted names in the docs that are not import paths: system check ids, loggers, and the
#: PostgreSQL setting an admin schedule's delete sets (migration 0018's trigger reads it).
_NOT_PATHS = re.compile(r"^django_pgqueue\.([EW]\d{3}|jobs|schedules|delete_admin_schedule)$")


_AUTOMODULE = re.compile(r"automodule:: (django_pgqueue(?:\.\w+)*)\n\s+:members: ([\w, ]+)")


def _documented() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for source in SOURCES:
        text = source.read_text()
        for module, names in _AUTOMODULE.findall(text):
            found.update((module, name.strip()) for name in names.split(",") if name.strip())
        for module, names in _FROM_IMPORT.findall(text):
            for imported in names.split(","):
                name = imported.strip().split(" as ")[0]
                if name:
                    found.add((module, name))
        found.update(
            ("", dotted) for dotted in _DOTTED.findall(text) if not _NOT_PATHS.match(dotted)
        )
    return found


DOCUMENTED = sorted(_documented())


def test_the_docs_name_many_import_paths():
    # The reader below must keep finding them (a change of syntax would empty the list).
    modules = {module or path.rpartition(".")[0] for module, path in DOCUMENTED}
    assert len(DOCUMENTED) > 40
    assert {"django_pgqueue.models", "django_pgqueue.manager", "django_pgqueue.waiting"} <= modules


@pytest.mark.parametrize(("module", "name"), DOCUMENTED)
def test_a_documented_name_is_importable(module, name):
    if module:
        assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"
        return
    # A dotted path: a module, or a module's attribute (a class, its method, a setting...).
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            assert hasattr(target, attribute), f"{name}: no {attribute} on {target!r}"
            target = getattr(target, attribute)
        return
    pytest.fail(f"{name} is not importable")


def test_the_public_paths_give_the_objects_of_the_modules_they_stand_for():
    from django_pgqueue import backend, manager, periodic, waiting, workflows
    from django_pgqueue.features import periodic as periodic_home
    from django_pgqueue.features import waiting as waiting_home
    from django_pgqueue.features import workflows as workflows_home
    from django_pgqueue.store import values
    from django_pgqueue.tasks import backend as backend_home

    assert backend.PgQueueBackend is backend_home.PgQueueBackend
    assert manager.JobSpec is values.JobSpec
    assert periodic.periodic is periodic_home.periodic
    assert waiting.wait is waiting_home.wait
    assert workflows.chain is workflows_home.chain
    assert manager.JobSpec("tests.tasks.noop").queue == "default"
