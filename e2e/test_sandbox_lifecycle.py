"""`sandbox up` is idempotent and `sandbox down` leaves nothing behind, even
after a crash. These tests stop the session's sandbox, so they run last."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LLMFLEET, spare_instance
from llmfleet_sandbox.config import Network

pytestmark = pytest.mark.sandbox_teardown


def _recorded_pids(state_dir: Path) -> dict[str, int]:
    return {path.stem: json.loads(path.read_text())["pid"]
            for path in (state_dir / "pids").glob("*.json")}


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(proc.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def _port_free(host: str, port: int) -> bool:
    """No listener on the port. SO_REUSEADDR: closed connections in TIME_WAIT do not count."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def test_second_up_says_it_is_running(sandbox):
    result = sandbox.llmfleet("up")
    assert "already running" in result.stderr


def _sandbox_cli(state_dir: Path, instance: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLMFLEET_SANDBOX_DIR": str(state_dir), "LLMFLEET_SANDBOX_INSTANCE": str(instance)}
    return subprocess.run([*LLMFLEET, "sandbox", *args], env=env, capture_output=True, text=True, timeout=600)


def _serves(sandbox) -> bool:
    return "gpu-node-1" in sandbox.kubectl("get", "nodes", "-o", "name")


def test_a_second_sandbox_of_the_same_instance_fails_and_leaves_the_first_untouched(sandbox, tmp_path):
    instance = json.loads((sandbox.state_dir / "sandbox.json").read_text())["config"]["instance"]
    second = _sandbox_cli(tmp_path / "second", instance, "up")
    assert second.returncode != 0
    assert "already in use" in second.stderr or f"belongs to the sandbox in {sandbox.state_dir}" in second.stderr, \
        second.stderr
    _sandbox_cli(tmp_path / "second", instance, "down", "--purge")
    assert subprocess.run(["ip", "link", "show", f"llmf{instance}"], capture_output=True).returncode == 0
    assert _serves(sandbox), "the first sandbox's apiserver still answers at its bridge address"


def test_another_instance_runs_beside_and_goes_without_touching_the_first(sandbox, tmp_path):
    state, beside = tmp_path / "beside", Network(int(spare_instance("beside")))
    try:
        started = _sandbox_cli(state, beside.instance, "up", "--nodes", "1")
        assert started.returncode == 0, started.stderr
        env = {**sandbox.env, "KUBECONFIG": str(state / "admin.kubeconfig")}
        nodes = subprocess.run(["kubectl", "get", "nodes", "-o", "name"], env=env, capture_output=True,
                               text=True, timeout=60)
        assert nodes.stdout.split() == ["node/cpu-node-1", "node/gpu-node-1"], nodes.stderr
        assert beside.gateway_ip in (state / "admin.kubeconfig").read_text()
    finally:
        stopped = _sandbox_cli(state, beside.instance, "down", "--purge")
    assert stopped.returncode == 0, stopped.stderr
    assert subprocess.run(["ip", "link", "show", beside.bridge_name], capture_output=True).returncode != 0
    assert _serves(sandbox)


def test_down_after_a_crash_leaves_no_process_and_frees_ports(sandbox):
    pids = _recorded_pids(sandbox.state_dir)
    processes = set(pids.values())
    for pid in pids.values():
        processes |= _descendants(pid)
    # Simulate a crash of the node agent and the apiserver: down must still clean up.
    os.kill(pids["node-agent"], signal.SIGKILL)
    os.kill(pids["kube-apiserver"], signal.SIGKILL)
    sandbox.llmfleet("down")
    time.sleep(0.5)
    alive = [pid for pid in processes if Path(f"/proc/{pid}").exists()
             and (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")]
    assert alive == []
    settings = json.loads((sandbox.state_dir / "sandbox.json").read_text())
    ports = settings["config"]["ports"]
    for name in ("etcd_client", "etcd_peer", "controller_manager", "scheduler", "prometheus",
                 "pod_discovery", "lws_webhook", "lws_metrics", "lws_health"):
        assert _port_free("127.0.0.1", ports[name]), name
    instance = settings["config"]["instance"]
    assert not list(Path("/run/netns").glob(f"llmf{instance}-*")) if Path("/run/netns").exists() else True
    assert subprocess.run(["ip", "link", "show", f"llmf{instance}"], capture_output=True).returncode != 0
    status = sandbox.llmfleet("status", check=False)
    assert status.returncode == 1
