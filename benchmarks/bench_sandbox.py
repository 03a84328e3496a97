"""Sandbox benchmarks: control-plane build, warm `sandbox up`, pod scheduled to
Ready with Triton, and the memory of the idle sandbox.

Prints markdown and writes docs/benchmarks/sandbox.md. Needs root and no other
sandbox running. Run: sudo .venv/bin/python benchmarks/bench_sandbox.py [--cold-build]
(--cold-build rebuilds the control plane with empty Go build caches: minutes.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "e2e"))

from conftest import Sandbox  # noqa: E402 - the e2e tests' handle on a sandbox
from triton_fixtures import model_repository_config_map, service, triton_deployment  # noqa: E402

import yaml  # noqa: E402

REPORT = REPO / "docs" / "benchmarks" / "sandbox.md"
SANDBOX_LOG = REPO / "docs" / "benchmarks" / "sandbox-log.md"
SANDBOX_LOG_HEADER = """# bench_sandbox.py runs

Every run, kept (misses too).

| when | commit | cold build | warm up (median) | pod to Ready (median) | idle PSS |
|---|---|---:|---:|---:|---:|
"""
LLMFLEET = [sys.executable, "-m", "llmfleet", "sandbox"]
UP_RUNS = 3
POD_RUNS = 5


# Beside a sandbox of the default instance (`make sandbox`): own bridge, subnets and ports
# (LLMFLEET_BENCH_INSTANCE: another, beside a test run's).
BENCH_INSTANCE = os.environ.get("LLMFLEET_BENCH_INSTANCE", "1")


def state_env(state_dir) -> dict[str, str]:
    """The environment of a sandbox kept in `state_dir`."""
    return {**os.environ, "LLMFLEET_SANDBOX_DIR": str(state_dir), "LLMFLEET_SANDBOX_INSTANCE": BENCH_INSTANCE}


def commit() -> str:
    """The commit measured, marked when the tree had uncommitted changes."""
    def git(*argv):
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain") else "")


def append_run(log: Path, header: str, row: str) -> None:
    """One row per run in a benchmark's log (created with `header`, a table head): every run is
    kept, misses too."""
    if not log.exists():
        log.write_text(header)
    with log.open("a") as handle:
        handle.write(row + "\n")


def run(argv, env, **kwargs):
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True, **kwargs)


@contextlib.contextmanager
def sandbox_with_operator(namespace: str, up_args: tuple[str, ...] = ()):
    """A fresh sandbox (`sandbox up` with `up_args`) with the CRD, `namespace` and the operator
    on the host (autoscaling on the sandbox's Prometheus). Yields (env, state dir); stops all
    of it."""
    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as state:
        base_env = state_env(state)
        run([*LLMFLEET, "up", *up_args], base_env)
        operator = None
        try:
            env = sandbox_env(Path(state))
            Sandbox(Path(state), env).install_crds()  # waits until the apiserver serves them
            run(["kubectl", "create", "namespace", namespace], env)
            operator = subprocess.Popen([sys.executable, "-m", "llmfleet", "run"],
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
            yield env, Path(state)
        finally:
            if operator is not None:
                os.killpg(operator.pid, signal.SIGTERM)
                operator.wait(timeout=30)
            run([*LLMFLEET, "down", "--purge"], base_env)


def cold_build_seconds() -> float:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as gocache:
        env = {**os.environ, "LLMFLEET_CACHE": cache, "GOCACHE": gocache}
        started = time.monotonic()
        # What `sandbox up` builds: the control plane and helm, then the LeaderWorkerSet controller.
        for script in ("build.sh", "lws.sh"):
            subprocess.run([str(REPO / "operator" / "controlplane" / script)], env=env, check=True,
                           stdout=subprocess.DEVNULL)
        return time.monotonic() - started


def sandbox_env(state_dir: Path) -> dict[str, str]:
    env = state_env(state_dir)
    for line in run([*LLMFLEET, "env"], env).stdout.splitlines():
        name, value = line.removeprefix("export ").split("=", 1)
        env[name] = value.replace("$PATH", os.environ["PATH"])
    return env


def warm_up_seconds() -> list[float]:
    """Fresh state each time: certificates, etcd and nodes from scratch, binaries cached."""
    timings = []
    for _ in range(UP_RUNS):
        with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as state:
            env = state_env(state)
            started = time.monotonic()
            run([*LLMFLEET, "up"], env)
            timings.append(time.monotonic() - started)
            run([*LLMFLEET, "down", "--purge"], env)
    return timings


def sandbox_pss_bytes(state_dir: Path) -> int:
    """Proportional set size of every sandbox process and its descendants."""
    roots = {json.loads(p.read_text())["pid"] for p in (state_dir / "pids").glob("*.json")}
    parents = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass

    def in_sandbox(pid):
        while pid > 1:
            if pid in roots:
                return True
            pid = parents.get(pid, 0)
        return False

    total = 0
    for pid in parents:
        if in_sandbox(pid):
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                pass
    return total


def _is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def pod_scheduled_to_ready_seconds(env: dict[str, str]) -> list[float]:
    """Scale a Triton Deployment 0 -> 1 and time, on a pod watch, from the pod
    being bound to a node to its Ready condition."""
    from kubernetes import client, config, watch

    config.load_kube_config(env["KUBECONFIG"])
    core = client.CoreV1Api()
    manifests = [model_repository_config_map("bench-repo", load_delay_seconds=0),
                 triton_deployment("bench-triton", "bench-repo", replicas=0), service("bench-triton")]
    run(["kubectl", "apply", "-f", "-"], env, input=yaml.safe_dump_all(manifests))
    timings = []
    for _ in range(POD_RUNS):
        version = core.list_namespaced_pod("default").metadata.resource_version
        run(["kubectl", "scale", "deployment", "bench-triton", "--replicas=1"], env)
        scheduled_at = None
        stream = watch.Watch()
        for event in stream.stream(core.list_namespaced_pod, "default", label_selector="app=bench-triton",
                                   resource_version=version, timeout_seconds=120):
            pod = event["object"]
            if scheduled_at is None and pod.spec.node_name:
                scheduled_at = time.monotonic()
            if scheduled_at is not None and _is_ready(pod):
                timings.append(time.monotonic() - scheduled_at)
                stream.stop()
        run(["kubectl", "scale", "deployment", "bench-triton", "--replicas=0"], env)
        while core.list_namespaced_pod("default", label_selector="app=bench-triton").items:
            time.sleep(0.2)
    run(["kubectl", "delete", "-f", "-"], env, input=yaml.safe_dump_all(manifests))
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-build", action="store_true",
                        help="also time a control-plane (and LeaderWorkerSet controller) build with empty "
                             "Go build caches")
    args = parser.parse_args()
    measured = commit()
    rows = []
    if args.cold_build:
        seconds = cold_build_seconds()
        rows.append(("cold build of etcd, kube-apiserver, controller-manager, scheduler, kubectl, helm, "
                     "lws-controller-manager (empty Go build cache, module cache warm)", f"{seconds / 60:.1f} min", "under 20 min"))
    up = warm_up_seconds()
    rows.append((f"warm `sandbox up` to nodes Ready and Prometheus ready (median of {UP_RUNS})",
                 f"{statistics.median(up):.1f} s", "under 30 s"))
    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as state:
        env = state_env(state)
        run([*LLMFLEET, "up"], env)
        try:
            env = sandbox_env(Path(state))
            time.sleep(10)
            idle_pss = sandbox_pss_bytes(Path(state))
            pod = pod_scheduled_to_ready_seconds(env)
        finally:
            run([*LLMFLEET, "down", "--purge"], env)
    rows.append((f"pod scheduled to Ready, Triton with a small python model (median of {POD_RUNS})",
                 f"{statistics.median(pod):.1f} s", "under 15 s"))
    rows.append(("memory of the idle sandbox (PSS of all its processes)",
                 f"{idle_pss / 2**30:.2f} GiB", "report; target under 2 GiB"))
    lines = [
        "# Sandbox benchmarks", "",
        "Generated by `sudo .venv/bin/python benchmarks/bench_sandbox.py"
        + (" --cold-build" if args.cold_build else "") + "`.",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, commit {measured}; every run is in [sandbox-log.md](sandbox-log.md).", "",
        "| measurement | result | target |", "|---|---:|---|",
        *[f"| {name} | {value} | {target} |" for name, value, target in rows], "",
        f"Raw: warm up {', '.join(f'{t:.1f}' for t in up)} s; "
        f"pod to Ready {', '.join(f'{t:.2f}' for t in pod)} s.", "",
    ]
    text = "\n".join(lines)
    print(text)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    append_run(SANDBOX_LOG, SANDBOX_LOG_HEADER,
               f"| {time.strftime('%Y-%m-%d %H:%M')} | {measured} | "
               + (f"{seconds / 60:.1f} min" if args.cold_build else "-")
               + f" | {statistics.median(up):.1f} s | {statistics.median(pod):.1f} s | {idle_pss / 2**30:.2f} GiB |")
    if args.cold_build or not REPORT.exists():
        REPORT.write_text(text)
    else:
        # Keep the last cold-build row when this run did not measure it.
        old_rows = [line for line in REPORT.read_text().splitlines() if line.startswith("| cold build")]
        REPORT.write_text(text.replace("|---|---:|---|\n", "|---|---:|---|\n" + "".join(r + "\n" for r in old_rows), 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
