"""What clusters do to an operator, and what must hold meanwhile. Each scenario states its
expected outcome before it runs:

- kube-apiserver crashed and restarted, then etcd (data kept): the serving replicas answer every
  request throughout (the data path needs no control plane), the LLMDeployment keeps its
  status, and the operator acts on a change made after each restart.
- an engine that fails to load (its Triton exits, the container crash-loops): the fleet keeps
  serving on its other replica; Degraded names the pod, CrashLoopBackOff, the restart count and
  the last line Triton printed;
  once the engine loads again, Degraded clears.
- an engine build for a new revision that fails writing into a full engine cache (ENOSPC): the
  serving revision is never touched and stays Ready; EngineBuilt says the attempt failed and
  quotes the error (from the build pod's termination message) while the Job retries, then
  BuildFailed with the Job's reason and the same error.
- a node powered off (its agent's heartbeats stop, its pods' processes die): the node goes
  NotReady within the sandbox's 30 s grace; Degraded says the node stopped reporting, then that
  the pod is evicted (30 s tolerations); the replacement runs on another node and Degraded
  clears; a replica on another node is never restarted. Powered on again, the node is Ready
  and the evicted pod object is gone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from conftest import LLMFLEET, service_target, small_batch_70b, stop_load, temporary_namespace, wait_for, wait_until_ready

pytestmark = pytest.mark.long_running

NAMESPACE = "faults"


@pytest.fixture(scope="module")
def faults_namespace(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        yield NAMESPACE


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
    """Ends the load (no new sends; in-flight requests finish and count) and checks it."""
    stdout, stderr = stop_load(load)
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


@pytest.fixture(scope="module")
def steady(sandbox, faults_namespace) -> dict:
    """One replica serving, shared by the scenarios that change it rather than start afresh."""
    body = small_batch_70b("steady", NAMESPACE, 1000, plan={"replicas": 1})
    sandbox.apply([body], namespace=NAMESPACE)
    wait_until_ready(sandbox, "steady", NAMESPACE)
    return body


# The operator cannot renew its Lease while the apiserver is down, exits and is restarted, and
# passes fail meanwhile: what this test checks is what it leaves behind.
@pytest.mark.disrupts_operator
def test_control_plane_restarts_lose_no_request_status_or_decision(sandbox, steady, tmp_path):
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

    sandbox.llmfleet("fault", "--namespace", NAMESPACE, "--deployment", "crashing", "--revision", revision, "--fail-load")
    try:
        # Its replacement starts with the fault: Triton cannot load the engine and exits.
        sandbox.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--wait=false")

        def degraded_with_the_reason():
            condition = _condition(sandbox, "crashing", "Degraded")
            message = condition["message"]
            return condition if (condition["status"] == "True" and "CrashLoopBackOff" in message
                                 and "restarted" in message and "it last said: " in message) else None
        condition = wait_for(degraded_with_the_reason, 180, "Degraded naming the crash loop", 1)
        assert condition["reason"] == "BelowDesiredReplicas"
        assert condition["message"].startswith("1/2 replicas ready; pod crashing-")
        assert _condition(sandbox, "crashing", "Ready")["status"] == "True"  # one replica serves on
    finally:
        sandbox.llmfleet("fault", "--namespace", NAMESPACE, "--deployment", "crashing", "--revision", revision)  # the defaults remove it
    wait_for(lambda: _condition(sandbox, "crashing", "Degraded")["status"] == "False", 180,
             "Degraded to clear once the engine loads again", 1)


def test_a_build_into_a_full_engine_cache_quotes_the_error_and_the_serving_revision_serves_on(sandbox, steady):
    wait_until_ready(sandbox, "steady", NAMESPACE)
    body = json.loads(json.dumps(steady))
    selector = "llmfleet.io/deployment=steady,app.kubernetes.io/component=server"
    serving = {p["metadata"]["uid"] for p in sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                                                   selector)["items"]}
    body["spec"]["engine"]["revision"] = "v2"
    planned = subprocess.run([*LLMFLEET, "plan", "-f", "-", "-o", "json"], input=json.dumps(body), env=sandbox.env,
                             capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    revision = json.loads(planned.stdout)["revision"]

    sandbox.llmfleet("fault", "--namespace", NAMESPACE, "--deployment", "steady", "--revision", revision, "--engine-cache-full")
    try:
        sandbox.apply([body], namespace=NAMESPACE)

        def engine_built_says(reason: str):
            def check():
                built = _condition(sandbox, "steady", "EngineBuilt")
                return built if built["reason"] == reason and "No space left on device" in built["message"] else None
            return check
        retrying = wait_for(engine_built_says("Building"), 120, "EngineBuilt quoting ENOSPC while retrying", 1)
        assert "1 attempt failed" in retrying["message"], retrying
        failed = wait_for(engine_built_says("BuildFailed"), 180, "BuildFailed quoting ENOSPC", 1)
        assert "BackoffLimitExceeded" in failed["message"], failed
        assert _condition(sandbox, "steady", "Ready")["status"] == "True"  # the old revision serves on
        now = {p["metadata"]["uid"] for p in sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                                                   selector)["items"]}
        assert now == serving, "the serving revision's pods were never replaced"
    finally:
        sandbox.llmfleet("fault", "--namespace", NAMESPACE, "--deployment", "steady", "--revision", revision)


def test_a_lost_node_is_named_its_pods_replaced_elsewhere_and_other_replicas_untouched(sandbox, faults_namespace):
    sandbox.apply([small_batch_70b("unplugged", NAMESPACE, 1000, plan={"replicas": 2})], namespace=NAMESPACE)
    wait_until_ready(sandbox, "unplugged", NAMESPACE)
    selector = "llmfleet.io/deployment=unplugged,app.kubernetes.io/component=server"

    def pods() -> list[dict]:
        return sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", selector)["items"]

    before = pods()
    lost = before[0]["spec"]["nodeName"]
    on_lost = {p["metadata"]["uid"] for p in before if p["spec"]["nodeName"] == lost}
    elsewhere = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
                 for p in before if p["spec"]["nodeName"] != lost}
    stories: list[str] = []

    def degraded_says(words: str):
        def check():
            condition = _condition(sandbox, "unplugged", "Degraded")
            if condition["status"] == "True" and condition["message"] not in stories:
                stories.append(condition["message"])
            return condition["status"] == "True" and words in condition["message"]
        return check

    def node_ready() -> str:
        conditions = sandbox.kubectl_json("get", "node", lost)["status"]["conditions"]
        return next(c["status"] for c in conditions if c["type"] == "Ready")

    sandbox.llmfleet("node-power", "off", lost)
    try:
        wait_for(lambda: node_ready() != "True", 60, f"{lost} to go NotReady")
        wait_for(degraded_says(f"its node {lost} stopped reporting"), 60, "Degraded naming the silent node", 1)
        wait_for(degraded_says("is being evicted"), 90, "Degraded naming the eviction", 1)

        def replaced():
            serving = [p for p in pods() if not p["metadata"].get("deletionTimestamp")]
            ready = [p for p in serving if any(c["type"] == "Ready" and c["status"] == "True"
                                               for c in p["status"].get("conditions") or ())]
            return len(ready) == 2 and ready
        now_serving = wait_for(replaced, 240, "two ready replicas again, none on the lost node", 2)
        assert all(p["spec"]["nodeName"] != lost for p in now_serving), now_serving
        for pod in now_serving:
            if pod["metadata"]["uid"] in elsewhere:  # never restarted by another node's loss
                assert pod["status"]["containerStatuses"][0]["restartCount"] == elsewhere[pod["metadata"]["uid"]]
        assert not on_lost & {p["metadata"]["uid"] for p in now_serving}
        wait_for(lambda: _condition(sandbox, "unplugged", "Degraded")["status"] == "False", 60,
                 "Degraded to clear", 1)
    finally:
        sandbox.llmfleet("node-power", "on", lost)
    wait_for(lambda: node_ready() == "True", 60, f"{lost} to be Ready again")
    wait_for(lambda: not on_lost & {p["metadata"]["uid"] for p in pods()}, 60,
             "the evicted pods' objects to go once their node reports again")
    assert _condition(sandbox, "unplugged", "Ready")["status"] == "True", stories
