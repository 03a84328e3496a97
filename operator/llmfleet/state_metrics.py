"""The operator's own metrics: each LLMDeployment's spec and status as Prometheus gauges, for the
chart's dashboard and SLO alerts (charts/llmfleet/files/), as Argo Rollouts' controller exports
its rollouts and kube-state-metrics the built-in kinds.

Computed at scrape time from the objects the operator's index holds, so nothing is counted twice
and nothing outlives its object. Every series carries `namespace` and `llmfleet_io_deployment`,
the labels the serving pods' series get from the pod label `llmfleet.io/deployment` (its value
cut to 63 characters), so the two join without relabelling; the scrape must keep them
(`honorLabels: true`, as for kube-state-metrics).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from llmfleet.api.status import ScalingDecision
from llmfleet.render.identity import DEPLOYMENT_LABEL, fit_name

EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEPLOYMENT_SERIES_LABEL = DEPLOYMENT_LABEL.replace(".", "_").replace("/", "_")
# The last decision, canary phase and Ready condition are one series per value seen, set to 1.
SCALING_DECISIONS = tuple(decision.value for decision in ScalingDecision)


@dataclass(frozen=True)
class Gauge:
    name: str
    help: str


INFO = Gauge("llmfleet_deployment_info", "The plan served: revision, GPU type, tensor-parallel size, "
                                         "quantisation and runtime as labels; always 1.")
REPLICAS = Gauge("llmfleet_deployment_replicas", "Serving replicas the operator wants (status.replicas).")
READY_REPLICAS = Gauge("llmfleet_deployment_ready_replicas", "Replicas ready to serve (status.readyReplicas).")
SLO_TTFT = Gauge("llmfleet_deployment_slo_ttft_p99_ms", "The SLO's p99 time to first token, ms (spec.slo).")
SLO_TPOT = Gauge("llmfleet_deployment_slo_tpot_p99_ms", "The SLO's p99 time per output token, ms (spec.slo).")
SLO_TTFT_BUCKET = Gauge("llmfleet_deployment_slo_ttft_bucket",
                        "1 at le = the SLO, a bound of the deployment's TTFT histogram: a request in that "
                        "bucket met the SLO (the burn-rate rules' good events).")
AUTOSCALER_TARGET = Gauge("llmfleet_deployment_autoscaler_target_ttft_p99_ms",
                          "The p99 TTFT the autoscaler steers to, ms.")
AUTOSCALER_DESIRED = Gauge("llmfleet_deployment_autoscaler_desired_replicas", "Replicas the autoscaler wants.")
AUTOSCALER_DECISION = Gauge("llmfleet_deployment_autoscaler_decision",
                            "1 for the autoscaler's last decision (ScaleUp, ScaleDown or Hold), 0 for the others.")
CANARY_WEIGHT = Gauge("llmfleet_deployment_canary_weight_percent",
                      "The canary's share of the serving replicas, percent (0 without a canary).")
CANARY_PHASE = Gauge("llmfleet_deployment_canary_phase", "1 for the last canary rollout's phase.")
READY = Gauge("llmfleet_deployment_ready", "1 when the Ready condition is True, else 0.")
GAUGES = (INFO, REPLICAS, READY_REPLICAS, SLO_TTFT, SLO_TPOT, SLO_TTFT_BUCKET, AUTOSCALER_TARGET,
          AUTOSCALER_DESIRED, AUTOSCALER_DECISION, CANARY_WEIGHT, CANARY_PHASE, READY)


def _labels(labels: dict[str, str]) -> str:
    def escaped(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return ",".join(f'{name}="{escaped(str(value))}"' for name, value in labels.items())


def _samples(body: dict) -> Iterable[tuple[Gauge, dict[str, str], float]]:
    metadata, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    key = {"namespace": metadata["namespace"], DEPLOYMENT_SERIES_LABEL: fit_name(metadata["name"])}
    plan = status.get("plan") or {}
    if plan:
        yield INFO, {**key, "revision": status.get("currentRevision") or "",
                     "gpu_type": plan.get("gpuType") or "", "quantization": plan.get("quantization") or "",
                     "tensor_parallel_size": str(plan.get("tensorParallelSize") or ""),
                     "runtime": (spec.get("engine") or {}).get("runtime") or "llmapi"}, 1
    for gauge, value in ((REPLICAS, status.get("replicas")), (READY_REPLICAS, status.get("readyReplicas")),
                         (SLO_TTFT, (spec.get("slo") or {}).get("ttftP99Ms")),
                         (SLO_TPOT, (spec.get("slo") or {}).get("tpotP99Ms"))):
        if value is not None:
            yield gauge, key, value
    slo_ttft = (spec.get("slo") or {}).get("ttftP99Ms")
    if slo_ttft is not None:
        # The SLO is a bound of every revision rendered for it (render.ttft_buckets).
        yield SLO_TTFT_BUCKET, {**key, "le": str(slo_ttft)}, 1
    autoscaler = status.get("autoscaler") or {}
    target = (autoscaler.get("inputs") or {}).get("targetTtftP99Ms")
    if target is not None:
        yield AUTOSCALER_TARGET, key, target
    if autoscaler.get("desiredReplicas") is not None:
        yield AUTOSCALER_DESIRED, key, autoscaler["desiredReplicas"]
    if autoscaler.get("lastDecision"):
        for decision in SCALING_DECISIONS:
            yield AUTOSCALER_DECISION, {**key, "decision": decision}, int(decision == autoscaler["lastDecision"])
    canary = status.get("canary") or {}
    yield CANARY_WEIGHT, key, canary.get("weightPercent") or 0
    if canary.get("phase"):
        yield CANARY_PHASE, {**key, "phase": canary["phase"]}, 1
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    yield READY, key, int(bool(ready) and ready.get("status") == "True")


def exposition(deployments: Iterable[dict]) -> str:
    """The gauges of every LLMDeployment in Prometheus' text format (version 0.0.4)."""
    by_gauge: dict[Gauge, list[str]] = {gauge: [] for gauge in GAUGES}
    for body in deployments:
        for gauge, labels, value in _samples(body):
            if isinstance(value, (int, float)) and math.isfinite(value):
                by_gauge[gauge].append(f"{gauge.name}{{{_labels(labels)}}} {value:g}")
    lines = []
    for gauge, samples in by_gauge.items():
        lines += [f"# HELP {gauge.name} {gauge.help}", f"# TYPE {gauge.name} gauge", *samples]
    return "\n".join(lines) + "\n"
