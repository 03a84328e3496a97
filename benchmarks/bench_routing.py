"""Load spreading after a scale-up, on the demo's own workload: how long after the new replicas
are Ready the p99 TTFT of new arrivals is back within the SLO, and the share of requests each
replica served, with the sandbox's Service proxy spreading connections round-robin (kube-proxy
IPVS's default `rr`) and least-connections (its `lc`), and with a client that keeps its
connections (round-robin).

Each run: a fresh sandbox (`sandbox up --service-proxy-scheduler ...`) and the operator on the
host, the demo's LLMDeployment (examples/sandbox-chat.yaml, API defaults) and the load its
instructions print (`llmfleet_sandbox.manager.DEMO_LOAD_ARGS`) through its Service.
Prints markdown, writes docs/benchmarks/routing.md and appends every run to
docs/benchmarks/routing-log.md. Needs root and no other bench sandbox running.
Run: sudo .venv/bin/python benchmarks/bench_routing.py [--runs N]   (about 10 minutes a run)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "routing.md"
LOG = REPO / "docs" / "benchmarks" / "routing-log.md"
sys.path.insert(0, str(REPO / "benchmarks"))

import yaml  # noqa: E402

from bench_autoscaling import RECOVERY_WINDOW_S, drive, window_p99  # noqa: E402
from bench_sandbox import commit, run, sandbox_with_operator  # noqa: E402
from llmfleet_sandbox import prometheus  # noqa: E402
from llmfleet_sandbox.manager import DEMO_LOAD_ARGS, DEMO_MANIFEST  # noqa: E402

NAMESPACE = "bench"
LAST_MINUTE_S = 60
NAME = "chat"
# (label, service proxy scheduler, extra load flags)
RUNS = (
    ("round-robin", "round-robin", ()),
    ("least-connections", "least-connections", ()),
    ("round-robin, client keeps its connections", "round-robin", ("--max-stream-age-s", "inf")),
)


def demo_load() -> tuple[str, int, list[str], tuple[float, float]]:
    """(schedule, seconds, the other flags, (start, end) of the step's high phase) of the demo's load."""
    args = list(DEMO_LOAD_ARGS)
    schedule, seconds = args[args.index("--schedule") + 1], int(args[args.index("--duration-s") + 1])
    others = [a for i, a in enumerate(args) if a not in ("--schedule", "--duration-s")
              and args[i - 1] not in ("--schedule", "--duration-s")]
    steps = [float(point.split(":")[0]) for point in schedule.removeprefix("steps:").split(",")]
    return schedule, seconds, others, (steps[1], steps[2])


def slo_ttft_ms() -> int:
    return yaml.safe_load(DEMO_MANIFEST.read_text())["spec"]["slo"]["ttftP99Ms"]


def deploy(env) -> str:
    manifest = yaml.safe_load(DEMO_MANIFEST.read_text())
    manifest["metadata"]["namespace"] = NAMESPACE
    run(["kubectl", "apply", "-f", "-"], env, input=yaml.safe_dump(manifest))
    run(["kubectl", "wait", "--for=condition=Ready", f"llmdeployment/{NAME}", "-n", NAMESPACE,
         "--timeout=300s"], env)
    service = json.loads(run(["kubectl", "get", "service", NAME, "-n", NAMESPACE, "-o", "json"], env).stdout)
    return f"{service['spec']['clusterIP']}:8001"


def served_per_pod(env, lookback_s: int) -> dict[str, float]:
    """Requests each serving pod answered, including pods already removed (their last value)."""
    query = (f'sum by (pod) (max_over_time(nv_inference_request_success{{namespace="{NAMESPACE}", '
             f'model="tensorrt_llm"}}[{lookback_s}s]))')
    result = prometheus.query(env, query)
    return {series["metric"]["pod"]: float(series["value"][1]) for series in result}


def figures(samples: list, requests: list, high_s: tuple[float, float], slo_ms: int, served: dict) -> dict:
    """Ready: when readyReplicas first reached the most replicas the step brought. Back within
    the SLO: the first second after that from which every 30 s of arrivals (the operator's p99
    window) until the step ends has its p99 within the SLO."""
    peak = max((s[1] or 0) for s in samples if high_s[0] <= s[0] < high_s[1])
    ready = next((s[0] for s in samples if s[0] >= high_s[0] and (s[2] or 0) >= peak), None)
    recovered = None
    if ready is not None:
        starts = range(math.ceil(ready), int(high_s[1] - RECOVERY_WINDOW_S) + 1)
        p99s = [(start, window_p99(requests, start, RECOVERY_WINDOW_S)) for start in starts]
        recovered = next((start for start, _ in p99s
                          if all(q is None or q <= slo_ms for s, q in p99s if s >= start)), None)
    after_ready = [r for r in requests if ready is not None and ready <= float(r["arrival_s"]) < high_s[1]]
    within = sum(1 for r in after_ready if r["status"] == "ok" and float(r["ttft_ms"]) <= slo_ms)
    total = sum(served.values()) or 1
    return {"peak": peak, "ready_s": ready, "recovered_s": recovered,
            "to_recovery_s": None if recovered is None else recovered - ready,
            "within_after_ready": within / len(after_ready) if after_ready else None,
            "p99_after_ready_ms": window_p99(after_ready, ready, high_s[1] - ready) if after_ready else None,
            # The step's last minute, long after Ready: what the fleet gives this load once any
            # backlog is gone, to tell the backlog's share of the tail from the load's own.
            "p99_last_minute_ms": window_p99(requests, high_s[1] - LAST_MINUTE_S, LAST_MINUTE_S),
            "shares": sorted((count / total for count in served.values()), reverse=True),
            "requests": len(requests),
            # Seconds the operator reported RequestsBalanced=False (a sample a second).
            "imbalanced_s": sum(1 for s in samples if s[4] == "False")}


def row(label: str, f: dict) -> str:
    def seconds(value):
        return "-" if value is None else f"{value:.0f}"
    to_recovery = "never" if f["ready_s"] is not None and f["recovered_s"] is None else seconds(f["to_recovery_s"])
    within = "-" if f["within_after_ready"] is None else f"{f['within_after_ready']:.1%}"
    p99 = "-" if f["p99_after_ready_ms"] is None else f"{f['p99_after_ready_ms']:.0f}"
    last_minute = "-" if f["p99_last_minute_ms"] is None else f"{f['p99_last_minute_ms']:.0f}"
    shares = " / ".join(f"{share:.0%}" for share in f["shares"])
    return (f"| {label} | {f['peak']} | {seconds(f['ready_s'])} | {to_recovery} | {within} | {p99} | "
            f"{shares} | {f['imbalanced_s']} | {last_minute} |")


HEADER = ["| run | replicas at the step | new replicas Ready (s) | Ready to p99 within SLO (s) "
          "| arrivals after Ready within SLO | their p99 TTFT (ms) | requests per replica "
          "| RequestsBalanced=False (s) | p99 TTFT of the step's last minute (ms) |",
          "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
LOG_HEADER = """# Routing benchmark: every run

Appended by `benchmarks/bench_routing.py` on every run; rows are never edited or removed.

| date | commit | """ + HEADER[0].removeprefix("| ") + "\n|---|---|" + HEADER[1].removeprefix("|") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=len(RUNS), choices=range(1, len(RUNS) + 1),
                        help=f"how many of the runs, in order (default all {len(RUNS)}): "
                             + "; ".join(label for label, _, _ in RUNS))
    args = parser.parse_args()
    measured = commit()
    schedule, seconds, load_flags, high_s = demo_load()
    slo_ms = slo_ttft_ms()
    results = {}
    for label, scheduler, client_flags in RUNS[:args.runs]:
        print(f"== {label}", flush=True)
        with sandbox_with_operator(NAMESPACE, ("--service-proxy-scheduler", scheduler)) as (env, work):
            target = deploy(env)
            started = time.monotonic()
            samples, requests = drive(env, NAME, target, schedule, seconds, work / "load",
                                      [*load_flags, *client_flags], slo_ms)
            served = served_per_pod(env, int(time.monotonic() - started) + 60)
            results[label] = figures(samples, requests, high_s, slo_ms, served)
            print(row(label, results[label]), flush=True)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    if not LOG.exists():
        LOG.write_text(LOG_HEADER)
    with LOG.open("a") as handle:
        handle.write("".join(f"| {stamp} | {measured} |{row(label, f).removeprefix('|')}\n"
                             for label, f in results.items()))
    lines = [
        "# Load spreading after a scale-up", "",
        "Generated by `sudo .venv/bin/python benchmarks/bench_routing.py`: for each run a fresh "
        "sandbox whose Service proxy spreads connections as named, the operator on the host, the "
        f"demo's LLMDeployment ([examples/sandbox-chat.yaml](../../examples/sandbox-chat.yaml), "
        f"autoscaling at the API defaults, SLO p99 TTFT {slo_ms} ms) and the load the demo prints "
        f"(`llmfleet load {schedule} {seconds} s {' '.join(load_flags)}`) through its Service. The "
        "load generator reopens a stream once it is 2 s old by default; the last run keeps its "
        "streams (`--max-stream-age-s inf`), as a client with long-lived connections does. "
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}, commit {measured}. Every run is in [routing-log.md](routing-log.md).", "",
        f"New replicas Ready: the first second in the step ({high_s[0]:.0f}-{high_s[1]:.0f} s) at which "
        "readyReplicas reached the most replicas the step brought. Ready to p99 within SLO: from then "
        f"to the first second from which every {RECOVERY_WINDOW_S} s of arrivals until the step ends has "
        "its p99 TTFT within the SLO (client-side); never: not before the step ends. Requests per "
        "replica: each serving pod's share of the requests the run's pods answered (Triton's success "
        "counter), largest first. RequestsBalanced=False: seconds of the run in which the operator said "
        "requests pile up at some replicas while others idle (status sampled every second). The step's "
        "last minute: the p99 TTFT of the arrivals in it, long after Ready (client-side).", "",
        *HEADER, *(row(label, f) for label, f in results.items()), "",
    ]
    text = "\n".join(lines)
    print(text)
    REPORT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
