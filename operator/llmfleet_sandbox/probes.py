"""Readiness, liveness and startup probes, executed like the kubelet does."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


def resolve_port(port, container: dict) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f'container "{container["name"]}" declares no port named "{port}"')


def run_probe(probe: dict, container: dict, pod_ip: str, exec_prefix: list[str],
              exec_env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Run one probe attempt; return (success, message for events).

    An exec handler runs behind `exec_prefix` (which enters the container) with the
    container's environment `exec_env`, as the kubelet's exec does."""
    timeout = probe.get("timeoutSeconds", 1)
    try:
        if "httpGet" in probe:
            action = probe["httpGet"]
            port = resolve_port(action["port"], container)
            scheme = action.get("scheme", "HTTP").lower()
            host = action.get("host") or pod_ip
            url = f"{scheme}://{host}:{port}{action.get('path', '/')}"
            request = urllib.request.Request(url, headers={
                header["name"]: header["value"] for header in action.get("httpHeaders") or []})
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    ok = 200 <= response.status < 400
                    return ok, f"HTTP probe {url} returned {response.status}"
            except urllib.error.HTTPError as error:
                return False, f"HTTP probe {url} failed with statuscode: {error.code}"
        if "tcpSocket" in probe:
            port = resolve_port(probe["tcpSocket"]["port"], container)
            with socket.create_connection((probe["tcpSocket"].get("host") or pod_ip, port),
                                          timeout=timeout):
                return True, "TCP probe connected"
        if "exec" in probe:
            result = subprocess.run(exec_prefix + probe["exec"]["command"], timeout=timeout,
                                    capture_output=True, env=exec_env)
            return result.returncode == 0, f"exec probe exited {result.returncode}"
        return False, "probe has no handler (httpGet, tcpSocket or exec)"
    except (OSError, ValueError, subprocess.TimeoutExpired, urllib.error.URLError) as error:
        return False, f"probe failed: {error}"


def run_lifecycle_hook(hook: dict, container: dict, pod_ip: str, exec_prefix: list[str],
                       timeout_seconds: float, exec_env: dict[str, str] | None = None) -> tuple[bool, str]:
    """Run a preStop/postStart handler (exec, httpGet or sleep) within timeout_seconds."""
    if "sleep" in hook:
        time.sleep(max(0.0, min(hook["sleep"]["seconds"], timeout_seconds)))
        return True, "slept"
    return run_probe({**hook, "timeoutSeconds": max(timeout_seconds, 0.001)}, container, pod_ip,
                     exec_prefix, exec_env)


@dataclass
class ProbeState:
    """Consecutive results of one probe against one container run."""

    spec: dict
    started_at: float
    successes: int = 0
    failures: int = 0
    last_run: float | None = None
    passing: bool | None = None

    def due(self, now: float) -> bool:
        if now - self.started_at < self.spec.get("initialDelaySeconds", 0):
            return False
        return self.last_run is None or now - self.last_run >= self.spec.get("periodSeconds", 10)

    def pass_tick(self, now: float) -> None:
        """Let a due tick go by unprobed. The kubelet's readiness and liveness workers tick on
        their own period from container start and skip while the startup probe has not
        passed, so the first readiness probe comes up to a period after startup succeeds."""
        if self.due(now):
            self.last_run = now

    def record(self, ok: bool, now: float) -> None:
        """Apply success/failure thresholds; `passing` flips only when one is reached."""
        self.last_run = now
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= self.spec.get("successThreshold", 1):
                self.passing = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= self.spec.get("failureThreshold", 3):
                self.passing = False


def new_probe(spec: dict | None) -> ProbeState | None:
    return ProbeState(spec, time.monotonic()) if spec else None
