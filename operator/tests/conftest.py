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
