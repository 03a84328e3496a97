"""`sandbox up` is idempotent and `sandbox down` leaves nothing behind, even
after a crash. These tests stop the session's sandbox, so they run last."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox_teardown]


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
                 "pod_discovery"):
        assert _port_free("127.0.0.1", ports[name]), name
    assert not list(Path("/run/netns").glob("llmf-*")) if Path("/run/netns").exists() else True
    status = sandbox.llmfleet("status", check=False)
    assert status.returncode == 1
