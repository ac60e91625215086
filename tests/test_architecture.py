"""The package's shape: layers that import only downwards, no import cycle, small modules.

Read from the source with ``ast``, so the check needs no import and sees deferred
(function-local) imports too; imports under ``if TYPE_CHECKING:`` are annotations only and
do not count. docs/explanation/architecture.md explains the layers.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parent.parent / "django_pgqueue"
NAME = "django_pgqueue"

#: Lowest first. A module may import its own layer and those below, never one above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # The rules everything shares: settings, errors, Django series, bounds, states.
    ("base", ("", "conf", "exceptions", "compat", "limits", "states")),
    ("store", ("store",)),
    ("models", ("models",)),
    ("tasks", ("tasks",)),
    ("features", ("features",)),
    ("worker", ("worker",)),
    ("metrics", ("metrics",)),
    (
        "face",
        (
            *("admin", "management", "tools", "checks", "apps"),
            # The documented import paths (PUBLIC_PATHS): re-exports for users.
            *("backend", "context", "embedded", "manager", "periodic", "schema", "waiting"),
            "workflows",
        ),
    ),
)
#: Documented import paths kept for users and migrations: nothing in the package imports them.
PUBLIC_PATHS = frozenset(
    f"{NAME}.{name}"
    for name in (
        "backend",
        "context",
        "embedded",
        "manager",
        "periodic",
        "schema",
        "waiting",
        "workflows",
    )
)
#: Function-local imports of the package's own modules, besides the models (which need the
#: app registry), and why each must stay deferred.
DEFERRED_ALLOWED = {
    # ``import django_pgqueue`` happens in settings modules: the task decorator and the
    # pausing functions (which need settings) and BatchJob load on first use.
    (NAME, f"{NAME}.tasks.decorators"),
    (NAME, f"{NAME}.tasks.batches"),
    (NAME, f"{NAME}.features.pausing"),
    # Django's documented place to register system checks: AppConfig.ready().
    (f"{NAME}.apps", f"{NAME}.checks"),
    # ... and to connect signals: the post_migrate refresh of the SQL enqueue settings.
    (f"{NAME}.apps", f"{NAME}.tasks.sqlsync"),
    # prometheus_client is an optional extra: loaded only for --metrics-port.
    (f"{NAME}.management.commands.runqueueworker", f"{NAME}.metrics.multiproc"),
    (f"{NAME}.management.commands.runqueueworker", f"{NAME}.metrics.worker"),
}
MAX_LINES = 600


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, bool] = field(default_factory=dict)  # target -> deferred


def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "migrations" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for module in found.values():
        _read_imports(module, found)
    return found


def _read_imports(module: Module, known: dict[str, Module]) -> None:
    annotations_only = {
        id(node)
        for block in ast.walk(module.tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    top_level = {id(node) for node in module.tree.body}
    for node in ast.walk(module.tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module.name}: relative import (use {NAME}.<module>)"
            base = node.module or ""
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [target if target in known else base for target in targets]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for imported in targets:
            target = imported
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module.name:
                deferred = id(node) not in top_level
                module.imports[target] = module.imports.get(target, True) and deferred


def _layer(name: str) -> int:
    rest = name.removeprefix(NAME).removeprefix(".")
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(rest == p or (p and rest.startswith(p + ".")) for p in prefixes):
            return index
    raise AssertionError(f"{name} is in no layer: add it to LAYERS (and architecture.md)")


MODULES = _modules()


def test_every_module_is_in_a_layer():
    for name in MODULES:
        _layer(name)


def test_layers_import_only_downwards():
    upward = [
        f"{module.name} ({LAYERS[_layer(module.name)][0]}) imports {target} "
        f"({LAYERS[_layer(target)][0]})"
        for module in MODULES.values()
        for target in module.imports
        if (module.name, target) not in DEFERRED_ALLOWED and _layer(target) > _layer(module.name)
    ]
    assert upward == []


def test_nothing_in_the_package_imports_a_public_path():
    users = [
        f"{module.name} imports {target}"
        for module in MODULES.values()
        for target in module.imports
        if target in PUBLIC_PATHS
    ]
    assert users == [], "import the module the code lives in; these paths are for users"


def test_deferred_imports_are_only_the_models_and_the_listed_reasons():
    deferred = [
        f"{module.name} imports {target} inside a function"
        for module in MODULES.values()
        for target, is_deferred in module.imports.items()
        if is_deferred
        and target.startswith(NAME)
        and not target.startswith(f"{NAME}.models")
        and (module.name, target) not in DEFERRED_ALLOWED
    ]
    assert deferred == []


def test_the_import_graph_has_no_cycle_counting_deferred_imports():
    graph = {name: sorted(module.imports) for name, module in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    # The check above can fail: a deferred import closing a loop is a cycle.
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_no_module_is_over_600_lines_and_each_says_its_job():
    too_long = {
        module.name: length
        for module in MODULES.values()
        if (length := len(module.path.read_text().splitlines())) > MAX_LINES
    }
    assert too_long == {}
    undocumented = [m.name for m in MODULES.values() if not ast.get_docstring(m.tree)]
    assert undocumented == [], "each module's docstring says its one job"


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
