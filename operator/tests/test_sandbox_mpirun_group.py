"""The sandbox's `mpirun` over a LeaderWorkerSet group (image/mpirun.py, image/group_hosts.py):
the rendered launch checked against the records, the hosts it checks instead of exec'ing ranks
into them, and rank 0 started with OpenMPI's placement variables."""

from __future__ import annotations

import signal
import socket
import sys
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet.render import RenderSettings, serving
from llmfleet_sandbox.image import group_hosts, mpirun
from llmfleet_sandbox.image.group_hosts import GroupLaunchError, Host, HostIdentity, lost_reason
from llmfleet_sandbox.trtllm_image import RELEASE_VARIABLE
from test_render_group import spanning, the

LEADER = "chat-abc-0"
EIGHT_GPUS = {RELEASE_VARIABLE: "engine-24.12", "NVIDIA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def group_argv() -> list[str]:
    """The leader's mpirun arguments as the kubelet expands them."""
    _, _, objects = spanning()
    (server,) = the(objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    return [arg.replace("$(POD_NAME)", LEADER) for arg in server["command"][5:]]


def test_the_rendered_group_launch_parses_and_matches_the_records():
    argv = group_argv()
    command = mpirun.parse_command(argv)
    assert command.hosts == [Host(LEADER, 8), Host(f"{LEADER}-1", 8)]
    assert command.world_size == 16 and command.rsh_agent == "/opt/llmfleet/launcher/kubessh"
    assert mpirun.record_problems(argv, command, EIGHT_GPUS) == []


def test_a_launch_off_the_record_is_refused():
    argv = [arg for arg in group_argv() if arg != "--allow-grpc=false"]
    assert "rank 1: missing --allow-grpc=false" in mpirun.record_problems(argv, mpirun.parse_command(argv), EIGHT_GPUS)
    # Slots that are not the pod's GPUs.
    argv = group_argv()
    four_gpus = {**EIGHT_GPUS, "NVIDIA_VISIBLE_DEVICES": "0,1,2,3"}
    assert any("--host" in problem for problem in mpirun.record_problems(argv, mpirun.parse_command(argv), four_gpus))
    with pytest.raises(mpirun.UsageError, match="16 ranks but only 9 slots"):
        mpirun.parse_command([arg.replace(f"{LEADER}-1:8", f"{LEADER}-1:1") for arg in group_argv()])


def test_the_single_node_launch_is_checked_against_the_release_record_too():
    argv = serving.triton_command(SimpleNamespace(tensor_parallel_size=4, pipeline_parallel_size=1),
                                  RenderSettings())[1:]
    assert mpirun.record_problems(argv, mpirun.parse_command(argv), EIGHT_GPUS) == []
    wrong = [arg for arg in argv if not arg.startswith("--backend-config=python,shm-region-prefix-name=prefix2_")]
    assert "rank 2: missing --backend-config=python,shm-region-prefix-name=prefix2_" in \
        mpirun.record_problems(wrong, mpirun.parse_command(wrong), EIGHT_GPUS)


def test_rank_zero_learns_the_world_and_its_hosts_ranks(monkeypatch):
    checked, started = [], {}
    monkeypatch.setattr(mpirun, "check_group", lambda hosts, agent: checked.append((hosts, agent)) or Watch())
    monkeypatch.setattr(mpirun.shutil, "which", lambda name: f"/opt/tritonserver/bin/{name}")
    monkeypatch.setattr(mpirun, "supervise", lambda binary, argv, env, watch: started.update(binary=binary, env=env) or 0)
    monkeypatch.setattr(mpirun.os, "environ", {**EIGHT_GPUS})
    with pytest.raises(SystemExit) as exited:
        mpirun.main(group_argv())
    assert exited.value.code == 0
    assert checked == [([Host(LEADER, 8), Host(f"{LEADER}-1", 8)], "/opt/llmfleet/launcher/kubessh")]
    assert started["binary"] == "/opt/tritonserver/bin/tritonserver"
    assert {key: started["env"][key] for key in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                                                 "OMPI_COMM_WORLD_LOCAL_SIZE")} == {
        "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}


def test_a_launch_off_the_record_exits_as_mpirun_does(monkeypatch, capsys):
    monkeypatch.setattr(mpirun.os, "environ", {**EIGHT_GPUS})
    with pytest.raises(SystemExit) as exited:
        mpirun.main([arg for arg in group_argv() if arg != "--allow-http=false"])
    assert exited.value.code == 1
    assert "rank 1: missing --allow-http=false" in capsys.readouterr().err


def test_the_rsh_agent_and_rank_zeros_host_are_checked(tmp_path):
    with pytest.raises(GroupLaunchError, match="no -mca plm_rsh_agent"):
        group_hosts.check_group([Host(socket.gethostname(), 8), Host("w", 8)], None)
    with pytest.raises(GroupLaunchError, match="is not an executable file"):
        group_hosts.check_group([Host(socket.gethostname(), 8), Host("w", 8)], str(tmp_path / "kubessh"))
    agent = tmp_path / "kubessh"
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o555)
    with pytest.raises(GroupLaunchError, match="is not this pod"):
        group_hosts.check_group([Host("someone-else", 8), Host("w", 8)], str(agent))


class Pods:
    def __init__(self, phase: str = "Running", subdomain: str | None = "chat-abc", status: int | None = None):
        self.phase, self.subdomain, self.status = phase, subdomain, status

    def read_namespaced_pod(self, name, namespace):
        if self.status:
            raise ApiException(status=self.status, reason="Forbidden")
        return SimpleNamespace(status=SimpleNamespace(phase=self.phase, pod_ip="127.0.0.1"),
                               spec=SimpleNamespace(hostname=name, subdomain=self.subdomain))


def test_a_worker_must_be_running_and_answer_at_its_stable_address(monkeypatch):
    resolved = []
    monkeypatch.setattr(group_hosts.socket, "gethostbyname", lambda name: resolved.append(name) or "127.0.0.1")
    # Nothing listens on the probe port: refused is an answer.
    assert group_hosts.check_host(Pods(), "serving", "chat-abc-0-1") == "chat-abc-0-1.chat-abc.serving"
    assert resolved == ["chat-abc-0-1.chat-abc.serving"]
    with pytest.raises(GroupLaunchError, match="is Pending, not Running"):
        group_hosts.check_host(Pods(phase="Pending"), "serving", "chat-abc-0-1")
    with pytest.raises(GroupLaunchError, match="cannot read pod serving/chat-abc-0-1: 403"):
        group_hosts.check_host(Pods(status=403), "serving", "chat-abc-0-1")
    with pytest.raises(GroupLaunchError, match="no subdomain"):
        group_hosts.check_host(Pods(subdomain=None), "serving", "chat-abc-0-1")

    def unreachable(address, timeout):
        raise TimeoutError("timed out")
    monkeypatch.setattr(group_hosts.socket, "create_connection", unreachable)
    with pytest.raises(GroupLaunchError, match=r"chat-abc-0-1.chat-abc.serving \(127.0.0.1\) is not reachable"):
        group_hosts.check_host(Pods(), "serving", "chat-abc-0-1")
    monkeypatch.setattr(group_hosts.socket, "gethostbyname", lambda name: "10.244.1.9")
    with pytest.raises(GroupLaunchError, match="resolves to 10.244.1.9, the pod's IP is 127.0.0.1"):
        group_hosts.check_host(Pods(), "serving", "chat-abc-0-1")


def _pod(uid="u1", phase="Running", restarts=0, terminated=False):
    state = SimpleNamespace(terminated=SimpleNamespace(exit_code=0) if terminated else None)
    return SimpleNamespace(metadata=SimpleNamespace(uid=uid), status=SimpleNamespace(phase=phase, container_statuses=[
        SimpleNamespace(name=serving.CONTAINER, restart_count=restarts, state=state)]))


def test_a_hosts_ranks_are_lost_with_its_pod_or_its_containers_end_or_restart():
    launched = group_hosts.host_identity(_pod())
    assert launched == HostIdentity("u1", ((serving.CONTAINER, 0),))
    assert lost_reason(_pod(), launched) is None
    assert lost_reason(None, launched) == "its pod is gone"
    assert lost_reason(_pod(uid="u2"), launched) == "its pod was replaced"
    assert lost_reason(_pod(phase="Failed"), launched) == "its pod is Failed"
    assert lost_reason(_pod(terminated=True), launched) == f"its container {serving.CONTAINER} ended"
    assert lost_reason(_pod(restarts=1), launched) == f"its container {serving.CONTAINER} restarted"


class Watch:
    """Reports a lost host from its `after`th read on (never with None)."""

    def __init__(self, after: int | None = None):
        self.after, self.reads = after, 0

    def lost(self):
        self.reads += 1
        return "host w: its pod is gone" if self.after is not None and self.reads >= self.after else None


def test_rank_zero_is_killed_and_mpirun_exits_1_when_a_host_is_lost(monkeypatch, capsys):
    monkeypatch.setattr(mpirun, "HOST_POLL_SECONDS", 0.05)
    monkeypatch.setattr(mpirun.signal, "signal", lambda number, handler: None)
    watch = Watch(after=3)
    assert mpirun.supervise(sys.executable, ["python", "-c", "import time; time.sleep(60)"], {}, watch) == 1
    assert watch.reads == 3
    assert "host w: its pod is gone, and with it that host's ranks; aborting the job" in capsys.readouterr().err


def test_while_the_hosts_live_mpirun_passes_signals_on_and_exits_as_rank_zero_does(monkeypatch, tmp_path):
    monkeypatch.setattr(mpirun, "HOST_POLL_SECONDS", 0.05)
    assert mpirun.supervise(sys.executable, ["python", "-c", "raise SystemExit(3)"], {}, Watch()) == 3
    handlers = {}
    monkeypatch.setattr(mpirun.signal, "signal", lambda number, handler: handlers.__setitem__(number, handler))
    # Rank 0 reports the signal it got by its exit status; the marker says its handler is in place.
    marker = tmp_path / "ready"
    script = ("import pathlib, signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
              f"pathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)")

    class Stopper:
        stopped = False

        def lost(self):
            if marker.exists() and not self.stopped:
                handlers[signal.SIGTERM](signal.SIGTERM, None)  # the kubelet's stop, to mpirun
                self.stopped = True
            return None
    assert mpirun.supervise(sys.executable, ["python", "-c", script], {}, Stopper()) == 42
    assert set(mpirun.FORWARDED_SIGNALS) <= set(handlers)
