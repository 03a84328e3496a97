"""Autoscaling benchmarks in the sandbox: reaction time from an SLO breach to the
scale decision and to recovery, and two ramp-and-fall traces, each served by an
autoscaled deployment and by a static one sized for the peak, in one run.

Starts its own sandbox and operator (host, the sandbox's
Prometheus at a 5 s scrape). Prints markdown, writes docs/benchmarks/autoscaling.md
and docs/benchmarks/autoscaling.png. Needs root and no other sandbox running.
Run: sudo .venv/bin/python benchmarks/bench_autoscaling.py   (about 50 minutes)
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "autoscaling.md"
PLOT = REPO / "docs" / "benchmarks" / "autoscaling.png"
sys.path.insert(0, str(REPO / "benchmarks"))

import yaml  # noqa: E402

from bench_sandbox import run, sandbox_with_operator  # noqa: E402
from operator_fixtures import small_batch_70b  # noqa: E402

NAMESPACE = "bench"
SLO_TTFT_MS = 500
TARGET_TTFT_MS = 300  # steer below the SLO, so that scaling starts before users notice
MAX_REPLICAS = 3
STEP_SCHEDULE = ("steps:0:0.5,20:6", 120)  # (schedule, seconds): breach at 20 s
# Ramp-and-fall traces: (title, schedule, seconds). Both climb from 0.5 to 6 requests/s.
# The steep one climbs in one minute: within its first 15 s one replica is past its SLO
# capacity, less than the ~15 s a reactive scaler needs to see it and bring a replica up.
# The day is the same shape at the pace of a real one relative to that reaction time
# (a three-minute climb), with a night around it.
RAMP_TRACES = (
    ("steep climb", "ramp:0:0.5,60:0.5,120:6,180:6,240:0.5", 420),
    ("compressed day", "ramp:0:0.5,90:0.5,270:6,390:6,570:0.5", 840),
)
RECOVERY_WINDOW_S = 30
LOAD_FLAGS = ["--input-tokens", "lognormal:128:256", "--output-tokens", "fixed:32", "--seed", "7"]


def deployment(name: str, autoscaled: bool) -> dict:
    if autoscaled:
        return small_batch_70b(name, NAMESPACE, SLO_TTFT_MS, autoscaling={
            "enabled": True, "minReplicas": 1, "maxReplicas": MAX_REPLICAS,
            "targetTtftP99Ms": TARGET_TTFT_MS, "cooldownSeconds": 15, "scaleDownStabilizationSeconds": 60})
    return small_batch_70b(name, NAMESPACE, SLO_TTFT_MS, plan={"replicas": MAX_REPLICAS})


def status(env, name: str) -> dict:
    out = run(["kubectl", "get", "llmdeployment", name, "-n", NAMESPACE, "-o", "json"], env).stdout
    return json.loads(out).get("status") or {}


def deploy(env, name: str, autoscaled: bool) -> str:
    run(["kubectl", "apply", "-f", "-"], env, input=yaml.safe_dump(deployment(name, autoscaled)))
    run(["kubectl", "wait", "--for=condition=Ready", f"llmdeployment/{name}", "-n", NAMESPACE,
         "--timeout=240s"], env)
    service = json.loads(run(["kubectl", "get", "service", name, "-n", NAMESPACE, "-o", "json"],
                             env).stdout)
    return f"{service['spec']['clusterIP']}:8001"


def drive(env, name: str, target: str, schedule: str, seconds: int, output: Path) -> tuple[list, list]:
    """Run the load while sampling the deployment's status every second."""
    samples, stop = [], threading.Event()
    started = time.monotonic()

    def sample():
        while not stop.is_set():
            current = status(env, name)
            samples.append((time.monotonic() - started, current.get("replicas"),
                            current.get("readyReplicas"), current.get("ttftP99Ms")))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run([sys.executable, "-m", "llmfleet", "load", "--target", target, "--model", "ensemble",
         "--schedule", schedule, "--duration-s", str(seconds), *LOAD_FLAGS,
         "--slo-ttft-ms", str(SLO_TTFT_MS), "--output-dir", str(output), "--quiet"], env)
    stop.set()
    sampler.join()
    with open(output / "requests.csv") as handle:
        requests = list(csv.DictReader(handle))
    return samples, requests


def replica_seconds(samples: list, seconds: int) -> float:
    total = 0.0
    for (t0, replicas, *_), (t1, *_) in zip(samples, samples[1:]):
        if t0 < seconds:
            total += (replicas or 0) * (min(t1, seconds) - t0)
    return total


def attainment(requests: list) -> float:
    ok = sum(1 for r in requests if r["status"] == "ok" and float(r["ttft_ms"]) <= SLO_TTFT_MS)
    return ok / len(requests)


def window_p99(requests: list, start_s: float, width_s: float = 5.0) -> float | None:
    ttfts = sorted(float(r["ttft_ms"]) for r in requests if r["ttft_ms"]
                   and start_s <= float(r["arrival_s"]) < start_s + width_s)
    return ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None


def reaction(samples: list, requests: list, breach_from_s: float) -> dict:
    windows = [(start, window_p99(requests, start)) for start in range(0, int(samples[-1][0]), 5)]
    # The breach begins with the first 5 s window (by request arrival) whose p99 breaks the SLO.
    breach = next(start for start, p99 in windows if start >= breach_from_s - 5
                  and p99 is not None and p99 > SLO_TTFT_MS)
    decision = next(t for t, replicas, *_ in samples if replicas and replicas > 1)
    scaled_to = next(replicas for t, replicas, *_ in samples if t >= decision)
    ready = next((t for t, _, ready, _ in samples if t >= decision and (ready or 0) >= scaled_to), None)
    # Recovered from the first time after which every 30 s of arrivals (the operator's p99
    # window) has its p99 within the SLO: one stray slow request does not move a 30 s p99.
    slides = [(start, window_p99(requests, start, RECOVERY_WINDOW_S)) for start, _ in windows]
    recovered = next((start for start, _ in slides if start >= decision
                      and all(q is None or q <= SLO_TTFT_MS for s, q in slides if s >= start)), None)
    return {"breach_s": breach, "decision_s": decision, "ready_s": ready, "recovered_s": recovered}


def plot(traces: list[tuple[str, str, dict[str, tuple[list, list]]]]) -> None:
    """One column per trace: replicas over time above per-request TTFT."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(traces), figsize=(7 * len(traces), 6), sharex="col",
                                squeeze=False)
    for column, (title, schedule, runs) in enumerate(traces):
        replicas_axis, ttft_axis = axes[0][column], axes[1][column]
        for label, (samples, requests) in runs.items():
            replicas_axis.step([s[0] for s in samples], [s[1] or 0 for s in samples], where="post",
                               label=label)
            points = sorted((float(r["arrival_s"]), float(r["ttft_ms"])) for r in requests if r["ttft_ms"])
            ttft_axis.plot([p[0] for p in points], [p[1] for p in points], ".", markersize=2, label=label)
        ttft_axis.axhline(SLO_TTFT_MS, color="red", linewidth=1, label="SLO p99 TTFT")
        replicas_axis.set_title(f"{title} ({schedule})", fontsize=10)
        replicas_axis.set_ylabel("replicas")
        ttft_axis.set_ylabel("TTFT ms (per request)")
        ttft_axis.set_yscale("log")
        ttft_axis.set_xlabel("seconds")
        replicas_axis.legend()
        ttft_axis.legend(markerscale=4)
    figure.tight_layout()
    figure.savefig(PLOT, dpi=100)


def misses_text(requests: list) -> str:
    """When the requests that missed the SLO arrived, for the report."""
    arrivals = sorted(float(r["arrival_s"]) for r in requests
                      if r["status"] != "ok" or float(r["ttft_ms"]) > SLO_TTFT_MS)
    if not arrivals:
        return "none"
    return f"{len(arrivals)}, arriving between {arrivals[0]:.0f} s and {arrivals[-1]:.0f} s"


def ramp_section(title: str, schedule: str, seconds: int, runs: dict[str, tuple[list, list]]) -> list[str]:
    (auto_samples, auto_requests), (static_samples, static_requests) = runs.values()
    auto_cost, static_cost = replica_seconds(auto_samples, seconds), replica_seconds(static_samples, seconds)
    share, within = auto_cost / static_cost, attainment(auto_requests)
    met = "meets" if within >= 0.99 and share <= 0.70 else "misses"
    return [
        f"## Ramp and fall, {title} ({schedule} requests/s, {seconds} s, same seeded trace)", "",
        "| deployment | requests | within SLO | SLO misses | replica-seconds |", "|---|---:|---:|---|---:|",
        f"| autoscaled | {len(auto_requests)} | {within:.1%} | {misses_text(auto_requests)} | {auto_cost:.0f} |",
        f"| static, sized for the peak ({MAX_REPLICAS} replicas) | {len(static_requests)} | "
        f"{attainment(static_requests):.1%} | {misses_text(static_requests)} | {static_cost:.0f} |", "",
        f"Autoscaled uses {share:.0%} of the static replica-seconds: this {met} the target of at "
        "least 99 % within SLO using no more than 70 %.", "",
    ]


def main() -> int:
    traces = []
    with sandbox_with_operator(NAMESPACE) as (env, work):
        step = drive(env, "react", deploy(env, "react", True), *STEP_SCHEDULE, work / "step")
        run(["kubectl", "delete", "llmdeployment", "react", "-n", NAMESPACE, "--wait=true"], env)
        times = reaction(*step, breach_from_s=20)
        for index, (title, schedule, seconds) in enumerate(RAMP_TRACES):
            runs = {}
            for label, name, autoscaled in (("autoscaled", f"ramp{index}-auto", True),
                                            ("static (peak-sized)", f"ramp{index}-static", False)):
                runs[label] = drive(env, name, deploy(env, name, autoscaled), schedule, seconds, work / name)
                run(["kubectl", "delete", "llmdeployment", name, "-n", NAMESPACE, "--wait=true"], env)
            traces.append((title, schedule, seconds, runs))
    plot([(title, schedule, runs) for title, schedule, _, runs in traces])
    to_decision = times["decision_s"] - times["breach_s"]
    to_ready = (times["ready_s"] - times["breach_s"]) if times["ready_s"] else None
    to_recovery = (times["recovered_s"] - times["breach_s"]) if times["recovered_s"] else None
    lines = [
        "# Autoscaling benchmarks", "",
        "Generated by `sudo .venv/bin/python benchmarks/bench_autoscaling.py`: a fresh sandbox "
        "(Prometheus scrape 5 s), the operator on the host (reconcile timer 5 s, p99 window 30 s), "
        "Llama 3.1 70B emulated on one H100 per replica with a 4-sequence batch (saturated at about "
        "3.5 requests/s of this workload per replica), 128-token prompts (lognormal mean), "
        "32-token answers, Poisson arrivals.",
        f"SLO p99 TTFT {SLO_TTFT_MS} ms, autoscaler target {TARGET_TTFT_MS} ms, 1 to {MAX_REPLICAS} "
        "replicas, cooldown 15 s, scale-down stabilisation 60 s. Machine: "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}.", "",
        f"## Reaction to a step ({STEP_SCHEDULE[0]} requests/s)", "",
        "| from the start of the first 5 s window whose client-side p99 TTFT breaks the SLO | seconds | reference |",
        "|---|---:|---|",
        f"| to the scale-up decision (status.replicas rises) | {to_decision:.0f} | target under 20 s; "
        "HPA syncs every 15 s, KEDA polls every 30 s |",
        f"| to the new replicas ready (status.readyReplicas reaches it) | "
        f"{'not within the run' if to_ready is None else f'{to_ready:.0f}'} | report |",
        f"| to recovery (from then on, every {RECOVERY_WINDOW_S} s of arrivals has its p99 within the SLO) | "
        f"{'not within the run' if to_recovery is None else f'{to_recovery:.0f}'} | report |", "",
    ]
    for title, schedule, seconds, runs in traces:
        lines += ramp_section(title, schedule, seconds, runs)
    lines += ["![replicas and per-request TTFT, autoscaled against static, per trace](autoscaling.png)", ""]
    text = "\n".join(lines)
    print(text)
    REPORT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
