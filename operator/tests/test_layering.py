"""Layering rules, checked on the source: pure layers do no I/O, only k8s/ talks
to the Kubernetes API from the operator, only metrics/ to Prometheus."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "llmfleet"
PURE_PACKAGES = ("api", "catalog", "planner", "render", "autoscale", "rollout")
IO_MODULES = {"kopf", "kubernetes", "prometheus_api_client", "requests", "urllib", "http",
              "socket", "subprocess", "tritonclient", "aiohttp", "asyncio", "threading"}
# Reading the clock in a pure layer hides time from tests: time comes in as an argument.
CLOCK_CALLS = {("datetime", "now"), ("datetime", "utcnow"), ("time", "time"), ("time", "monotonic"),
               ("date", "today")}
# Outside the pure layers, who may import which client library.
ALLOWED_IMPORTERS = {
    "kubernetes": ("k8s",),
    "kopf": ("handlers.py", "cli.py"),
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


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import kubernetes\nfrom datetime import datetime\nx = datetime.now()\n")
    assert ("kubernetes", 1) in list(_modules(bad))
    assert list(_clock_calls(bad)) == [("datetime.now()", 3)]
