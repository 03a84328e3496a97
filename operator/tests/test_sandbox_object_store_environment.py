"""The object store's Python environment, built once in the user's cache even when several
sandboxes start at once (the e2e workers on a fresh machine did, and all but one failed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# "pip" is in every fresh venv: installing it is the build's whole pip step without the network.
BUILD = ("import llmfleet_sandbox.objectstore as store; store.REQUIREMENTS = ('pip',); "
         "print(store.ensure_environment())")


@pytest.mark.integration
def test_sandboxes_starting_together_build_the_environment_once_and_all_use_it(tmp_path):
    env = {**os.environ, "LLMFLEET_CACHE": str(tmp_path)}
    builders = [subprocess.Popen([sys.executable, "-c", BUILD], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(builder.communicate(timeout=300), builder.returncode) for builder in builders]
    for (stdout, stderr), returncode in results:
        assert returncode == 0, stderr
    pythons = {stdout.strip() for (stdout, _), _ in results}
    assert len(pythons) == 1
    python = pythons.pop()
    assert subprocess.run([python, "-c", "import pip"]).returncode == 0
    # One of them built it; the others waited and reused it.
    building = [stderr for (_, stderr), _ in results if "installing the S3 server" in stderr]
    assert len(building) == 1, building
