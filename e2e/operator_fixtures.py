"""Run the operator against the sandbox with its own ServiceAccount identity,
so RBAC is exercised (the admin user would bypass it)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
OPERATOR_NAMESPACE = "llmfleet-system"
RELEASE = "llmfleet"
SERVICE_ACCOUNT = f"{RELEASE}-operator"
IN_CLUSTER_NAMESPACE = "in-cluster"
# The operator that test_operator_in_cluster.py installs with helm, and its namespace.
IN_CLUSTER_RELEASE = "llmfleet-ic"
IN_CLUSTER_RELEASE_NAMESPACE = "llmfleet-system-ic"
# The ClusterRole a group leader's ServiceAccount is bound to (replicas that span nodes).
RANK_LAUNCHER_RBAC = "rank-launcher-rbac.yaml"
# Live re-planning observes every 15 s over a minute, fitting from 100 requests: the defaults
# (5 minutes, 200) would make its test wait minutes; the mechanism is the same.
OBSERVATION_WINDOW_S = 60
LIVE_REPLANNING_FLAGS = ("--observation-interval-seconds", "15", "--observation-window-seconds",
                         str(OBSERVATION_WINDOW_S), "--observation-min-requests", "100")


def chart_templates(env: dict[str, str], *templates: str) -> str:
    """Templates of the chart (`templates/<name>`), rendered by the real helm for release RELEASE."""
    shown = [flag for template in templates for flag in ("--show-only", f"templates/{template}")]
    result = subprocess.run(["helm", "template", RELEASE, str(REPO_ROOT / "charts" / "llmfleet"), "--namespace",
                             OPERATOR_NAMESPACE, *shown], env=env, capture_output=True, text=True, check=True)
    return result.stdout


def chart_rbac_manifests(sandbox) -> str:
    """The chart's ServiceAccount and RBAC (the operator's, and the endpoint pickers' and rank
    launchers' ClusterRoles it binds)."""
    return chart_templates(sandbox.env, "serviceaccount.yaml", "rbac.yaml", "endpoint-picker-rbac.yaml",
                           RANK_LAUNCHER_RBAC)


def chart_operator_environment(sandbox) -> dict[str, str]:
    """The literal environment the chart gives the operator's container (not the ones taken
    from the pod, which a host process has no pod to read from)."""
    result = subprocess.run(
        ["helm", "template", RELEASE, str(REPO_ROOT / "charts" / "llmfleet"), "--namespace",
         OPERATOR_NAMESPACE, "--show-only", "templates/deployment.yaml"],
        env=sandbox.env, capture_output=True, text=True, check=True)
    (container,) = yaml.safe_load(result.stdout)["spec"]["template"]["spec"]["containers"]
    return {variable["name"]: variable["value"] for variable in container.get("env") or [] if "value" in variable}


def operator_kubeconfig(sandbox, path: Path) -> Path:
    """A kubeconfig that authenticates as the operator's ServiceAccount."""
    token = sandbox.kubectl("create", "token", SERVICE_ACCOUNT, "-n", OPERATOR_NAMESPACE,
                            "--duration=2h").strip()
    admin = yaml.safe_load(Path(sandbox.env["KUBECONFIG"]).read_text())
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": admin["clusters"][0]["name"],
                                                      "user": SERVICE_ACCOUNT}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorProcess:
    """An operator replica on the host, leader-elected on the chart's Lease, with the chart's
    environment and `llmfleet run`'s defaults unless `extra_args` says otherwise. `identity` names
    it in the Lease: the session's operator keeps one across restarts, so a restart takes its
    lease back at once instead of waiting out the dead process's."""

    def __init__(self, sandbox, kubeconfig: Path, log_path: Path, identity: str, extra_args: tuple[str, ...] = ()):
        self.sandbox = sandbox
        self.extra_args = extra_args
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.identity = identity
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self._stopped = threading.Event()
        # start, stop and the supervisor's check-and-restart exclude each other: a restart must
        # never launch a second process beside the one `start` just launched.
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None
        self.environment = {**sandbox.env, **chart_operator_environment(sandbox), "PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        """Start it, and restart it whenever it exits until `stop`, as the kubelet restarts the
        chart's pod: a leader that cannot renew its Lease for 10 s (the API down) exits."""
        with self._lock:
            self._stopped.clear()
            self._launch()
            if self._supervisor is None or not self._supervisor.is_alive():
                self._supervisor = threading.Thread(target=self._supervise, daemon=True)
                self._supervisor.start()

    def _supervise(self) -> None:
        while True:  # for the life of the test session (a daemon thread)
            time.sleep(1.0)
            with self._lock:
                if not self._stopped.is_set() and self.process is not None and self.process.poll() is not None:
                    self.restarts += 1
                    self._launch()

    def _launch(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llmfleet", "run", "--kubeconfig", str(self.kubeconfig),
             "--leader-election-namespace", OPERATOR_NAMESPACE, "--leader-election-identity", self.identity,
             *self.extra_args,
             # The helm-installed operator of test_operator_in_cluster.py alone serves that namespace.
             "--namespace", f"!{IN_CLUSTER_NAMESPACE}"],
            env=self.environment, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        with self._lock:
            self._stopped.set()
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        return self.log_path.read_bytes()[offset:].decode(errors="replace")


def decode_secret_value(value: str) -> str:
    return base64.b64decode(value).decode()
