"""Many pods of one image started at once on a fresh sandbox, as a new user starts them: all
of them run (issue 31: two Triton pods of one Deployment on a fresh sandbox lost one for good
to a FileNotFoundError while both laid out the Triton image in one staging directory).

Fresh means what a new user has: a sandbox of its own, whose state directory has no image
laid out yet. It runs beside the worker's sandbox, on a spare instance, with one GPU node."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import LLMFLEET, Sandbox, _environment, _state_environment, spare_instance, wait_for
from llmfleet_sandbox import trtllm_image
from triton_fixtures import model_repository_config_map, triton_deployment

PODS = 6  # of one GPU each, on one node of 8
DEPLOYMENT = "at-once"
FRESH_INSTANCE = spare_instance("fresh-image")
# What the node agent says while Triton starts; anything else is a node agent or image failure.
EXPECTED_WARNINGS = {"Unhealthy"}


@pytest.fixture
def fresh_sandbox():
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root for per-pod network namespaces")
    state_dir = Path(tempfile.mkdtemp(prefix="llmfleet-e2e-fresh-"))
    env = _state_environment(state_dir, FRESH_INSTANCE)
    try:
        started = subprocess.run([*LLMFLEET, "sandbox", "up", "--nodes", "1"], env=env, capture_output=True,
                                 text=True, timeout=600)
        assert started.returncode == 0, f"sandbox up failed:\n{started.stdout}\n{started.stderr}"
        yield Sandbox(state_dir, _environment(state_dir, FRESH_INSTANCE))
    finally:
        stopped = subprocess.run([*LLMFLEET, "sandbox", "down", "--purge"], env=env, capture_output=True,
                                 text=True, timeout=300)
        assert stopped.returncode == 0, f"sandbox down failed; state kept in {state_dir}:\n{stopped.stderr}"


def _ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def test_many_pods_of_one_fresh_image_started_at_once_all_become_ready(fresh_sandbox):
    sandbox = fresh_sandbox
    images = sandbox.state_dir / "images"
    assert not list(images.glob("tritonserver-trtllm.*")), "not fresh: the Triton image is laid out already"
    started = time.monotonic()
    sandbox.apply([model_repository_config_map("repo", load_delay_seconds=0),
                   triton_deployment(DEPLOYMENT, "repo", replicas=PODS)])

    def all_ready():
        pods = sandbox.kubectl_json("get", "pods", "-l", f"app={DEPLOYMENT}")["items"]
        return pods if len(pods) == PODS and all(_ready(pod) for pod in pods) else None
    try:
        pods = wait_for(all_ready, 120, f"{PODS} Triton pods Ready", interval=1)
    except AssertionError:
        pods = sandbox.kubectl_json("get", "pods", "-l", f"app={DEPLOYMENT}")["items"]
        states = {pod["metadata"]["name"]: [c["state"] for c in pod["status"].get("containerStatuses") or []]
                  for pod in pods}
        raise AssertionError(f"not all {PODS} pods Ready: {json.dumps(states)}; events:\n"
                             + sandbox.kubectl("get", "events", "--field-selector", "type=Warning")) from None
    ready_after = time.monotonic() - started

    # None failed and was retried: each container started once, nothing but readiness warned.
    assert [pod["status"]["containerStatuses"][0]["restartCount"] for pod in pods] == [0] * PODS
    assert len({pod["status"]["podIP"] for pod in pods}) == PODS
    events = [event for event in sandbox.kubectl_json("get", "events", "--field-selector", "type=Warning")["items"]
              if (event.get("source") or {}).get("component") == "llmfleet-node-agent"]
    assert {event["reason"] for event in events} <= EXPECTED_WARNINGS, \
        [(event["reason"], event["message"]) for event in events]
    agent_log = (sandbox.state_dir / "logs" / "node-agent.log").read_text()
    assert "Traceback" not in agent_log and "worker error" not in agent_log, agent_log[-3000:]
    # The image was laid out once, completely, and nothing half-made is left beside it.
    laid_out = sorted(path.name for path in images.iterdir())
    name = f"tritonserver-trtllm.{trtllm_image.LAYOUT_VERSION}"
    assert laid_out == [name, f"{name}.lock"], laid_out
    assert (images / name / trtllm_image.COMPLETE_MARKER).is_file()
    print(f"{PODS} pods of a fresh image Ready {ready_after:.0f} s after they were applied")
