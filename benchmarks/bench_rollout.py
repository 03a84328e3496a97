"""Canary rollout benchmarks in the sandbox, under a steady load through the Service:

- a bad canary (its engines 3x slower, a sandbox fault) under two step schedules: time from the
  canary's first ready replica (its first traffic) to the rollback, and the blast radius (the
  requests the bad revision served, as a share of all, from Triton's counters in Prometheus);
- a good canary against a direct replace: time from the spec change to the new revision being
  stable, and failed or truncated requests during each.

Everything at the API's defaults except the steps themselves (gates: 10 % p99 TTFT regression,
50 % mean TTFT regression, 1 % errors, 20 requests, analysis interval 30 s unless the step says
otherwise).
Starts its own sandbox and operator. Prints markdown, writes docs/benchmarks/rollout.md.
Needs root; runs beside a default sandbox (instance 1). Run: sudo .venv/bin/python benchmarks/bench_rollout.py
[--only bad|good] (about 35 minutes; each half about half of it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "rollout.md"
LOG = REPO / "docs" / "benchmarks" / "rollout-log.md"
LOG_HEADER = """# Rollout benchmark: every run

Appended by `benchmarks/bench_rollout.py` on every run; rows are never edited or removed.

| date | commit | run | change to stable or rollback, s | canary's first ready to rollback, s | verdict | \
requests by the bad revision | its share | failed or truncated | requests |
|---|---|---|---:|---:|---|---:|---:|---:|---:|
"""
sys.path.insert(0, str(REPO / "benchmarks"))

import yaml  # noqa: E402

from bench_sandbox import commit, run, sandbox_with_operator  # noqa: E402
from llmfleet_sandbox import prometheus  # noqa: E402

NAMESPACE = "bench"
STABLE_REPLICAS = 3
LOAD_RATE = 4  # requests/s, Poisson: well inside what 3 replicas serve
LOAD_FLAGS = ["--input-tokens", "fixed:128", "--output-tokens", "fixed:16", "--seed", "11"]
SLOWDOWN = 3.0
BAD_SCHEDULES = (
    ("analysis at 25 %", [{"setWeight": 25}, {"analysis": {"durationSeconds": 120}}]),
    ("pause at 25 %, then analysis at 50 %",
     [{"setWeight": 25}, {"pause": {"durationSeconds": 60}}, {"setWeight": 50},
      {"analysis": {"durationSeconds": 120}}]),
)
GOOD_SCHEDULE = [{"setWeight": 25}, {"pause": {"durationSeconds": 30}}, {"setWeight": 50},
                 {"pause": {"durationSeconds": 30}}]


def manifest(name: str, engine_revision: str, steps: list | None) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"revision": engine_revision},
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            "workload": {"inputTokensMean": 128, "inputTokensP99": 128, "outputTokensMean": 16,
                         "outputTokensP99": 16, "peakRequestsPerSecond": LOAD_RATE},
            "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
            "plan": {"replicas": STABLE_REPLICAS},
            **({"rollout": {"steps": steps}} if steps else {}),
        },
    }


def status(env, name: str) -> dict:
    out = run(["kubectl", "get", "llmdeployment", name, "-n", NAMESPACE, "-o", "json"], env).stdout
    return json.loads(out).get("status") or {}


def deploy(env, body: dict) -> str:
    name = body["metadata"]["name"]
    run(["kubectl", "apply", "-f", "-"], env, input=yaml.safe_dump(body))
    run(["kubectl", "wait", "--for=condition=Ready", f"llmdeployment/{name}", "-n", NAMESPACE,
         "--timeout=300s"], env)
    service = json.loads(run(["kubectl", "get", "service", name, "-n", NAMESPACE, "-o", "json"], env).stdout)
    return f"{service['spec']['clusterIP']}:8001"


def served_by_revision(env, name: str, revision: str) -> float:
    """Requests the revision's pods answered, summed over its pods' counters (from zero)."""
    selector = (f'namespace="{NAMESPACE}", model="tensorrt_llm", llmfleet_io_deployment="{name}", '
                f'llmfleet_io_revision="{revision}"')
    query = f"sum(max_over_time(nv_inference_request_success{{{selector}}}[30m]))"
    result = prometheus.query(env, query)
    return float(result[0]["value"][1]) if result else 0.0


def revision_of(env, body: dict) -> str:
    """The revision the operator makes of `body`, as `llmfleet plan` names it."""
    planned = run([sys.executable, "-m", "llmfleet", "plan", "-f", "-", "-o", "json"], env, input=json.dumps(body))
    return json.loads(planned.stdout)["revision"]


def change_under_load(env, name: str, target: str, until, output: Path, fault: bool, load_s: int) -> dict:
    """Start a `load_s` long load, change spec.engine.revision, optionally slow the new revision
    down, and sample the status every second until `until(status, new revision)`; then let the
    load finish."""
    load = subprocess.Popen([sys.executable, "-m", "llmfleet", "load", "--target", target,
                             "--schedule", f"constant:{LOAD_RATE}", "--duration-s", str(load_s), *LOAD_FLAGS,
                             "--output-dir", str(output), "--quiet"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(20)  # steady state first
    stable = status(env, name)["currentRevision"]
    body = json.loads(run(["kubectl", "get", "llmdeployment", name, "-n", NAMESPACE, "-o", "json"], env).stdout)
    body["spec"]["engine"]["revision"] = "v2"
    canary = revision_of(env, body)
    if fault:  # before the change, so that the canary's first pod already has it
        run([sys.executable, "-m", "llmfleet", "sandbox", "fault", "--namespace", NAMESPACE, "--deployment", name,
             "--revision", canary, "--slowdown", str(SLOWDOWN)], env)
    run(["kubectl", "patch", "llmdeployment", name, "-n", NAMESPACE, "--type=merge",
         "-p", '{"spec": {"engine": {"revision": "v2"}}}'], env)
    changed = time.monotonic()
    first_ready = finished = None
    deadline = changed + load_s
    while time.monotonic() < deadline:
        current = status(env, name)
        ready = {r["name"]: r.get("readyReplicas", 0) for r in current.get("revisions") or []}
        if first_ready is None and ready.get(canary, 0) > 0:
            first_ready = time.monotonic()
        if until(current, canary):
            finished = time.monotonic()
            break
        time.sleep(1.0)
    stdout, stderr = load.communicate(timeout=load_s + 300)
    if load.returncode not in (0, 1):  # 1: the run finished with failed requests, counted below
        raise RuntimeError(f"llmfleet load failed ({load.returncode}): {stderr}")
    summary = json.loads((output / "summary.json").read_text())
    return {"stable": stable, "canary": canary, "changed": changed, "first_ready": first_ready,
            "finished": finished, "summary": summary, "final": status(env, name)}


def seconds_between(start: float | None, end: float | None) -> str:
    return "not within the run" if start is None or end is None else f"{end - start:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("bad", "good"), default=None,
                        help="run only the bad canaries or only the good rollouts (default both)")
    args = parser.parse_args()
    measured = commit()  # the code the operator runs: it is started now, edits later do not count
    bad, good = [], {}
    with sandbox_with_operator(NAMESPACE) as (env, work):
        for index, (title, steps) in enumerate(BAD_SCHEDULES if args.only != "good" else ()):
            name = f"bad{index}"
            target = deploy(env, manifest(name, "v1", steps))
            result = change_under_load(env, name, target, lambda s, _: (s.get("canary") or {}).get("phase") in
                                       ("RolledBack", "Promoted"), work / name, fault=True, load_s=420)
            canary_served = served_by_revision(env, name, result["canary"])
            stable_served = served_by_revision(env, name, result["stable"])
            bad.append((title, result, canary_served, stable_served))
            run(["kubectl", "delete", "llmdeployment", name, "-n", NAMESPACE, "--wait=true"], env)
        for label, steps in ((("canary", GOOD_SCHEDULE), ("direct replace", None)) if args.only != "bad" else ()):
            name = "good" if steps else "direct"
            target = deploy(env, manifest(name, "v1", steps))
            good[label] = change_under_load(
                env, name, target, lambda s, new: s.get("stableRevision") == s.get("currentRevision") == new
                and len(s.get("revisions") or []) == 1, work / name, fault=False, load_s=300 if steps else 150)
            run(["kubectl", "delete", "llmdeployment", name, "-n", NAMESPACE, "--wait=true"], env)
    lines = [
        "# Rollout benchmarks", "",
        "Generated by `sudo .venv/bin/python benchmarks/bench_rollout.py`: a fresh sandbox, the operator "
        "on the host (reconcile timer 5 s), Llama 3.1 8B emulated on one H100 per replica, "
        f"{STABLE_REPLICAS} stable replicas, a steady {LOAD_RATE} requests/s of 128-token prompts and "
        "16-token answers through the Service while `spec.engine.revision` changes. Gates at the API's "
        "defaults (p99 TTFT regression 10 %, mean TTFT regression 50 %, error rate 1 %, 20 requests; "
        "analysis interval 30 s). "
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}.",
        "",
        f"## A bad canary (engines {SLOWDOWN:g}x slower) is rolled back", "",
        "| schedule | canary's first ready replica to rollback, s | verdict | requests served by the bad "
        "revision | share of all requests | failed or truncated requests |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for title, result, canary_served, stable_served in bad:
        canary_status = result["final"].get("canary") or {}
        summary = result["summary"]
        total = canary_served + stable_served
        share = f"{100 * canary_served / total:.1f} %" if total else "-"
        lines.append(f"| {title} | {seconds_between(result['first_ready'], result['finished'])} | "
                     f"{canary_status.get('phase')}: {canary_status.get('analysisMessage', '')} | "
                     f"{canary_served:.0f} | {share} | {summary['errors'] + summary['truncated']} |")
    if not bad:
        lines.append("| not run (`--only good`); earlier runs are in the log | | | | | |")
    lines += ["", "The first run (10d51d4, in the log) promoted both bad canaries: their p99 TTFT and "
              "stable's lay in neighbouring histogram buckets, which the p99 gate cannot tell apart. "
              "The mean-TTFT gate was added for that."]
    lines += ["", "## A good canary against a direct replace", "",
              "| rollout | spec change to the new revision stable, s | failed or truncated requests | requests |",
              "|---|---:|---:|---:|"]
    for label, result in good.items():
        summary = result["summary"]
        lines.append(f"| {label} | {seconds_between(result['changed'], result['finished'])} | "
                     f"{summary['errors'] + summary['truncated']} | {summary['requests']} |")
    if not good:
        lines.append("| not run (`--only bad`); earlier runs are in the log | | | |")
    steps_text = ", ".join(json.dumps(step) for step in GOOD_SCHEDULE)
    lines += ["", f"The good canary's steps: {steps_text}. The time includes the new revision's prepare "
              "Job and the emulated engine's start in both rows; the difference is the promotion "
              "overhead.", ""]
    lines += [f"Commit {measured}; every run is in [rollout-log.md](rollout-log.md).", ""]
    text = "\n".join(lines)
    print(text)
    REPORT.write_text(text)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    rows = []
    for title, result, canary_served, stable_served in bad:
        canary_status, summary = result["final"].get("canary") or {}, result["summary"]
        total = canary_served + stable_served
        rows.append(f"| {stamp} | {measured} | bad canary, {title} | "
                    f"{seconds_between(result['changed'], result['finished'])} | "
                    f"{seconds_between(result['first_ready'], result['finished'])} | {canary_status.get('phase')} | "
                    f"{canary_served:.0f} | {f'{100 * canary_served / total:.1f} %' if total else '-'} | "
                    f"{summary['errors'] + summary['truncated']} | {summary['requests']} |")
    for label, result in good.items():
        summary = result["summary"]
        rows.append(f"| {stamp} | {measured} | good, {label} | {seconds_between(result['changed'], result['finished'])}"
                    f" | - | - | - | - | {summary['errors'] + summary['truncated']} | {summary['requests']} |")
    if not LOG.exists():
        LOG.write_text(LOG_HEADER)
    with LOG.open("a") as handle:
        handle.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
