"""Fixtures shared by the unit and integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# The project's shared folder sits beside the repository, read-only, in CI as on a workstation.
SHARED_DIR = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_reference() -> Path:
    """The shared reference tables (model architectures, GPU specifications)."""
    reference = SHARED_DIR / "reference"
    if not reference.is_dir():
        pytest.fail(f"the shared reference tables are missing: expected them in {reference}")
    return reference


# Fixtures that start a real Triton or Prometheus server. A test that uses one, or that is
# marked `integration` because it starts one itself, is an integration test; every other test
# here is a unit test (e2e/conftest.py marks the tests that need the sandbox).
SERVER_FIXTURES = frozenset({"triton", "small_kv_triton", "prometheus", "secured"})


def pytest_collection_modifyitems(config, items):
    tests_dir = Path(__file__).parent
    for item in items:
        if tests_dir not in item.path.parents:
            continue
        if item.get_closest_marker("integration") is None and SERVER_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.unit)
