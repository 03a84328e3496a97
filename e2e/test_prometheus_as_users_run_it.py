"""The operator on a Prometheus as users run it: scraping every 15 or 30 s (the chart's
PodMonitor default and kube-prometheus-stack's), behind TLS and basic auth (the whole e2e
sandbox's Prometheus is), and with a credential that goes wrong and is put right."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import StatusWatcher, condition, service_target, wait_for
from llmfleet_sandbox.manager import DEMO_LOAD_ARGS, DEMO_MANIFEST

pytestmark = pytest.mark.long_running

# The demo's load (`make sandbox` prints it): 1 request/s, a step to 3, back to 1, in phases
# shortened from 60/180/120 s so that both intervals run in one test.
STEP_AT_S, DOWN_AT_S, LOAD_S = 30, 150, 210
SCHEDULE = f"steps:0:1,{STEP_AT_S}:3,{DOWN_AT_S}:1"
RECONCILE_PERIOD_S = 5  # OperatorSettings.timer_interval_seconds
# The step needs some seconds to push p99 past the target: a backlog builds at one replica.
BREACH_DEVELOPS_S = 30
INTERVALS_S = {"scrape-15s": 15, "scrape-30s": 30}
# Quicker than the defaults so that the scale-down shows within minutes; the windows and the
# staleness limit the test is about are the operator's, derived from the interval.
AUTOSCALING = {"enabled": True, "minReplicas": 1, "maxReplicas": 4,
               "scaleDownStabilizationSeconds": 60, "cooldownSeconds": 30}


def demo_in(namespace: str, name: str = "chat") -> dict:
    body = yaml.safe_load(DEMO_MANIFEST.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    body["spec"]["autoscaling"] = AUTOSCALING
    return body


def _load(sandbox, target: str, output: Path) -> subprocess.Popen:
    flags = list(DEMO_LOAD_ARGS)
    flags[flags.index("--schedule") + 1] = SCHEDULE
    flags[flags.index("--duration-s") + 1] = str(LOAD_S)
    return subprocess.Popen([sys.executable, "-m", "llmfleet", "load", "--target", target,
                             *flags, "--slo-ttft-ms", "500", "--output-dir", str(output), "--quiet"],
                            env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ready(sandbox, name: str, namespace: str) -> bool:
    obj = sandbox.kubectl_json("get", "llmdeployment", name, "-n", namespace)
    found = condition(obj, "Ready")
    return bool(found and found["status"] == "True")


@pytest.fixture
def interval_namespaces(sandbox, operator):
    for namespace, seconds in INTERVALS_S.items():
        sandbox.kubectl("create", "namespace", namespace)
        sandbox.llmfleet("scrape-interval", str(seconds), "--namespace", namespace)
    yield list(INTERVALS_S)
    for namespace in INTERVALS_S:
        sandbox.llmfleet("scrape-interval", "default", "--namespace", namespace)
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_demo_load_scales_up_and_back_down_at_15_and_30_s_scrape_intervals(sandbox, interval_namespaces, tmp_path):
    for namespace in interval_namespaces:
        sandbox.apply([demo_in(namespace)], namespace=namespace)
    for namespace in interval_namespaces:
        wait_for(lambda namespace=namespace: _ready(sandbox, "chat", namespace), 240, f"chat Ready in {namespace}")
    targets = {namespace: service_target(sandbox, "chat", namespace) for namespace in interval_namespaces}
    started = time.monotonic()
    watchers = {namespace: StatusWatcher(sandbox, "chat", namespace) for namespace in interval_namespaces}
    threads = [threading.Thread(target=watcher.run, args=(started,), daemon=True) for watcher in watchers.values()]
    for thread in threads:
        thread.start()
    try:
        loads = {namespace: _load(sandbox, targets[namespace], tmp_path / namespace)
                 for namespace in interval_namespaces}
        for namespace, load in loads.items():
            stdout, stderr = load.communicate(timeout=LOAD_S + 180)
            assert load.returncode == 0, f"{namespace}: {stderr}\n{stdout}"
        # After the load: every replica the step added goes again.
        # Read where the checks below read it, the watcher's samples: a change the watcher has not
        # sampled yet when it stops would be missing from its timeline.
        for namespace, watcher in watchers.items():
            wait_for(lambda watcher=watcher: watcher.samples and watcher.samples[-1].replicas == 1,
                     420, f"{namespace}: back to one replica", interval=2)
    finally:
        for watcher in watchers.values():
            watcher.stop.set()
        for thread in threads:
            thread.join()

    for namespace, watcher in watchers.items():
        interval_s = INTERVALS_S[namespace]
        changes = watcher.replica_changes()
        summary = json.loads((tmp_path / namespace / "summary.json").read_text())
        where = f"{namespace}: replicas {changes}, timeline {watcher.timeline()}"
        assert summary["errors"] == 0 and summary["truncated"] == 0, where
        # The operator read the interval from the samples and judged freshness by it: at the
        # 5 s it assumed before, a 30 s scrape was always "stale" and it never scaled.
        reasons = {sample.metrics_reason for sample in watcher.samples} - {None}
        assert "StaleData" not in reasons, where
        assert any(f"scrape interval {interval_s} s" in (sample.metrics_message or "") for sample in watcher.samples), \
            f"{where}; messages {sorted({s.metrics_message for s in watcher.samples if s.metrics_message})[:5]}"
        # Up within the stated bound after the breach develops: two scrapes and a reconcile period.
        first_up = next((seconds for seconds, replicas in changes if replicas > 1), None)
        bound_s = STEP_AT_S + BREACH_DEVELOPS_S + 2 * interval_s + RECONCILE_PERIOD_S
        assert first_up is not None and first_up <= bound_s, f"scale-up at {first_up} s, bound {bound_s} s; {where}"
        # ... and back down without a reversal: no replica added after the first removed.
        counts = [replicas for _, replicas in changes]
        peak_index = counts.index(max(counts))
        assert counts[:peak_index + 1] == sorted(counts[:peak_index + 1]), where
        assert counts[peak_index:] == sorted(counts[peak_index:], reverse=True) and counts[-1] == 1, where


def _events_text(sandbox, namespace: str) -> str:
    return sandbox.kubectl("get", "events", "-n", namespace, "-o", "json")


def test_a_wrong_prometheus_credential_is_a_condition_that_names_it_and_fixing_it_recovers(sandbox, operator):
    namespace = "prometheus-credential"
    sandbox.kubectl("create", "namespace", namespace)
    try:
        sandbox.apply([demo_in(namespace, "guarded")], namespace=namespace)

        def metrics(status: str, reason: str | None = None):
            obj = sandbox.kubectl_json("get", "llmdeployment", "guarded", "-n", namespace)
            found = condition(obj, "MetricsAvailable")
            return found if found and found["status"] == status and reason in (None, found["reason"]) else None

        wait_for(lambda: _ready(sandbox, "guarded", namespace), 240, "guarded Ready")
        wait_for(lambda: metrics("True"), 120, "MetricsAvailable=True over TLS with basic auth")
        restarts = operator.restarts
        password_file = operator.prometheus_password_file
        password = password_file.read_text().strip()
        wrong = password[::-1] + "-wrong"
        password_file.write_text(wrong)  # as a Secret rotated on one side only
        try:
            failed = wait_for(lambda: metrics("False", "PrometheusUnauthorized"), 60,
                              "MetricsAvailable=False PrometheusUnauthorized")
            assert "--prometheus-basic-auth" in failed["message"] and "401" in failed["message"]
        finally:
            password_file.write_text(password)
        wait_for(lambda: metrics("True"), 60, "MetricsAvailable=True again, without a restart")
        assert operator.restarts == restarts and operator.process.poll() is None
        # No credential anywhere a user or another controller reads.
        obj = sandbox.kubectl("get", "llmdeployment", "guarded", "-n", namespace, "-o", "yaml")
        for where, text in (("status", obj), ("events", _events_text(sandbox, namespace)),
                            ("operator log", operator.log_path.read_text(errors="replace"))):
            for secret in (password, wrong):
                assert secret not in text, f"a Prometheus password appears in the {where}"
    finally:
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false")
