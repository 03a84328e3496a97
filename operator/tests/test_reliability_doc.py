"""docs/reliability.md cannot rot silently: every test it names exists, and every scenario row
names a test or says it is not covered.

Tests are named as `path::function` code spans, the path under e2e/ or operator/tests/; their
functions are read with `ast`, so the e2e modules are never imported or collected.
"""

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
TEST_FOLDERS = ("e2e/", "operator/tests/")
NOT_COVERED = "not covered"

CODE_SPAN = re.compile(r"`([^`]+)`")
TEST_REFERENCE = re.compile(r"(?P<path>[A-Za-z0-9_./-]+\.py)::(?P<function>[A-Za-z_][A-Za-z0-9_]*)")
TABLE_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")


def scenario_rows(text: str) -> list[tuple[int, str]]:
    """(line, row) of every table row but the headers and their separators."""
    lines = text.splitlines()
    rows = []
    for index, line in enumerate(lines):
        is_header = index + 1 < len(lines) and TABLE_SEPARATOR.match(lines[index + 1])
        if line.startswith("|") and not is_header and not TABLE_SEPARATOR.match(line):
            rows.append((index + 1, line))
    return rows


@cache
def defined_tests(path: Path) -> frozenset[str]:
    """The test functions a module defines, at its top level or in its classes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return frozenset(node.name for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"))


def reference_problem(span: str, root: Path) -> str | None:
    """Why a `path::function` code span names no existing test; None when it does."""
    reference = TEST_REFERENCE.fullmatch(span)
    if reference is None:
        return f"`{span}` is not `path::test_function` (parameters go outside the code span)"
    path, function = reference["path"], reference["function"]
    if not path.startswith(TEST_FOLDERS):
        return f"`{span}`: {path} is not under {' or '.join(TEST_FOLDERS)}"
    if not (root / path).is_file():
        return f"`{span}`: no file {path}"
    if function not in defined_tests(root / path):
        return f"`{span}`: no test function {function} in {path}"
    return None


def problems(text: str, root: Path = ROOT) -> list[str]:
    found = []
    for number, row in scenario_rows(text):
        references = [span for span in CODE_SPAN.findall(row) if "::" in span]
        if not references and NOT_COVERED not in row.lower():
            found.append(f"line {number}: names no test and does not say '{NOT_COVERED}': {row[:80]}")
        found += [f"line {number}: {why}" for span in references if (why := reference_problem(span, root))]
    return found


def test_every_test_named_exists_and_every_scenario_names_one_or_says_it_is_not_covered():
    assert problems(DOC.read_text(encoding="utf-8")) == []


def test_the_check_sees_the_scenarios():
    """The rows and references are found, so an empty list of problems above means something."""
    rows = scenario_rows(DOC.read_text(encoding="utf-8"))
    assert len(rows) > 50
    assert sum("::" in span for _, row in rows for span in CODE_SPAN.findall(row)) > 80
    assert any(NOT_COVERED in row for _, row in rows)


def test_a_misspelt_test_a_missing_file_and_a_row_without_a_test_are_reported(tmp_path):
    tests = tmp_path / "e2e"
    tests.mkdir()
    (tests / "test_faults.py").write_text("def test_a_node_is_lost():\n    pass\n\n\n"
                                          "class TestOperator:\n    def test_restart(self):\n        pass\n")
    doc = "\n".join([
        "| fault | test |",
        "|---|---|",
        "| node lost | `e2e/test_faults.py::test_a_node_is_lost` |",
        "| restart | `e2e/test_faults.py::test_restart` |",
        "| watch silent | not covered: no proxy |",
        "| misspelt | `e2e/test_faults.py::test_a_node_is_lots` |",
        "| missing file | `e2e/test_fault.py::test_a_node_is_lost` |",
        "| elsewhere | `benchmarks/bench_scale.py::main` |",
        "| parametrised | `e2e/test_faults.py::test_a_node_is_lost[slow]` |",
        "| nothing | apiserver gone for 90 s |",
    ])
    assert problems(doc, tmp_path) == [
        "line 6: `e2e/test_faults.py::test_a_node_is_lots`: no test function test_a_node_is_lots in e2e/test_faults.py",
        "line 7: `e2e/test_fault.py::test_a_node_is_lost`: no file e2e/test_fault.py",
        "line 8: `benchmarks/bench_scale.py::main`: benchmarks/bench_scale.py is not under e2e/ or operator/tests/",
        "line 9: `e2e/test_faults.py::test_a_node_is_lost[slow]` is not `path::test_function` "
        "(parameters go outside the code span)",
        "line 10: names no test and does not say 'not covered': | nothing | apiserver gone for 90 s |",
    ]
