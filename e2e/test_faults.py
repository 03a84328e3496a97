"""What clusters do to an operator, and what must hold meanwhile. Each scenario states its
expected outcome before it runs:

- kube-apiserver crashed and restarted, then etcd (data kept): the serving replicas answer every
  request throughout (the data path needs no control plane), the LLMDeployment keeps its
  status, and the operator acts on a change made after each restart.
- an engine that fails to load (its Triton exits, the container crash-loops): the fleet keeps
  serving on its other replica; Degraded names the pod, CrashLoopBackOff and the restart count;
  once the engine loads again, Degraded clears.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from conftest import LLMFLEET, service_target, wait_for, wait_until_ready
from operator_fixtures import small_batch_70b

pytestmark = pytest.mark.e2e
NAMESPACE = "faults"


@pytest.fixture(scope="module")
def faults_namespace(sandbox, operator):
    sandbox.kubectl("create", "namespace", NAMESPACE)
    yield NAMESPACE
    sandbox.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _get(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", name, "-n", NAMESPACE)


def _condition(sandbox, name: str, kind: str) -> dict:
    return next(c for c in _get(sandbox, name)["status"]["conditions"] if c["type"] == kind)


def _load(sandbox, name: str, seconds: int, output) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "llmfleet", "load", "--target", service_target(sandbox, name, NAMESPACE),
         "--schedule", "constant:1", "--duration-s", str(seconds), "--input-tokens", "fixed:64",
         "--output-tokens", "fixed:8", "--output-dir", str(output), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finished_without_a_failed_request(load: subprocess.Popen, output) -> None:
    stdout, stderr = load.communicate(timeout=300)
    assert load.returncode == 0, stderr + stdout
    summary = json.loads((output / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["truncated"] == 0, summary


def _scale_and_wait(sandbox, name: str, replicas: int, what: str) -> None:
    """A change made now: the operator must carry it to the children."""
    sandbox.kubectl("scale", "llmdeployment", name, "-n", NAMESPACE, f"--replicas={replicas}")

    def carried_out():
        deployments = sandbox.kubectl_json("get", "deployments", "-n", NAMESPACE, "-l",
                                           f"llmfleet.io/deployment={name}")["items"]
        return [d for d in deployments if d["spec"]["replicas"] == replicas]
    wait_for(carried_out, 90, f"the operator to scale to {replicas} {what}")


def test_control_plane_restarts_lose_no_request_status_or_decision(sandbox, faults_namespace, tmp_path):
    sandbox.apply([small_batch_70b("steady", NAMESPACE, 1000, plan={"replicas": 1})], namespace=NAMESPACE)
    status_before = wait_until_ready(sandbox, "steady", NAMESPACE)["status"]
    load = _load(sandbox, "steady", 90, tmp_path)
    try:
        for component in ("kube-apiserver", "etcd"):
            try:
                sandbox.stop_component(component, signal.SIGKILL)
            finally:
                sandbox.llmfleet("up")  # starts only what stopped; every later test needs it
            status_after = _get(sandbox, "steady")["status"]
            assert status_after["currentRevision"] == status_before["currentRevision"]  # data kept
            _scale_and_wait(sandbox, "steady", 2 if component == "kube-apiserver" else 1,
                            f"after the {component} restart")
    finally:
        _finished_without_a_failed_request(load, tmp_path)
    assert _condition(sandbox, "steady", "Ready")["status"] == "True"


def test_a_crash_looping_engine_is_named_with_its_restarts_and_the_fleet_serves_on(sandbox, faults_namespace):
    sandbox.apply([small_batch_70b("crashing", NAMESPACE, 1000, plan={"replicas": 2})], namespace=NAMESPACE)
    revision = wait_until_ready(sandbox, "crashing", NAMESPACE)["status"]["currentRevision"]
    selector = f"llmfleet.io/deployment=crashing,llmfleet.io/revision={revision},app.kubernetes.io/component=server"
    victim = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"][0]["metadata"]["name"]

    def fault(*flags: str) -> None:
        result = subprocess.run([*LLMFLEET, "sandbox", "fault", "--namespace", NAMESPACE, "--revision", revision,
                                 *flags], env=sandbox.env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    fault("--fail-load")
    try:
        # Its replacement starts with the fault: Triton cannot load the engine and exits.
        sandbox.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--wait=false")

        def degraded_with_the_reason():
            condition = _condition(sandbox, "crashing", "Degraded")
            message = condition["message"]
            return condition if (condition["status"] == "True" and "CrashLoopBackOff" in message
                                 and "restarted" in message) else None
        condition = wait_for(degraded_with_the_reason, 180, "Degraded naming the crash loop", 1)
        assert condition["reason"] == "BelowDesiredReplicas"
        assert condition["message"].startswith("1/2 replicas ready; pod crashing-")
        assert _condition(sandbox, "crashing", "Ready")["status"] == "True"  # one replica serves on
    finally:
        fault()  # the defaults remove it
    wait_for(lambda: _condition(sandbox, "crashing", "Degraded")["status"] == "False", 180,
             "Degraded to clear once the engine loads again", 1)
