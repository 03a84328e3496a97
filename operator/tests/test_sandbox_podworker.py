"""A pod worker whose pod cannot be set up says so on the pod and tries again, as the kubelet
does (issue 31: a worker that hit FileNotFoundError laying out an image logged one line and
died, and its pod stayed ContainerCreating for good, with no event, status or retry).

The worker runs for real, its container a local process; only what needs root is stood in
for: the network namespace (a set of names) and the launcher's mount namespace (the process
runs as it is). A setup step fails the first times it is tried, then works."""

from __future__ import annotations

import copy
import json
import sys
import threading
import time

import pytest

from llmfleet_sandbox import faults, network, podworker, poddns, rootfs, trtllm_image
from llmfleet_sandbox.agent import NodeAgent
from llmfleet_sandbox.config import SandboxConfig
from llmfleet_sandbox.podworker import PodWorker

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"
FAILURES = 2
# The kubelet's back-off scaled down 200 times: 50 ms doubling, at most 1.5 s.
INITIAL_S, MAX_S = 0.05, 1.5


class _RecordingAgent:
    """The node agent as a pod worker sees it, recording what the worker reports."""

    def __init__(self, config: SandboxConfig):
        self.config, self.core, self.host_ip = config, self, "10.244.0.1"
        self.events, self.statuses, self.logs, self.finished = [], [], [], []
        self.namespaces: set[str] = set()  # the network namespaces that exist
        self.namespaces_at_event: list[set[str]] = []
        self.lock = threading.Lock()

    def log(self, message):
        self.logs.append(message)

    def event(self, pod, kind, reason, message):
        with self.lock:
            self.events.append((kind, reason, message))
            self.namespaces_at_event.append(set(self.namespaces))

    def patch_namespaced_pod_status(self, name, namespace, body):
        with self.lock:
            self.statuses.append(copy.deepcopy(body["status"]))

    def read_config_map(self, namespace, name):
        return {}

    def read_secret(self, namespace, name):
        return {}

    def node_manifest(self, node_name):
        return {"metadata": {"labels": {}}}

    def allocate_pod_ip(self, node_name, uid):
        return "10.244.1.7"

    def allocate_gpus(self, node_name, uid, count):
        return list(range(count))

    def release(self, node_name, uid):
        pass

    def delete_pod_object(self, namespace, name, uid):
        pass

    def pod_worker_finished(self, worker):
        self.finished.append(worker.uid)

    # -- what the test reads --

    def container_states(self) -> list[dict]:
        with self.lock:
            return [status["containerStatuses"][0]["state"] for status in self.statuses]

    def latest(self) -> dict:
        with self.lock:
            return self.statuses[-1] if self.statuses else {}


@pytest.fixture
def agent(tmp_path, monkeypatch) -> _RecordingAgent:
    agent = _RecordingAgent(SandboxConfig(state_dir=tmp_path))
    monkeypatch.setattr(podworker, "BACKOFF_INITIAL_SECONDS", INITIAL_S)
    monkeypatch.setattr(podworker, "BACKOFF_MAX_SECONDS", MAX_S)
    monkeypatch.setattr(podworker, "LOOP_SECONDS", 0.02)
    monkeypatch.setattr(network, "create_pod_namespace",
                        lambda net, namespace, ip: agent.namespaces.add(namespace))
    monkeypatch.setattr(network, "delete_pod_namespace", lambda namespace: agent.namespaces.discard(namespace))
    monkeypatch.setattr(network, "exec_prefix", lambda namespace: [])
    # The container's process, without the launcher's mount namespace (which needs root).
    monkeypatch.setattr(rootfs, "launcher_command",
                        lambda spec_file: [sys.executable, "-c", "import time; time.sleep(60)"])
    return agent


def _pod(readiness_probe: dict | None = None) -> dict:
    container = {"name": "triton", "image": TRITON_IMAGE, "command": ["tritonserver"]}
    if readiness_probe:
        container["readinessProbe"] = readiness_probe
    return {"metadata": {"name": "triton-0", "namespace": "ns", "uid": "0123456789abcdef-uid", "labels": {}},
            "spec": {"nodeName": "gpu-node-1", "restartPolicy": "Always", "containers": [container]}}


def _failing_first(times: int, error: Exception, real=None):
    """A stand-in that raises `error` the first `times` calls, then calls `real`; the moments
    it was called at."""
    calls: list[float] = []

    def step(*args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise error
        return real(*args, **kwargs) if real else None
    step.calls = calls
    return step


def _wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _running(agent: _RecordingAgent):
    return "running" in agent.latest().get("containerStatuses", [{}])[0].get("state", {})


def _backed_off(calls: list[float]) -> None:
    """Each try after a failure waited at least the back-off: 1, 2, 4 ... times the first."""
    gaps = [later - earlier for earlier, later in zip(calls, calls[1:])]
    for index, gap in enumerate(gaps):
        assert gap >= INITIAL_S * 2 ** index * 0.9, f"try {index + 2} came {gap:.3f} s after the one before: {gaps}"


def _stop(worker: PodWorker, agent: _RecordingAgent) -> None:
    worker.request_stop(0, delete_object=False)
    worker.join(timeout=30)
    assert not worker.is_alive() and agent.finished == [worker.uid]
    assert agent.namespaces == set()
    for run in worker.app_runs:
        assert run.process is None or run.process.poll() is not None


def test_an_image_that_fails_to_lay_out_is_reported_on_the_pod_and_retried_with_back_off(agent, monkeypatch):
    layout = _failing_first(FAILURES, FileNotFoundError(2, "No such file or directory"),
                            real=trtllm_image._assemble_python_backend)
    monkeypatch.setattr(trtllm_image, "_assemble_python_backend", layout)
    worker = PodWorker(agent, _pod())
    worker.start()
    try:
        _wait(lambda: _running(agent), "the container to run once the image lays out")
        assert len(layout.calls) == FAILURES + 1
        _backed_off(layout.calls)
        waiting = [state["waiting"] for state in agent.container_states()
                   if state.get("waiting", {}).get("reason") == "ErrImagePull"]
        assert waiting, agent.container_states()
        assert f'failed to lay out image "{TRITON_IMAGE}": FileNotFoundError: [Errno 2] No such file or directory' \
            in waiting[0]["message"]
        failed = [message for kind, reason, message in agent.events if (kind, reason) == ("Warning", "Failed")]
        assert len(failed) == FAILURES and all("FileNotFoundError" in message for message in failed), agent.events
        assert sum("Traceback (most recent call last)" in line for line in agent.logs) == FAILURES
        assert ("Normal", "Started", "Started container triton") in agent.events
        assert agent.latest()["phase"] == "Running"
    finally:
        _stop(worker, agent)


def test_a_pod_sandbox_that_fails_half_way_is_torn_down_reported_and_made_again(agent, monkeypatch):
    # The /etc/hosts file is written after the network namespace is made: a failure there
    # must not leave the namespace behind until the next try.
    hosts = _failing_first(FAILURES, OSError(28, "No space left on device"), real=poddns.hosts_file)
    monkeypatch.setattr(poddns, "hosts_file", hosts)
    worker = PodWorker(agent, _pod())
    worker.start()
    try:
        _wait(lambda: _running(agent), "the container to run once the sandbox is made")
        assert len(hosts.calls) == FAILURES + 1
        _backed_off(hosts.calls)
        sandbox_events = [(message, namespaces) for (kind, reason, message), namespaces
                          in zip(agent.events, agent.namespaces_at_event) if reason == "FailedCreatePodSandBox"]
        assert len(sandbox_events) == FAILURES, agent.events
        for message, namespaces in sandbox_events:
            assert message == "Failed to create pod sandbox: OSError: [Errno 28] No space left on device"
            assert namespaces == set(), "the half-made sandbox's network namespace stayed"
        failed = next(status for status in agent.statuses
                      if (status["containerStatuses"][0]["state"].get("waiting") or {}).get("message"))
        assert failed["containerStatuses"][0]["state"]["waiting"] == {
            "reason": "ContainerCreating",
            "message": "Failed to create pod sandbox: OSError: [Errno 28] No space left on device"}
        conditions = {condition["type"]: condition["status"] for condition in failed["conditions"]}
        assert conditions["PodReadyToStartContainers"] == "False" and failed["podIP"] is None
        latest = {condition["type"]: condition["status"] for condition in agent.latest()["conditions"]}
        assert latest["PodReadyToStartContainers"] == "True" and agent.latest()["podIP"] == "10.244.1.7"
        assert agent.namespaces == {worker.netns}
    finally:
        _stop(worker, agent)


def test_a_container_that_fails_to_start_is_reported_and_tried_again(agent, monkeypatch):
    launcher = rootfs.launcher_command
    start = _failing_first(FAILURES, PermissionError(13, "Permission denied"), real=launcher)
    monkeypatch.setattr(rootfs, "launcher_command", start)
    worker = PodWorker(agent, _pod())
    worker.start()
    try:
        _wait(lambda: _running(agent), "the container to run")
        _backed_off(start.calls)
        reasons = [state["waiting"] for state in agent.container_states() if "waiting" in state]
        assert {"reason": "CreateContainerError",
                "message": "PermissionError: [Errno 13] Permission denied"} in reasons, reasons
        assert [event for event in agent.events if event[1] == "Failed"] == \
            [("Warning", "Failed", "Error: PermissionError: [Errno 13] Permission denied")] * FAILURES
    finally:
        _stop(worker, agent)


def test_a_pass_that_fails_elsewhere_is_reported_and_retried_without_touching_running_containers(agent, monkeypatch):
    probe = _failing_first(FAILURES, RuntimeError("probe runner broke"),
                           real=lambda *args, **kwargs: (True, ""))
    monkeypatch.setattr(podworker, "run_probe", probe)
    worker = PodWorker(agent, _pod(readiness_probe={"exec": {"command": ["true"]}, "periodSeconds": 1}))
    worker.start()
    try:
        _wait(lambda: _running(agent), "the container to run")
        pid = worker.app_runs[0].process.pid
        _wait(lambda: agent.latest()["containerStatuses"][0]["ready"], "the container to be ready", timeout=30)
        assert worker.app_runs[0].process.pid == pid and worker.app_runs[0].restart_count == 0
        sync = [message for kind, reason, message in agent.events if reason == "FailedSync"]
        assert sync == ["error syncing pod: RuntimeError: probe runner broke"] * FAILURES
        _backed_off(probe.calls[:FAILURES + 1])
    finally:
        _stop(worker, agent)


def test_a_pod_deleted_while_its_worker_backs_off_stops_at_once_and_leaves_nothing(agent, monkeypatch):
    monkeypatch.setattr(podworker, "BACKOFF_INITIAL_SECONDS", 60.0)
    monkeypatch.setattr(podworker, "BACKOFF_MAX_SECONDS", 300.0)
    hosts = _failing_first(100, OSError(5, "Input/output error"))
    monkeypatch.setattr(poddns, "hosts_file", hosts)
    worker = PodWorker(agent, _pod())
    worker.start()
    _wait(lambda: any(reason == "FailedCreatePodSandBox" for _, reason, _ in agent.events), "the first failure")
    stopped = time.monotonic()
    _stop(worker, agent)
    assert time.monotonic() - stopped < 5 and len(hosts.calls) == 1


def test_a_worker_that_fails_outside_its_pod_sync_logs_why_and_its_pod_gets_another_worker(agent, monkeypatch):
    def device_plugin_gone(node_name, uid, count):
        raise RuntimeError("device plugin gone")

    monkeypatch.setattr(agent, "allocate_gpus", device_plugin_gone)
    worker = PodWorker(agent, _pod())
    worker.run()
    assert worker.crashed and agent.finished == [worker.uid]
    assert "Traceback (most recent call last)" in agent.logs[-1] and "device plugin gone" in agent.logs[-1]
    # The agent does not count its pod as finished: its next relist starts another worker.
    node_agent = NodeAgent.__new__(NodeAgent)
    node_agent.lock, node_agent.workers, node_agent.finished_uids = threading.Lock(), {worker.uid: worker}, set()
    node_agent.pod_worker_finished(worker)
    assert node_agent.workers == {} and node_agent.finished_uids == set()


def test_a_fault_set_while_a_pod_runs_reaches_its_running_container_through_the_live_fault_file(agent):
    """`sandbox fault` on a revision whose pods already run: the worker rewrites the pod's live
    fault, which its containers mount read-only at faults.LIVE_DIRECTORY and are told of in
    their environment; the container is not restarted (a throttled GPU slows pods as they run)."""
    pod = _pod()
    pod["metadata"]["labels"] = {"llmfleet.io/deployment": "chat", "llmfleet.io/revision": "abc"}
    worker = PodWorker(agent, pod)
    worker.start()
    try:
        _wait(lambda: _running(agent), "the container to run")
        live_file = worker.pod_root / podworker.LIVE_FAULT_DIRECTORY / faults.LIVE_FILE
        launch = json.loads((worker.pod_root / "run" / "triton.json").read_text())
        assert ["bind", str(live_file.parent), faults.LIVE_DIRECTORY] in launch["ops"]
        assert ["readonly", faults.LIVE_DIRECTORY] in launch["ops"]
        assert launch["env"][faults.LIVE_FAULT_VARIABLE] == f"{faults.LIVE_DIRECTORY}/{faults.LIVE_FILE}"
        assert json.loads(live_file.read_text())["slowdown"] == 1.0
        pid = worker.app_runs[0].process.pid
        faults.set_fault(agent.config.state_dir, faults.Fault("ns", "chat", "abc", slowdown=5.0))
        _wait(lambda: json.loads(live_file.read_text())["slowdown"] == 5.0, "the live fault to follow")
        faults.set_fault(agent.config.state_dir, faults.Fault("ns", "other", "abc", slowdown=9.0))
        faults.set_fault(agent.config.state_dir, faults.Fault("ns", "chat", "abc"))
        _wait(lambda: json.loads(live_file.read_text())["slowdown"] == 1.0, "the removed fault to go")
        time.sleep(0.1)
        assert json.loads(live_file.read_text())["slowdown"] == 1.0, "another deployment's fault reached it"
        assert worker.app_runs[0].process.pid == pid and worker.app_runs[0].restart_count == 0
    finally:
        _stop(worker, agent)
