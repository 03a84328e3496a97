"""Layering rules, checked on the source: pure layers do no I/O, only k8s/ talks
to the Kubernetes API from the operator, only metrics/ to Prometheus; the product imports
neither the sandbox nor the development package, and the sandbox's modules import no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llmfleet"
SANDBOX = PACKAGE.parent / "llmfleet_sandbox"
# What the operator image must not need: it ships the product package alone.
NOT_SHIPPED = {"llmfleet_sandbox", "llmfleet_dev"}
PURE_PACKAGES = ("api", "catalog", "planner", "render", "autoscale", "rollout", "simulation")
IO_MODULES = {"kopf", "kubernetes", "prometheus_api_client", "requests", "urllib", "http",
              "socket", "subprocess", "tritonclient", "aiohttp", "asyncio", "threading"}
# Reading the clock in a pure layer hides time from tests: time comes in as an argument.
CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("time", "time"), ("time", "monotonic"),
               ("date", "today")}
# Outside the pure layers, who may import which client library.
ALLOWED_IMPORTERS = {
    "kubernetes": ("k8s",),
    "kopf": ("handlers.py", "cli"),
    "prometheus_api_client": ("metrics",),
    "tritonclient": ("inference", "loadgen"),
}


def _modules(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0], node.lineno


def _clock_calls(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else (
                owner.attr if isinstance(owner, ast.Attribute) else None)
            if (owner_name, node.func.attr) in CLOCK_CALLS:
                yield f"{owner_name}.{node.func.attr}()", node.lineno


def _sources(package: str):
    root = PACKAGE / package
    return sorted(root.rglob("*.py")) if root.is_dir() else []


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_layers_import_no_io(package):
    offences = [f"{path.relative_to(PACKAGE)}:{line} imports {module}"
                for path in _sources(package) for module, line in _modules(path)
                if module in IO_MODULES]
    assert offences == []


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_layers_do_not_read_the_clock(package):
    offences = [f"{path.relative_to(PACKAGE)}:{line} calls {call}"
                for path in _sources(package) for call, line in _clock_calls(path)]
    assert offences == []


def test_client_libraries_only_where_allowed():
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        for module, line in _modules(path):
            allowed = ALLOWED_IMPORTERS.get(module)
            if allowed is not None and relative.parts[0] not in allowed:
                offences.append(f"{relative}:{line} imports {module}")
    assert offences == []


def test_the_product_imports_neither_the_sandbox_nor_the_development_package():
    offences = [f"{path.relative_to(PACKAGE)}:{line} imports {module}"
                for path in sorted(PACKAGE.rglob("*.py")) for module, line in _modules(path)
                if module in NOT_SHIPPED]
    assert offences == []


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, name: str, known: set[str]):
    """The modules of `known` that the module `name` at path imports, anywhere in its body
    (TYPE_CHECKING blocks too: a cycle there is a cycle in the design)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(part for part in (base, node.module) if part)
            # `from package import module` imports the module; `from module import name` the module.
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        yield from (target for target in targets if target in known and target != name)


def _import_graph(root: Path) -> dict[str, set[str]]:
    paths = {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    return {name: set(_imported_modules(path, name, set(paths))) for name, path in paths.items()}


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None."""
    finished: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str] | None:
        if name in trail:
            return trail[trail.index(name):] + [name]
        if name in finished:
            return None
        for imported in sorted(graph[name]):
            if (cycle := visit(imported, trail + [name])) is not None:
                return cycle
        finished.add(name)
        return None

    return next((cycle for name in sorted(graph) if (cycle := visit(name, [])) is not None), None)


def test_the_sandbox_modules_import_no_cycle():
    cycle = _a_cycle(_import_graph(SANDBOX))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import kubernetes\nfrom datetime import datetime\nx = datetime.now()\n")
    assert ("kubernetes", 1) in list(_modules(bad))
    assert list(_clock_calls(bad)) == [("datetime.now()", 3)]


def test_the_cycle_search_sees_a_cycle(tmp_path):
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import inner\n")
    (package / "inner" / "b.py").write_text("def f():\n    from ..a import x\n")
    (package / "inner" / "c.py").write_text("from pkg.inner import b\n")
    (package / "inner" / "__init__.py").write_text("from . import c\n")
    assert _a_cycle(_import_graph(package)) == ["pkg.a", "pkg.inner", "pkg.inner.c", "pkg.inner.b", "pkg.a"]
    (package / "inner" / "b.py").write_text("")
    assert _a_cycle(_import_graph(package)) is None
