"""Closed-loop autoscaling on p99 TTFT, through real Triton, the real service
proxy, real Prometheus and the operator: scale up on a breach, recover, scale
down after the stabilisation window without cutting a request off, no
flapping at steady load, hold through a Prometheus outage."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import service_target, small_batch_70b, StatusSample, StatusWatcher, stop_load, temporary_namespace, wait_for

pytestmark = pytest.mark.long_running

NAMESPACE = "autoscaling"
SLO_TTFT_MS = 500
# Connections are spread at random (kube-proxy's default, and the sandbox's). The burst, 3.5
# requests/s, needs all four of these replicas, at 0.875 a replica against the 1.05 the planner
# models one to carry at the SLO. At 4 requests/s (0.95 a replica) p99 came back only 150 s in
# on a busy CI machine, too late for its 30 s run before the drop at 180 s.
# The steady load is 0.6 requests/s a replica: in simulation no run of 60 seeds left two replicas
# in 90 s (p99 95 ms). 2.2 (1.1 a replica, more than the 1.05 the planner models one to carry at
# the SLO) scaled up in 12 of 30 seeds, and did once in CI: a 30 s window holds about 66
# requests, so its p99 is the slowest of them.
MAX_REPLICAS = 4
HIGH_REQUESTS_PER_S = 3.5
STEADY_REQUESTS_PER_S = 1.2
SCALE_DOWN_STABILIZATION_S = 30
COOLDOWN_S = 15
RECOVERED_FOR_S = 30  # the operator's p99 window


def scaler(name: str, min_replicas: int = 1, target_ttft_p99_ms: int | None = None) -> dict:
    # Quicker windows than the defaults: these tests check the mechanisms;
    # benchmarks/bench_autoscaling.py measures the defaults.
    target = {} if target_ttft_p99_ms is None else {"targetTtftP99Ms": target_ttft_p99_ms}
    return small_batch_70b(name, NAMESPACE, SLO_TTFT_MS, autoscaling={
        "enabled": True, "minReplicas": min_replicas, "maxReplicas": MAX_REPLICAS, **target,
        "scaleDownStabilizationSeconds": SCALE_DOWN_STABILIZATION_S, "cooldownSeconds": COOLDOWN_S})


def _longest_run_under(samples: list[StatusSample], limit_ms: float, from_s: float, to_s: float) -> float:
    """Seconds of the longest stretch in (from_s, to_s) in which every sample's p99 TTFT was
    known and under `limit_ms`."""
    longest, run_start = 0.0, None
    for sample in samples:
        if not from_s < sample.seconds < to_s:
            continue
        if sample.ttft_p99_ms is not None and sample.ttft_p99_ms < limit_ms:
            run_start = sample.seconds if run_start is None else run_start
            longest = max(longest, sample.seconds - run_start)
        else:
            run_start = None
    return longest


def _status(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", name, "-n", NAMESPACE).get("status") or {}


def _deploy_ready(sandbox, name: str, min_replicas: int = 1, target_ttft_p99_ms: int | None = None) -> str:
    sandbox.apply([scaler(name, min_replicas, target_ttft_p99_ms)], namespace=NAMESPACE)
    wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                         for c in _status(sandbox, name).get("conditions") or []), 180, f"{name} Ready")
    return service_target(sandbox, name, NAMESPACE)


def _load(sandbox, target: str, schedule: str, duration_s: int, output_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "llmfleet", "load", "--target", target, "--model", "ensemble",
         "--schedule", schedule, "--duration-s", str(duration_s), "--input-tokens", "lognormal:128:256",
         "--output-tokens", "fixed:32", "--slo-ttft-ms", str(SLO_TTFT_MS), "--output-dir", str(output_dir),
         "--quiet"], env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module", autouse=True)
def autoscaling_namespace(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        yield NAMESPACE


def test_scales_up_on_a_breach_recovers_and_scales_down_without_cutting_requests(sandbox, tmp_path):
    target = _deploy_ready(sandbox, "burst")
    assert _status(sandbox, "burst")["replicas"] == 1
    watcher = StatusWatcher(sandbox, "burst", NAMESPACE)
    started = time.monotonic()
    thread = threading.Thread(target=watcher.run, args=(started,), daemon=True)
    thread.start()
    # The backlog queued at the first replica drains only at its spare rate beside its share of
    # new arrivals, then leaves the 30 s window: p99 recovers 60-120 s in on a busy machine (CI:
    # at about 90 s, 29 s before a drop at 120 s; later at about 120 s, a 29.6 s run before a
    # drop at 150 s; at 4 requests/s, once at 151 s). 180 s leaves room for the 30 s run.
    high_s, total_s = 180, 280
    load = _load(sandbox, target, f"steps:0:{HIGH_REQUESTS_PER_S},{high_s}:0.5", total_s, tmp_path)
    stdout, stderr = load.communicate(timeout=total_s + 180)
    watcher.stop.set()
    thread.join()

    # No request failed or was cut off, including while replicas were removed.
    assert load.returncode == 0, f"{stderr}\n{stdout}"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["truncated"] == 0
    changes = watcher.replica_changes()
    peak = max(sample.replicas or 0 for sample in watcher.samples)
    assert 1 < peak <= MAX_REPLICAS, changes
    first_up = next(seconds for seconds, replicas in changes if replicas > 1)
    assert first_up < 60, f"scale-up took {first_up:.0f} s: {changes}"
    # p99 TTFT came back under the SLO while the load was still high, and stayed there: one
    # window's worth (30 s) of samples in a row, not one lucky sample.
    assert _longest_run_under(watcher.samples, SLO_TTFT_MS, first_up, high_s) >= RECOVERED_FOR_S, watcher.timeline()
    # Scale-down only after the load dropped and the stabilisation window passed.
    downs = [seconds for seconds, replicas in changes if seconds > first_up
             and replicas < max(r for s, r in changes if s <= seconds)]
    assert downs, f"never scaled down: {watcher.timeline()}"
    assert all(seconds >= high_s + SCALE_DOWN_STABILIZATION_S for seconds in downs), watcher.timeline()


def test_steady_load_does_not_flap_and_a_prometheus_outage_holds_replicas(sandbox, tmp_path):
    # Two replicas at 0.6 requests/s each, p99 TTFT well inside the target; 1.2 requests/s is
    # more than the planner's model gives one replica (1.05 at this target).
    target = _deploy_ready(sandbox, "steady", min_replicas=2, target_ttft_p99_ms=SLO_TTFT_MS)
    watcher = StatusWatcher(sandbox, "steady", NAMESPACE)
    started = time.monotonic()
    thread = threading.Thread(target=watcher.run, args=(started,), daemon=True)
    thread.start()
    steady_s, outage_s, total_s = 90, 40, 170
    load = _load(sandbox, target, f"constant:{STEADY_REQUESTS_PER_S}", total_s, tmp_path)
    time.sleep(steady_s)
    assert {sample.replicas for sample in watcher.samples} == {2}, watcher.timeline()

    replicas_before = _status(sandbox, "steady")["replicas"]
    sandbox.stop_component("prometheus")

    def metrics_unavailable():
        condition = next((c for c in _status(sandbox, "steady").get("conditions") or []
                          if c["type"] == "MetricsAvailable"), None)
        return condition if condition and condition["status"] == "False" else None
    condition = wait_for(metrics_unavailable, 30, "MetricsAvailable=False")
    assert condition["reason"] == "PrometheusUnreachable"
    # The minimum lowered under the fleet: holding keeps its replicas, a fallback would drop to 1.
    sandbox.apply([scaler("steady", min_replicas=1, target_ttft_p99_ms=SLO_TTFT_MS)], namespace=NAMESPACE)
    wait_for(lambda: (seen := sandbox.kubectl_json("get", "llmdeployment", "steady", "-n", NAMESPACE))["status"]
             .get("observedGeneration") == seen["metadata"]["generation"], 30, "the operator to see minReplicas 1")
    time.sleep(outage_s - 10)
    status = _status(sandbox, "steady")
    assert status["replicas"] == replicas_before > 1, status["autoscaler"]
    assert status["autoscaler"]["lastDecision"] == "Hold", status["autoscaler"]

    sandbox.llmfleet("up")  # starts only the stopped Prometheus
    wait_for(lambda: not metrics_unavailable(), 60, "MetricsAvailable=True again")
    stdout, stderr = load.communicate(timeout=total_s + 180)
    watcher.stop.set()
    thread.join()
    assert load.returncode == 0, f"{stderr}\n{stdout}"


def _metrics_condition(sandbox, name: str) -> dict:
    return next((c for c in _status(sandbox, name).get("conditions") or [] if c["type"] == "MetricsAvailable"), {})


def test_partial_series_hold_a_scale_down_and_vanished_series_hold_everything(sandbox):
    """Prometheus loses one of two idle replicas (it drops out of discovery, its series end):
    the sums that remain understate the fleet's load, so the scale-down that minReplicas 1 now
    allows waits, and says why. With both lost there is no data at all. Found again, the
    scale-down goes ahead."""
    _deploy_ready(sandbox, "partial", min_replicas=2)
    pods = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                "llmfleet.io/deployment=partial,app.kubernetes.io/component=server")["items"]
    lost, other = sorted(pod["metadata"]["name"] for pod in pods)
    sandbox.llmfleet("scrape", "off", lost, "--namespace", NAMESPACE)
    sandbox.apply([scaler("partial", min_replicas=1)], namespace=NAMESPACE)

    condition = wait_for(lambda: (c := _metrics_condition(sandbox, "partial")).get("reason") == "PartialData" and c,
                         60, "MetricsAvailable PartialData")
    assert condition["status"] == "False"
    assert condition["message"].startswith("only 1 of 2 ready replicas report metrics"), condition
    # Long enough for a scale-down on full data: the stabilisation window and the cooldown.
    held_until = time.monotonic() + SCALE_DOWN_STABILIZATION_S + COOLDOWN_S
    while time.monotonic() < held_until:
        status = _status(sandbox, "partial")
        assert status["replicas"] == 2, status["autoscaler"]
        time.sleep(2)
    assert "scaling down waits until all do" in status["autoscaler"]["reason"]

    sandbox.llmfleet("scrape", "off", other, "--namespace", NAMESPACE)
    wait_for(lambda: _metrics_condition(sandbox, "partial").get("reason") == "NoData", 60, "MetricsAvailable NoData")
    assert _status(sandbox, "partial")["replicas"] == 2

    for pod in (lost, other):
        sandbox.llmfleet("scrape", "on", pod, "--namespace", NAMESPACE)
    wait_for(lambda: _metrics_condition(sandbox, "partial").get("status") == "True", 60, "MetricsAvailable True")
    wait_for(lambda: _status(sandbox, "partial")["replicas"] == 1, SCALE_DOWN_STABILIZATION_S + 60,
             "the scale-down once every replica reports")


def _condition(sandbox, name: str, condition_type: str) -> dict:
    return next((c for c in _status(sandbox, name).get("conditions") or [] if c["type"] == condition_type), {})


def test_one_swamped_replica_beside_an_idle_one_is_a_routing_condition_not_a_scale_up(sandbox, tmp_path):
    """Load sent to one of two replicas only (as a client whose connections all landed on one
    replica would) swamps it while the other idles: that is where requests land, not a lack of
    replicas. The autoscaler says so, naming both, and adds none."""
    _deploy_ready(sandbox, "skewed", min_replicas=2)
    pods = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                "llmfleet.io/deployment=skewed,app.kubernetes.io/component=server")["items"]
    swamped, idle = sorted(pods, key=lambda pod: pod["metadata"]["name"])
    assert _condition(sandbox, "skewed", "RequestsBalanced").get("status") != "False"
    # Twice what one replica serves within the target (the steady test's 3/s needs two).
    load = _load(sandbox, f"{swamped['status']['podIP']}:8001", "constant:4", 150, tmp_path)
    try:
        condition = wait_for(lambda: (c := _condition(sandbox, "skewed", "RequestsBalanced")).get("status") == "False"
                             and c, 90, "RequestsBalanced=False")
        assert condition["reason"] == "ReplicaImbalance"
        assert f"{swamped['metadata']['name']} (p99 TTFT" in condition["message"], condition
        assert f"{idle['metadata']['name']} (idle)" in condition["message"], condition
        # Past a scale-up's first chance (a pass every 5 s, no scale-up stabilisation): held.
        held_until = time.monotonic() + 30
        while time.monotonic() < held_until:
            status = _status(sandbox, "skewed")
            assert status["replicas"] == 2, json.dumps(status["autoscaler"])  # whole: the reason of the pass
            time.sleep(2)
        assert "more replicas would not help" in status["autoscaler"]["reason"]
    finally:
        stop_load(load)
