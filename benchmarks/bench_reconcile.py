"""Reconcile benchmarks in the sandbox: apply-to-children-created latency and
apply-to-Ready with the emulated engine build or checkpoint preparation, at the API's default
runtime (llmapi) and, beside it, the engine runtime.

Starts its own sandbox and operator (as on a user's machine: operator on the
host), prints markdown and writes docs/benchmarks/reconcile.md.
Needs root and no other sandbox running.
Run: sudo .venv/bin/python benchmarks/bench_reconcile.py
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "reconcile.md"
LOG = REPO / "docs" / "benchmarks" / "reconcile-log.md"
LOG_HEADER = """# bench_reconcile.py runs

Every run, kept (misses too). Goal: children created p50 under 1 s.

| when | commit | runtime | children created p50 / max | Ready, prepared p50 | Ready, from the cache p50 |
|---|---|---|---:|---:|---:|
"""
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sandbox import append_run, commit, run, sandbox_with_operator  # noqa: E402

CHILDREN_RUNS = 10
READY_RUNS = 3
NAMESPACE = "bench"
# The API's default first; the engine runtime (a TensorRT engine build) beside it.
RUNTIMES = ("llmapi", "engine")


def manifest(name: str, runtime: str, engine_revision: str = "1") -> dict:
    """`engine_revision` is part of the engine cache key: a new one makes the build (or the
    checkpoint's preparation) run."""
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"runtime": runtime, "revision": engine_revision},
            "slo": {"ttftP99Ms": 1000, "tpotP99Ms": 40,
                    "quality": {"allowedQuantizations": ["BF16", "FP8"]}},
            "workload": {"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64,
                         "outputTokensP99": 128, "peakRequestsPerSecond": 2},
            "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
        },
    }


def timed_create(custom, policy, name: str, runtime: str) -> float:
    """Seconds from the create call to the last child (the PodDisruptionBudget) existing."""
    from kubernetes import watch

    version = policy.list_namespaced_pod_disruption_budget(NAMESPACE).metadata.resource_version
    started = time.monotonic()
    custom.create_namespaced_custom_object("llmfleet.io", "v1alpha1", NAMESPACE, "llmdeployments",
                                           manifest(name, runtime))
    stream = watch.Watch()
    for _ in stream.stream(policy.list_namespaced_pod_disruption_budget, NAMESPACE,
                           label_selector=f"llmfleet.io/deployment={name}", resource_version=version,
                           timeout_seconds=30):
        stream.stop()
    return time.monotonic() - started


def timed_ready(custom, name: str, runtime: str, engine_revision: str) -> float:
    started = time.monotonic()
    custom.create_namespaced_custom_object("llmfleet.io", "v1alpha1", NAMESPACE, "llmdeployments",
                                           manifest(name, runtime, engine_revision))
    while True:
        obj = custom.get_namespaced_custom_object("llmfleet.io", "v1alpha1", NAMESPACE,
                                                  "llmdeployments", name)
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return time.monotonic() - started
        if time.monotonic() - started > 180:
            raise TimeoutError(f"{name} not Ready after 180 s")
        time.sleep(0.1)


def measure(custom, policy, env, runtime: str) -> dict[str, list[float]]:
    """Seconds to the children, then to Ready with the engine prepared by its first apply and
    found in the node's cache by the second."""
    times = {"children": [timed_create(custom, policy, f"children-{runtime}-{i}", runtime)
                          for i in range(CHILDREN_RUNS)], "prepared": [], "cached": []}
    run(["kubectl", "delete", "llmdeployments", "--all", "-n", NAMESPACE, "--wait=true"], env)
    for i in range(READY_RUNS):
        for kind in ("prepared", "cached"):
            name = f"ready-{runtime}-{i}-{kind}"
            times[kind].append(timed_ready(custom, name, runtime, engine_revision=f"bench-{i}"))
            run(["kubectl", "delete", "llmdeployment", name, "-n", NAMESPACE, "--wait=true"], env)
    return times


def main() -> int:
    from kubernetes import client, config

    measured = commit()  # the code the operator runs: it is started now, edits later do not count
    with sandbox_with_operator(NAMESPACE) as (env, _):
        config.load_kube_config(env["KUBECONFIG"])
        custom, policy = client.CustomObjectsApi(), client.PolicyV1Api()
        time.sleep(3)
        results = {runtime: measure(custom, policy, env, runtime) for runtime in RUNTIMES}
    lines = [
        "# Reconcile benchmarks", "",
        "Generated by `sudo .venv/bin/python benchmarks/bench_reconcile.py`: a fresh sandbox, the "
        "operator on the host, one LLMDeployment at a time (llama-3.1-8b, 1 GPU), at the API's default "
        "runtime (llmapi: the checkpoint prepared into the cache) and beside it the engine runtime "
        "(an emulated 5 s engine build).",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, "
        f"commit {measured}; every run is in [reconcile-log.md](reconcile-log.md).", "",
        "| runtime | measurement | p50 | max | target |", "|---|---|---:|---:|---|",
    ]
    for runtime, times in results.items():
        lines += [
            f"| {runtime} | apply to all five children created ({CHILDREN_RUNS} runs) | "
            f"{statistics.median(times['children']) * 1000:.0f} ms | {max(times['children']) * 1000:.0f} ms | "
            "p50 under 1 s |",
            f"| {runtime} | apply to Ready, engine prepared and Triton started ({READY_RUNS} runs) | "
            f"{statistics.median(times['prepared']):.1f} s | {max(times['prepared']):.1f} s | report |",
            f"| {runtime} | apply to Ready, engine found in the node's cache ({READY_RUNS} runs) | "
            f"{statistics.median(times['cached']):.1f} s | {max(times['cached']):.1f} s | report |"]
        append_run(LOG, LOG_HEADER,
                   f"| {time.strftime('%Y-%m-%d %H:%M')} | {measured} | {runtime} | "
                   f"{statistics.median(times['children']) * 1000:.0f} / {max(times['children']) * 1000:.0f} ms | "
                   f"{statistics.median(times['prepared']):.1f} s | {statistics.median(times['cached']):.1f} s |")
    lines += ["", "Raw: " + "; ".join(
        f"{runtime}: children {', '.join(f'{t * 1000:.0f}' for t in times['children'])} ms, prepared "
        f"{', '.join(f'{t:.1f}' for t in times['prepared'])} s, cached {', '.join(f'{t:.1f}' for t in times['cached'])} s"
        for runtime, times in results.items()) + ".", ""]
    text = "\n".join(lines)
    print(text)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
