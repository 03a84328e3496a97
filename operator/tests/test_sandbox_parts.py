"""The sandbox's pure pieces, without a cluster: path rewriting, image mapping,
endpoint selection, pod discovery labels, probe thresholds, pid records."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmfleet_sandbox import images
from llmfleet_sandbox.poddiscovery import pod_target_groups
from llmfleet_sandbox.probes import ProbeState
from llmfleet_sandbox.processes import ProcessTable, process_start_ticks
from llmfleet_sandbox.serviceproxy import EndpointTable
from llmfleet_sandbox.volumes import Mount, rewrite_paths

MOUNTS = [Mount("/models", Path("/state/pod/volumes/repo")),
          Mount("/models/engine", Path("/state/pod/volumes/engine")),
          Mount("/tmp", Path("/state/pod/volumes/tmp"))]


@pytest.mark.parametrize("text, expected", [
    ("--model-repository=/models", "--model-repository=/state/pod/volumes/repo"),
    ("/models/engine/rank0", "/state/pod/volumes/engine/rank0"),
    ("/models/ensemble/config.pbtxt", "/state/pod/volumes/repo/ensemble/config.pbtxt"),
    ("/models2 a/models x/tmp", "/models2 a/models x/tmp"),
    ('cat "/tmp/x"', 'cat "/state/pod/volumes/tmp/x"'),
])
def test_mount_paths_are_rewritten_only_at_path_boundaries(text, expected):
    assert rewrite_paths(text, MOUNTS) == expected


def test_rewritten_text_is_not_rewritten_again():
    # The replacement of /tmp starts with /state...; a mount at /state must not touch it.
    mounts = [Mount("/tmp", Path("/state/tmp")), Mount("/state", Path("/other"))]
    assert rewrite_paths("/tmp/a /state/b", mounts) == "/state/tmp/a /other/b"


def test_unknown_image_is_not_runnable_and_the_message_names_it(tmp_path):
    with pytest.raises(images.ImageNotRunnable, match=r'"registry.invalid/x:1".*runnable images'):
        images.resolve("registry.invalid/x:1", [], [], tmp_path)


def test_triton_image_runs_the_bundled_server_with_the_python_backend(tmp_path):
    program = images.resolve("nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3",
                             ["tritonserver"], ["--model-repository=/m"], tmp_path)
    assert program.argv[0].endswith("bin/tritonserver")
    assert f"--backend-directory={tmp_path / 'triton-backends'}" in program.argv
    assert (tmp_path / "triton-backends" / "python" / "triton_python_backend_stub").exists()
    assert program.env["PATH"].startswith(str(Path(sys.executable).parent))


def test_multi_gpu_launcher_becomes_one_server(tmp_path):
    program = images.resolve(
        "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3", ["python3"],
        ["/app/scripts/launch_triton_server.py", "--world_size=4", "--model_repo=/models",
         "--grpc_port=8001"], tmp_path)
    assert "--model-repository=/models" in program.argv and "--grpc-port=8001" in program.argv
    assert not any("world_size" in arg for arg in program.argv)


def test_python_image_runs_this_python(tmp_path):
    program = images.resolve("python:3.11-slim", ["python3", "-c", "pass"], [], tmp_path)
    assert program.argv == [sys.executable, "-c", "pass"]


def _slice(name, service, addresses_ready, port=8001, port_name="grpc", terminating=()):
    return {"metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": port_name, "port": port}],
            "endpoints": [{"addresses": [address], "conditions": {
                "ready": ready, "terminating": address in terminating}}
                for address, ready in addresses_ready]}


def test_service_proxy_balances_over_ready_not_terminating_endpoints():
    table = EndpointTable()
    table.set_slice("ns", "a", _slice("a", "chat", [("10.0.0.1", True), ("10.0.0.2", False),
                                                    ("10.0.0.3", True)], terminating={"10.0.0.3"}))
    table.set_slice("ns", "b", _slice("b", "chat", [("10.0.0.4", True)]))
    table.set_slice("ns", "c", _slice("c", "other", [("10.0.0.9", True)]))
    picks = {table.pick("ns", "chat", "grpc") for _ in range(4)}
    assert picks == {("10.0.0.1", 8001), ("10.0.0.4", 8001)}
    assert table.pick("ns", "chat", "http") is None
    table.set_slice("ns", "a", None)
    assert table.pick("ns", "chat", "grpc") == ("10.0.0.4", 8001)


def test_pod_discovery_gives_kubernetes_sd_labels():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                        "labels": {"llmfleet.io/deployment": "chat"},
                        "annotations": {"prometheus.io/scrape": "true"}},
           "spec": {"nodeName": "gpu-node-1", "containers": [
               {"name": "triton", "ports": [{"name": "metrics", "containerPort": 8002}]}]},
           "status": {"podIP": "10.244.1.2", "phase": "Running",
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    [group] = pod_target_groups(pod)
    assert group["targets"] == ["10.244.1.2:8002"]
    labels = group["labels"]
    assert labels["__meta_kubernetes_pod_label_llmfleet_io_deployment"] == "chat"
    assert labels["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == "true"
    assert labels["__meta_kubernetes_pod_ready"] == "true"
    assert pod_target_groups({**pod, "status": {}}) == []


def test_probe_thresholds_flip_only_when_reached():
    state = ProbeState({"failureThreshold": 2, "successThreshold": 1, "periodSeconds": 1}, started_at=0)
    state.record(True, 1)
    assert state.passing is True
    state.record(False, 2)
    assert state.passing is True
    state.record(False, 3)
    assert state.passing is False


def test_probe_ticks_passed_during_startup_delay_the_first_probe_by_a_period():
    readiness = ProbeState({"periodSeconds": 5}, started_at=100)
    assert readiness.due(100)
    readiness.pass_tick(100)
    assert not readiness.due(104)
    assert readiness.due(105)
    assert readiness.passing is None


def test_pid_records_do_not_match_a_reused_pid(tmp_path):
    table = ProcessTable(tmp_path / "pids", tmp_path / "logs")
    record = table.start("sleeper", ["sleep", "30"])
    assert record.alive() and process_start_ticks(record.pid) == record.start_ticks
    forged = type(record)(record.name, record.pid, record.start_ticks + 1)
    assert not forged.alive()
    table.stop("sleeper", grace_seconds=5)
    assert not record.alive()
    assert table.recorded() == []
