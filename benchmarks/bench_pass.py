"""Reconcile pass time without a cluster, before and after a change, in one run.

Two measurements of `llmfleet.reconcile.reconcile` with a gateway that writes nowhere (what a
pass costs the operator itself, not the apiserver):
- pass time p50/p99 over 1000 settled deployments (each passed three times);
- four workers (the operator's pass workers) passing 200 settled deployments queued behind four
  canaries whose golden-prompt gate hangs (listing their pods takes HANG_S): how long each
  settled deployment waits from being queued to its pass ending (goal: unaffected).

`--before COMMIT` measures that commit too, from a git worktree, with the same script; each
side prints one JSON line. Writes docs/benchmarks/pass.md and appends to pass-log.md.
Run: .venv/bin/python benchmarks/bench_pass.py --before 50fbcbb
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "pass.md"
LOG = REPO / "docs" / "benchmarks" / "pass-log.md"
DEPLOYMENTS = 1000
ROUNDS = 3
WORKERS = 4  # handlers.py: half of Kopf's eight executor threads drain the pass queue
HUNG_CANARIES = 4
QUEUED_BEHIND = 200
HANG_S = 5.0  # the real gate gives up after 60 s
NOW = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.timezone.utc)


class NullGateway:
    """Takes every write; listing a hung canary's pods takes HANG_S."""

    def __init__(self, hung: set[str] = frozenset()):
        self.hung = hung
        self.applied: list[dict] = []

    def ensure(self, manifest):
        pass

    def apply(self, manifest, live=None):
        self.applied.append(manifest)

    def delete(self, child):
        pass

    def patch_status(self, namespace, name, status, resource_version=None):
        return True

    def emit_event(self, obj, event_type, reason, message):
        pass

    def list_pods(self, namespace, selector):
        if any(f"llmfleet.io/deployment={name}" in selector for name in self.hung):
            time.sleep(HANG_S)
        return []

    def config_map_value(self, namespace, name, key):
        return None


def manifest(name: str, engine_revision: str, generation: int, status: dict | None, quality: bool) -> dict:
    spec = {
        "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
        "engine": {"revision": engine_revision},
        "slo": {"ttftP99Ms": 1000, "tpotP99Ms": 40},
        "workload": {"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64,
                     "outputTokensP99": 128, "peakRequestsPerSecond": 2},
        "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
        "plan": {"replicas": 2},
        "rollout": {"steps": [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}],
                    **({"quality": {"prompts": ["What is 2+2?"]}} if quality else {})},
    }
    return {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "generation": generation},
            "spec": spec, **({"status": status} if status else {})}


def finished(objects: list[dict], kind: str, revision: str | None = None, **status) -> dict:
    obj = next(o for o in reversed(objects) if o["kind"] == kind
               and (revision is None or o["metadata"]["labels"].get("llmfleet.io/revision") == revision))
    done = copy.deepcopy(obj)
    done["status"] = status
    return done


def one_pass(reconcile, settings, body: dict, children: list[dict], **kwargs):
    kube = NullGateway()
    outcome = reconcile(copy.deepcopy(body), kube, settings, NOW, children=children, **kwargs)
    return outcome, kube.applied


def settled(reconcile, settings, name: str) -> tuple[dict, list[dict]]:
    """A deployment rolled out and serving: (body, children)."""
    first, applied = one_pass(reconcile, settings, manifest(name, "v1", 1, None, False), [])
    job = finished(applied, "Job", conditions=[{"type": "Complete", "status": "True"}])
    second, applied = one_pass(reconcile, settings, manifest(name, "v1", 1, first.status, False), [job])
    serving = finished(applied, "Deployment", readyReplicas=2)
    third, _ = one_pass(reconcile, settings, manifest(name, "v1", 1, second.status, False), [job, serving])
    return manifest(name, "v1", 1, third.status, False), [job, serving]


def warming_canary(reconcile, settings, name: str) -> tuple[dict, list[dict]]:
    """v1 stable, v2 warming with its replicas ready and its golden prompts due."""
    body, children = settled(reconcile, settings, name)
    changed, applied = one_pass(reconcile, settings, manifest(name, "v2", 2, body["status"], True), children)
    revision = changed.status["currentRevision"]
    job = finished(applied, "Job", revision, conditions=[{"type": "Complete", "status": "True"}])
    warming, applied = one_pass(reconcile, settings, manifest(name, "v2", 2, changed.status, True),
                                [*children, job])
    serving = finished(applied, "Deployment", revision, readyReplicas=2)
    return manifest(name, "v2", 2, warming.status, True), [*children, job, serving]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure() -> dict:
    import llmfleet.reconcile as package
    from llmfleet.reconcile import OperatorSettings, reconcile

    settings = OperatorSettings()
    fleet = [settled(reconcile, settings, f"d{i}") for i in range(DEPLOYMENTS)]
    pass_ms = []
    for _ in range(ROUNDS):
        for body, children in fleet:
            started = time.perf_counter()
            one_pass(reconcile, settings, body, children)
            pass_ms.append((time.perf_counter() - started) * 1000)

    canaries = [warming_canary(reconcile, settings, f"canary{i}") for i in range(HUNG_CANARIES)]
    kube = NullGateway(hung={body["metadata"]["name"] for body, _ in canaries})
    probes = package.Probes(WORKERS, lambda uid: None) if hasattr(package, "Probes") else None
    extra = {"probes": probes} if probes is not None else {}
    queued = time.perf_counter()
    waited_s: list[float] = []
    lock = threading.Lock()

    def run(body, children, hung: bool) -> None:
        reconcile(copy.deepcopy(body), kube, settings, NOW, children=children, **extra)
        if not hung:
            with lock:
                waited_s.append(time.perf_counter() - queued)

    with ThreadPoolExecutor(WORKERS) as workers:
        for body, children in canaries:
            workers.submit(run, body, children, True)
        for body, children in fleet[:QUEUED_BEHIND]:
            workers.submit(run, body, children, False)
    if probes is not None:
        probes.stop()
    return {"pass_ms_p50": percentile(pass_ms, 0.5), "pass_ms_p99": percentile(pass_ms, 0.99),
            "passes": len(pass_ms), "queued_wait_s_p50": percentile(waited_s, 0.5),
            "queued_wait_s_max": max(waited_s), "queued": len(waited_s)}


def measured_at(source_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(source_dir / "operator")}
    run = subprocess.run([sys.executable, __file__, "--measure"], env=env, capture_output=True, text=True,
                         check=True, cwd=source_dir)
    return json.loads(run.stdout.strip().splitlines()[-1])


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a commit to measure beside the working tree")
    parser.add_argument("--measure", action="store_true", help="measure the llmfleet on PYTHONPATH, print JSON")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    commit = git("rev-parse", "--short", "HEAD")
    rows = []
    if args.before:
        with tempfile.TemporaryDirectory() as scratch:
            worktree = Path(scratch) / "before"
            git("worktree", "add", "--detach", str(worktree), args.before)
            try:
                print(f"measuring {args.before} ...", file=sys.stderr)
                rows.append((git("rev-parse", "--short", args.before), measured_at(worktree)))
            finally:
                git("worktree", "remove", "--force", str(worktree))
    print(f"measuring {commit} (working tree) ...", file=sys.stderr)
    rows.append((commit, measured_at(REPO)))
    table = ["| commit | pass p50 (ms) | pass p99 (ms) | settled deployment queued behind hung gates: "
             "wait p50 (s) | max (s) |", "|---|---|---|---|---|"]
    for name, result in rows:
        table.append(f"| {name} | {result['pass_ms_p50']:.2f} | {result['pass_ms_p99']:.2f} | "
                     f"{result['queued_wait_s_p50']:.3f} | {result['queued_wait_s_max']:.3f} |")
    command = "`.venv/bin/python benchmarks/bench_pass.py" + (f" --before {args.before}`" if args.before else "`")
    report = "\n".join([
        "## Reconcile pass time (no cluster)", "",
        f"Generated by {command} at {commit} on {platform.machine()} ({os.cpu_count()} cores), API defaults. "
        f"`reconcile` with a gateway that writes nowhere: {DEPLOYMENTS} settled deployments passed {ROUNDS} "
        f"times each; then {WORKERS} workers (the operator's pass workers) pass {QUEUED_BEHIND} settled "
        f"deployments queued behind {HUNG_CANARIES} canaries whose golden-prompt gate hangs {HANG_S:.0f} s "
        "(the wait is from queueing to the pass's end). Goal: the queued deployments unaffected by the "
        "hung gates. One run; medians and the tail from it.", "", *table, "",
        "Log of every run: [pass-log.md](pass-log.md).", ""])
    REPORT.write_text(report)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with LOG.open("a") as log:
        if LOG.stat().st_size == 0:
            log.write("# bench_pass.py runs\n\nEvery run, kept (misses too).\n\n")
        log.write(f"## {stamp}, {command}\n\n" + "\n".join(table) + "\n\n")
    print(report)


if __name__ == "__main__":
    main()
