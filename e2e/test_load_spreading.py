"""New replicas get the traffic: the demo's own LLMDeployment under its step from 1 to 3
requests/s (sooner and shorter than the printed one), through its Service, once spread
round-robin with the load generator's short-lived connections (kube-proxy IPVS's default) and
once least-connections (IPVS `lc`, chosen for that Service by the sandbox proxy's annotation),
the two at the same time in two namespaces. Requests arriving after the scale-up's replicas are
Ready meet the SLO at p99."""

from __future__ import annotations

import csv
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import StatusWatcher, service_target, wait_until_ready
from llmfleet.render.identity import service_name
from llmfleet_sandbox.manager import DEMO_LOAD_ARGS, DEMO_MANIFEST
from llmfleet.simulation.routing import LEAST_CONNECTIONS, ROUND_ROBIN
from llmfleet_sandbox.serviceproxy import SCHEDULER_ANNOTATION

pytestmark = pytest.mark.long_running

SCHEDULERS = {"spread-round-robin": ROUND_ROBIN, "spread-least-connections": LEAST_CONNECTIONS}
STEP_AT_S, DURATION_S = 10, 210
SCHEDULE = f"steps:0:1,{STEP_AT_S}:3"
# Enough arrivals after Ready that their p99 is not just the slowest one.
MIN_ARRIVALS_AFTER_READY = 150


def _demo(namespace: str) -> dict:
    manifest = yaml.safe_load(DEMO_MANIFEST.read_text())
    manifest["metadata"]["namespace"] = namespace
    return manifest


def _token_flags() -> list[str]:
    args = list(DEMO_LOAD_ARGS)
    return [flag for name in ("--input-tokens", "--output-tokens") for flag in (name, args[args.index(name) + 1])]


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class Run:
    """One namespace's demo deployment, its Service's scheduler, its load and its status samples."""

    def __init__(self, sandbox, namespace: str, scheduler: str, output: Path):
        self.sandbox, self.namespace, self.scheduler, self.output = sandbox, namespace, scheduler, output
        self.name = _demo(namespace)["metadata"]["name"]
        self.slo_ttft_ms = _demo(namespace)["spec"]["slo"]["ttftP99Ms"]
        self.watcher = StatusWatcher(sandbox, self.name, namespace)
        self.result: subprocess.CompletedProcess | None = None
        self.error: BaseException | None = None

    def deploy(self) -> str:
        self.sandbox.kubectl("create", "namespace", self.namespace)
        self.sandbox.apply([_demo(self.namespace)], namespace=self.namespace)
        wait_until_ready(self.sandbox, self.name, self.namespace, timeout=300)
        self.sandbox.kubectl("annotate", "service", service_name(self.name), "-n", self.namespace,
                             f"{SCHEDULER_ANNOTATION}={self.scheduler}")
        return service_target(self.sandbox, self.name, self.namespace)

    def drive(self) -> None:
        try:
            target = self.deploy()
            started = time.monotonic()
            sampler = threading.Thread(target=self.watcher.run, args=(started,), daemon=True)
            sampler.start()
            try:
                self.result = subprocess.run(
                    [sys.executable, "-m", "llmfleet", "load", "--target", target,
                     "--schedule", SCHEDULE, "--duration-s", str(DURATION_S), *_token_flags(),
                     "--slo-ttft-ms", str(self.slo_ttft_ms), "--output-dir", str(self.output), "--quiet"],
                    env=self.sandbox.env, capture_output=True, text=True, timeout=DURATION_S + 300)
            finally:
                self.watcher.stop.set()
                sampler.join()
        except BaseException as error:  # noqa: BLE001 - reported by the test's thread
            self.error = error

    def scale_up(self) -> tuple[int, float | None]:
        """The most replicas the step brought, and when readyReplicas first reached them."""
        samples = [s for s in self.watcher.samples if s.seconds >= STEP_AT_S]
        peak = max((s.replicas or 0) for s in samples)
        return peak, next((s.seconds for s in samples if (s.ready or 0) >= peak), None)

    def requests(self) -> list[dict]:
        with open(self.output / "requests.csv") as handle:
            return list(csv.DictReader(handle))


@pytest.fixture
def runs(sandbox, operator, tmp_path):
    runs = [Run(sandbox, namespace, scheduler, tmp_path / namespace) for namespace, scheduler in SCHEDULERS.items()]
    yield runs
    for run in runs:
        sandbox.kubectl("delete", "namespace", run.namespace, "--wait=false", check=False)


def test_arrivals_after_the_new_replicas_are_ready_meet_the_slo_round_robin_and_least_connections(runs):
    threads = [threading.Thread(target=run.drive) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for run in runs:
        if run.error is not None:
            raise run.error
        assert run.result.returncode == 0, f"{run.scheduler}: {run.result.stderr}\n{run.result.stdout}"
    for run in runs:
        peak, ready_s = run.scale_up()
        assert peak > 1, f"{run.scheduler}: the step brought no scale-up: {run.watcher.timeline()}"
        assert ready_s is not None, f"{run.scheduler}: {peak} replicas never Ready: {run.watcher.timeline()}"
        after_ready = [r for r in run.requests() if float(r["arrival_s"]) >= ready_s]
        assert len(after_ready) >= MIN_ARRIVALS_AFTER_READY, (
            f"{run.scheduler}: {peak} replicas Ready only at {ready_s:.0f} s: {run.watcher.timeline()}")
        failed = [r for r in after_ready if r["status"] != "ok"]
        assert not failed, f"{run.scheduler}: {len(failed)} failed, first {failed[0]}"
        p99_ms = _p99([float(r["ttft_ms"]) for r in after_ready])
        assert p99_ms <= run.slo_ttft_ms, (
            f"{run.scheduler}: p99 TTFT {p99_ms:.0f} ms of {len(after_ready)} arrivals after {peak} replicas "
            f"were Ready at {ready_s:.0f} s, SLO {run.slo_ttft_ms} ms: {run.watcher.timeline()}")
