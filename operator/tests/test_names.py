"""Each name the operator shares with the cluster is declared once: label, annotation and
resource keys, Triton metric names and event reasons are module constants, and no other
module, product or sandbox, writes one out again as a string literal (docstrings may)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llmfleet"
SANDBOX = PACKAGE.parent / "llmfleet_sandbox"
# Module constants with these suffixes declare a name: a label, annotation or resource key, a
# metric name.
NAME_SUFFIXES = ("_LABEL", "_ANNOTATION", "_RESOURCE", "_HISTOGRAM", "_GAUGE", "_COUNTER")
REASONS_MODULE = PACKAGE / "api" / "conditions.py"
CAMEL_CASE = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
EVENT_FACTORIES = ("normal", "warning")


def _sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *SANDBOX.rglob("*.py")])


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _string_constants(node: ast.AST):
    """(name, value) of each `NAME = "literal"` directly in a module or class body."""
    for statement in node.body:
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)):
            yield statement.targets[0].id, statement.value.value


def _declarations() -> dict[str, list[str]]:
    """Each declared name -> where it is declared (`path:CONSTANT`)."""
    declared = defaultdict(list)
    for path in _sources():
        for constant, value in _string_constants(_tree(path)):
            if constant.endswith(NAME_SUFFIXES):
                declared[value].append(f"{path.relative_to(PACKAGE.parent)}:{constant}")
    return declared


def _reasons() -> set[str]:
    reason_class = next(node for node in _tree(REASONS_MODULE).body
                        if isinstance(node, ast.ClassDef) and node.name == "Reason")
    return {value for _, value in _string_constants(reason_class)}


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants of the module, its classes and functions."""
    owners = [tree, *(node for node in ast.walk(tree)
                      if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))]
    return {id(owner.body[0].value) for owner in owners
            if owner.body and isinstance(owner.body[0], ast.Expr) and isinstance(owner.body[0].value, ast.Constant)}


def _literals(path: Path):
    """(line, value) of each string literal in a module but its docstrings and the right-hand
    sides of its own declarations."""
    tree = _tree(path)
    skipped = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.targets and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id.endswith(NAME_SUFFIXES):
            skipped.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            yield node.lineno, node.value


def test_each_name_is_declared_once():
    twice = {value: places for value, places in _declarations().items() if len(places) > 1}
    assert not twice, f"declared more than once (import the one constant instead): {twice}"


def test_declared_names_are_not_written_out_again():
    declared = _declarations()
    offences = [f"{path.relative_to(PACKAGE.parent)}:{line} writes {value!r}, declared as {declared[value][0]}"
                for path in _sources() for line, value in _literals(path) if value in declared]
    assert not offences, "\n".join(offences)


def _is_message(node: ast.expr) -> bool:
    """Not a bare word: what sits beside a reason in a (reason, message) pair."""
    return not (isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value)


def _reasons_written(path: Path):
    """(line, value) of each CamelCase literal where a reason goes: an event's reason, a
    `reason=` or `..._reason=` argument, the first of a (reason, message) pair."""
    for node in ast.walk(_tree(path)):
        candidates = []
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Attribute) and function.attr in EVENT_FACTORIES and node.args:
                candidates.append(node.args[0])
            if isinstance(function, ast.Name) and function.id == "Event" and len(node.args) > 1:
                candidates.append(node.args[1])
            candidates += [keyword.value for keyword in node.keywords
                           if keyword.arg and (keyword.arg == "reason" or keyword.arg.endswith("_reason"))]
            candidates += [value for argument in node.args if isinstance(argument, ast.IfExp)
                           for value in (argument.body, argument.orelse)]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and _is_message(node.elts[1]):
            candidates.append(node.elts[0])
        for candidate in candidates:
            values = [candidate.body, candidate.orelse] if isinstance(candidate, ast.IfExp) else [candidate]
            for value in values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str) \
                        and CAMEL_CASE.fullmatch(value.value):
                    yield value.lineno, value.value


def test_event_reasons_come_from_the_reason_catalogue():
    reasons = _reasons()
    offences = [f"{path.relative_to(PACKAGE.parent)}:{line} writes the reason {value!r}: use Reason"
                for path in _sources() if path != REASONS_MODULE
                for line, value in _literals(path) if value in reasons]
    offences += [f"{path.relative_to(PACKAGE.parent)}:{line} writes the reason {value!r} outside Reason"
                 for path in sorted(PACKAGE.rglob("*.py")) if path != REASONS_MODULE
                 for line, value in _reasons_written(path) if value not in reasons]
    assert not offences, "\n".join(offences)
