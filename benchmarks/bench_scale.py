"""Scale: many LLMDeployments on one operator in a fresh sandbox.

Every deployment plans for A100s, which no sandbox node has: its build Job stays Pending
(Unschedulable) and it serves no replica, so the machine's two cores go to the control
plane and the operator, not to emulated engines. The operator runs on the host as the
chart's ServiceAccount, leader-elected like a chart replica; the apiserver's audit log
counts its requests.

Measures: apply to the last child (the PodDisruptionBudget) existing, p50/p99 over a burst
of creates; steady-state API requests per second by verb once nothing changes (goal: no
writes); the operator's RSS; and after an operator restart with every Service deleted while
it was down, the time until all are back.
Prints markdown and writes docs/benchmarks/scale.md. Needs root and no other sandbox running.
Run: sudo .venv/bin/python benchmarks/bench_scale.py [--count 1000]   (about 20 minutes)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "scale.md"
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sandbox import LLMFLEET, run, sandbox_env, state_env  # noqa: E402
from conftest import Sandbox  # noqa: E402 - the e2e tests' handle on a sandbox
from operator_fixtures import (  # noqa: E402
    OPERATOR_NAMESPACE,
    SERVICE_ACCOUNT,
    OperatorProcess,
    chart_rbac_manifests,
    operator_kubeconfig,
)

NAMESPACE = "scale"
CREATE_THREADS = 8
STEADY_SECONDS = 60
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def manifest(name: str) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"runtime": "engine"},
            "slo": {"ttftP99Ms": 1000, "tpotP99Ms": 60},
            "workload": {"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64,
                         "outputTokensP99": 128, "peakRequestsPerSecond": 1},
            "resources": {"allowedGpuTypes": ["A100-SXM-80GB"], "gpuBudget": 8},
        },
    }


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class FirstSeen:
    """When each deployment's PodDisruptionBudget (its last child) was first seen, by watch."""

    def __init__(self, policy):
        self.policy, self.seen, self.stop = policy, {}, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        from kubernetes import watch

        while not self.stop.is_set():
            for event in watch.Watch().stream(self.policy.list_namespaced_pod_disruption_budget, NAMESPACE,
                                              timeout_seconds=5):
                owner = event["object"].metadata.labels.get("llmfleet.io/deployment")
                self.seen.setdefault(owner, time.monotonic())


def steady_requests(audit_log: Path, since: datetime.datetime, seconds: float) -> tuple[Counter, Counter]:
    """The operator's requests per second in the audit log from `since`, by verb and resource
    (with subresource): (on its LLMDeployments and their children, on its leader-election Lease)."""
    work, lease = Counter(), Counter()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        received = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if event["user"]["username"] == OPERATOR_USER and received >= since:
            target = event.get("objectRef") or {}
            resource = "/".join(filter(None, (target.get("resource"), target.get("subresource"))))
            counts = lease if target.get("resource") == "leases" else work
            counts[event["verb"], resource] += 1
    return (Counter({key: count / seconds for key, count in work.items()}),
            Counter({key: count / seconds for key, count in lease.items()}))


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="LLMDeployments to create (default 1000)")
    args = parser.parse_args()
    from kubernetes import client, config

    with tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as state:
        base_env = state_env(state)
        run([*LLMFLEET, "up"], base_env)
        operator = None
        try:
            env = sandbox_env(Path(state))
            sandbox = Sandbox(Path(state), env)
            sandbox.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
            sandbox.kubectl("wait", "--for=condition=Established", "crd/llmdeployments.llmfleet.io")
            for namespace in (NAMESPACE, OPERATOR_NAMESPACE):
                sandbox.kubectl("create", "namespace", namespace)
            sandbox.kubectl("apply", "-f", "-", input_text=chart_rbac_manifests(sandbox))
            operator = OperatorProcess(sandbox, operator_kubeconfig(sandbox, Path(state) / "operator.kubeconfig"),
                                       Path(state) / "operator.log", identity="bench-operator")
            operator.start()
            config.load_kube_config(env["KUBECONFIG"])
            custom, policy, core = client.CustomObjectsApi(), client.PolicyV1Api(), client.CoreV1Api()
            rss_idle = rss_mib(operator.process.pid)

            seen = FirstSeen(policy)
            seen.thread.start()
            names = [f"scale-{index:04d}" for index in range(args.count)]
            created = {}

            def create(name: str) -> None:
                custom.create_namespaced_custom_object("llmfleet.io", "v1alpha1", NAMESPACE, "llmdeployments",
                                                       manifest(name))
                created[name] = time.monotonic()

            print(f"creating {args.count} LLMDeployments", file=sys.stderr, flush=True)
            burst_started = time.monotonic()
            with ThreadPoolExecutor(CREATE_THREADS) as pool:
                list(pool.map(create, names))
            creates_s = time.monotonic() - burst_started
            wait_until(lambda: all(name in seen.seen for name in names), 1800, "every deployment's children",
                       interval_s=2)
            all_children_s = max(seen.seen[name] for name in names) - burst_started
            latencies_s = [seen.seen[name] - created[name] for name in names]
            seen.stop.set()

            print("waiting for the status of every deployment to settle", file=sys.stderr, flush=True)
            wait_until(lambda: all((item.get("status") or {}).get("conditions") for item in custom.list_namespaced_custom_object(
                "llmfleet.io", "v1alpha1", NAMESPACE, "llmdeployments")["items"]), 600, "every status written", 5)
            time.sleep(30)
            since = datetime.datetime.now(datetime.timezone.utc)
            time.sleep(STEADY_SECONDS)
            steady, lease = steady_requests(Path(state) / "logs" / "kube-apiserver-audit.log", since,
                                            STEADY_SECONDS)
            rss_settled = rss_mib(operator.process.pid)

            print("restarting the operator with every Service deleted meanwhile", file=sys.stderr, flush=True)
            operator.stop()
            sandbox.kubectl("delete", "services", "--all", "-n", NAMESPACE, timeout=600)
            restarted = time.monotonic()
            operator.start()
            wait_until(lambda: len(core.list_namespaced_service(NAMESPACE).items) >= args.count, 1800,
                       "every Service restored", interval_s=1)
            recovery_s = time.monotonic() - restarted
            rss_recovered = rss_mib(operator.process.pid)
        finally:
            if operator is not None:
                operator.stop(signal.SIGTERM)
            run([*LLMFLEET, "down", "--purge"], base_env)

    writes = sum(rate for (verb, _), rate in steady.items() if verb in WRITE_VERBS)
    reads = sum(rate for (verb, _), rate in steady.items() if verb not in WRITE_VERBS)
    lines = [
        "# Scale benchmarks", "",
        f"Generated by `sudo .venv/bin/python benchmarks/bench_scale.py --count {args.count}`: a fresh "
        "sandbox, the operator on the host as the chart's ServiceAccount (leader-elected; its ticker passes only "
        f"deployments that time can change, and every one each resync interval); {args.count} LLMDeployments (Llama 3.1 8B) created by {CREATE_THREADS} client threads. Each "
        "plans for A100s, which no sandbox node has, so its build Job stays Pending and no engine runs: "
        "what is measured is the operator and the control plane. Machine: "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}.", "",
        "| measurement | result | goal |", "|---|---:|---|",
        f"| apply to the last child existing, p50 | {statistics.median(latencies_s):.2f} s | report |",
        f"| apply to the last child existing, p99 | {percentile(latencies_s, 0.99):.2f} s | under 2 s |",
        f"| all {args.count} created (client) / all with children | {creates_s:.0f} s / {all_children_s:.0f} s | report |",
        f"| steady state (from 30 s after every status was first written): the operator's writes per second | {writes:.2f} | near zero |",
        f"| the same window: the operator's reads per second (get, list, watch) | {reads:.2f} | report |",
        f"| the same window: leader election (Lease get and update, every 2 s) per second | "
        f"{sum(lease.values()):.2f} | report |",
        f"| operator RSS: idle / {args.count} settled / after the restart | {rss_idle:.0f} / {rss_settled:.0f} / "
        f"{rss_recovered:.0f} MiB | under 500 MB |",
        f"| operator restart with all {args.count} Services deleted meanwhile, to all restored | {recovery_s:.0f} s | report |",
        "",
        "Steady-state requests per second by verb, from the apiserver's audit log over "
        f"{STEADY_SECONDS} s, besides the Lease: "
        + (", ".join(f"{verb} {resource} {rate:.2f}" for (verb, resource), rate in sorted(steady.items()))
           or "none") + ". "
        "Kopf runs the (synchronous) handlers in a thread pool; a burst of creates queues there and at the "
        "apiserver, so apply-to-children latency under a burst is mostly waiting.", "",
    ]
    text = "\n".join(lines)
    print(text)
    REPORT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
