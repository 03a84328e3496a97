"""Replicas that span nodes in the sandbox, against a replica of one node: apply to Ready, and the
restart after a pod of the replica is deleted.

- a two-node replica: Llama 3.1 405B in BF16, TP8 PP2, a LeaderWorkerSet group of two pods of 8
  H100s each; the worker pod is deleted, and the whole group is recreated (the LeaderWorkerSet's
  RecreateGroupOnPodRestart): the leader waits for its worker, then mpirun starts the ranks;
- a one-node replica: Llama 3.1 70B in BF16 on one H100 node of 8 (a Deployment); its pod is
  deleted and its ReplicaSet makes another.

Apply to Ready: from the create call to the LLMDeployment's Ready condition, each run a new engine
revision so that the emulated engine build runs. Restart: from the delete call until every pod of
the replica is a new one and Ready. Both replicas run the engine runtime with the same settings.
Starts its own sandbox (two H100 nodes) and operator, one replica at a time. Prints markdown,
writes docs/benchmarks/groups.md and appends to groups-log.md (`--smoke`: one run of each,
printed, nothing written). Needs root; runs beside a default sandbox (instance 1,
LLMFLEET_BENCH_INSTANCE moves it). Run: sudo .venv/bin/python benchmarks/bench_groups.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "groups.md"
LOG = REPO / "docs" / "benchmarks" / "groups-log.md"
LOG_HEADER = """# bench_groups.py runs

Every run, kept (misses too).

| when | commit | replica | apply to Ready p50 / max | restart p50 / max | runs |
|---|---|---|---:|---:|---:|
"""
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "e2e"))

from bench_sandbox import append_run, commit, run, sandbox_with_operator  # noqa: E402
from conftest import llm_deployment, spanning_405b  # noqa: E402
from operator_fixtures import RANK_LAUNCHER_RBAC, chart_templates  # noqa: E402

from llmfleet.render import group, serving  # noqa: E402
from llmfleet.render.identity import COMPONENT_LABEL, DEPLOYMENT_LABEL  # noqa: E402

NAMESPACE = "bench-groups"
RUNS = 3
READY_TIMEOUT_S = 900
RESTART_TIMEOUT_S = 600
ENGINE = {"runtime": "engine", "maxBatchSize": 4, "maxInputLen": 1024, "maxSeqLen": 2048, "maxNumTokens": 2048}


def two_nodes(name: str, engine_revision: str) -> dict:
    return spanning_405b(name, NAMESPACE, engine={**ENGINE, "revision": engine_revision})


def one_node(name: str, engine_revision: str) -> dict:
    """Llama 3.1 70B in BF16 on eight H100s of one node: the same node's worth as a part of the group."""
    return llm_deployment(name, NAMESPACE, "llama-3.1-70b", engine={**ENGINE, "revision": engine_revision},
                          workload=spanning_405b(name, NAMESPACE)["spec"]["workload"],
                          slo={"ttftP99Ms": 5000, "tpotP99Ms": 200, "quality": {"allowedQuantizations": ["BF16"]}},
                          resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
                          plan={"replicas": 1, "tensorParallelSize": 8})


# (label, manifest, pods per replica)
REPLICAS = (("two-node replica (405B BF16, TP8 PP2, a LeaderWorkerSet group of 2 pods)", "group", two_nodes, 2),
            ("one-node replica (70B BF16, TP8, a Deployment's pod)", "single", one_node, 1))


def _is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _pods(core, name: str) -> list:
    """The replica's serving pods: a group's leader and worker, or the one pod."""
    selector = f"{DEPLOYMENT_LABEL}={name},{COMPONENT_LABEL} in ({serving.COMPONENT},{group.WORKER_COMPONENT})"
    return [pod for pod in core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
            if pod.metadata.deletion_timestamp is None]


def timed_ready(custom, body: dict) -> float:
    name = body["metadata"]["name"]
    started = time.monotonic()
    custom.create_namespaced_custom_object("llmfleet.io", "v1alpha1", NAMESPACE, "llmdeployments", body)
    while True:
        obj = custom.get_namespaced_custom_object("llmfleet.io", "v1alpha1", NAMESPACE, "llmdeployments", name)
        if any(c["type"] == "Ready" and c["status"] == "True" for c in (obj.get("status") or {}).get("conditions") or []):
            return time.monotonic() - started
        if time.monotonic() - started > READY_TIMEOUT_S:
            raise TimeoutError(f"{name} not Ready after {READY_TIMEOUT_S} s: {(obj.get('status') or {}).get('conditions')}")
        time.sleep(0.2)


def timed_restart(core, name: str, pods_per_replica: int) -> float:
    """Delete the replica's last pod (a group's worker, or the only pod) and time until every pod
    of the replica is new and Ready."""
    before = sorted(_pods(core, name), key=lambda pod: pod.metadata.name)
    assert len(before) == pods_per_replica and all(map(_is_ready, before)), [p.metadata.name for p in before]
    uids = {pod.metadata.uid for pod in before}
    started = time.monotonic()
    core.delete_namespaced_pod(before[-1].metadata.name, NAMESPACE)
    while True:
        pods = _pods(core, name)
        if (len(pods) == pods_per_replica and not uids & {pod.metadata.uid for pod in pods}
                and all(map(_is_ready, pods))):
            return time.monotonic() - started
        if time.monotonic() - started > RESTART_TIMEOUT_S:
            raise TimeoutError(f"{name} not restarted after {RESTART_TIMEOUT_S} s")
        time.sleep(0.2)


def measure(custom, core, env, key: str, manifest, pods_per_replica: int, runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"ready": [], "restart": []}
    for index in range(runs):
        name = f"{key}-{index}"
        times["ready"].append(timed_ready(custom, manifest(name, f"bench-{index}")))
        times["restart"].append(timed_restart(core, name, pods_per_replica))
        run(["kubectl", "delete", "llmdeployment", name, "-n", NAMESPACE, "--wait=true"], env, timeout=300)
        # The next replica starts on nodes this one has left: its GPUs, and its build's.
        deadline = time.monotonic() + 300
        while core.list_namespaced_pod(NAMESPACE, label_selector=f"{DEPLOYMENT_LABEL}={name}").items:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}'s pods not gone 300 s after its deletion")
            time.sleep(0.5)
    return times


def _p50_max(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s | {max(values):.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs of each replica (default {RUNS})")
    parser.add_argument("--smoke", action="store_true", help="one run of each, printed; nothing written")
    args = parser.parse_args()
    runs = 1 if args.smoke else args.runs
    from kubernetes import client, config

    measured = commit()  # the code the operator runs: it is started now, edits later do not count
    with sandbox_with_operator(NAMESPACE) as (env, _):
        # The group leader's ServiceAccount is bound to the chart's ClusterRole, as the operator names it.
        run(["kubectl", "apply", "-f", "-"], env, input=chart_templates(env, RANK_LAUNCHER_RBAC))
        config.load_kube_config(env["KUBECONFIG"])
        custom, core = client.CustomObjectsApi(), client.CoreV1Api()
        results = {label: measure(custom, core, env, key, manifest, pods, runs)
                   for label, key, manifest, pods in REPLICAS}
    lines = [
        "# Replicas that span nodes", "",
        "Generated by `sudo .venv/bin/python benchmarks/bench_groups.py`: a fresh sandbox of two H100 nodes, "
        "the operator on the host, one LLMDeployment at a time, the engine runtime (an emulated engine build "
        "per run). Apply to Ready: create to the Ready condition. Restart: a pod of the replica deleted (the "
        "group's worker) to every pod of the replica new and Ready.",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, "
        f"commit {measured}; every run is in [groups-log.md](groups-log.md).", "",
        "| replica | apply to Ready p50 | max | restart p50 | max | runs |", "|---|---:|---:|---:|---:|---:|",
    ]
    for label, times in results.items():
        lines.append(f"| {label} | {_p50_max(times['ready'])} | {_p50_max(times['restart'])} | {runs} |")
    lines += ["", "Raw: " + "; ".join(
        f"{label.split(' (')[0]}: ready {', '.join(f'{t:.1f}' for t in times['ready'])} s, restart "
        f"{', '.join(f'{t:.1f}' for t in times['restart'])} s" for label, times in results.items()) + ".", ""]
    text = "\n".join(lines)
    print(text)
    if not args.smoke:
        for label, times in results.items():
            append_run(LOG, LOG_HEADER, f"| {time.strftime('%Y-%m-%d %H:%M')} | {measured} | {label.split(' (')[0]} | "
                                        f"{statistics.median(times['ready']):.1f} / {max(times['ready']):.1f} s | "
                                        f"{statistics.median(times['restart']):.1f} / {max(times['restart']):.1f} s | "
                                        f"{runs} |")
        REPORT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
