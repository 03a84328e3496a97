"""The scale step: the replicas the revision should have, from the plan or the autoscaler."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llmfleet.api import LLMDeploymentSpec
from llmfleet.api.status import AutoscalerStatus, ReplicaRecommendation
from llmfleet.autoscale import AutoscalerState, Decision, MetricsSnapshot, Recommendation
from llmfleet.autoscale import decide as autoscale
from llmfleet.planner.types import Plan
from llmfleet.reconcile.build import BuildState
from llmfleet.reconcile.context import Context


@dataclass(frozen=True)
class Scaling:
    desired_replicas: int
    # The replicas before this pass: stored, or the plan's on the first pass.
    previous_replicas: int
    autoscaler: AutoscalerStatus | None = None
    decision: Decision | None = None  # when the autoscaler decided


def _autoscaler_state(stored: AutoscalerStatus | None) -> AutoscalerState:
    if stored is None:
        return AutoscalerState()
    return AutoscalerState(
        last_scale_time=stored.last_scale_time, warming_since=stored.warming_since,
        recommendations=tuple(Recommendation(r.time, r.replicas) for r in stored.recommendations or ()))


def _autoscaler_status(decision: Decision, stored: AutoscalerStatus | None, now: datetime) -> AutoscalerStatus:
    state = decision.state
    unchanged = (stored is not None and stored.last_decision == decision.decision
                 and stored.desired_replicas == decision.desired_replicas)
    return AutoscalerStatus(
        desired_replicas=decision.desired_replicas, last_decision=decision.decision,
        last_decision_time=stored.last_decision_time if unchanged else now, reason=decision.reason[:1024],
        inputs=decision.inputs, last_scale_time=state.last_scale_time, warming_since=state.warming_since,
        recommendations=[ReplicaRecommendation(time=r.time, replicas=r.replicas)
                         for r in state.recommendations] or None)


def scale(ctx: Context, spec: LLMDeploymentSpec, plan: Plan, build: BuildState, ready: int,
          snapshot: MetricsSnapshot | None) -> Scaling:
    """`ready` counts the replicas of the revision the autoscaler sizes."""
    stored_replicas = ctx.stored.replicas
    previous = stored_replicas if stored_replicas is not None else plan.replicas
    if not spec.autoscaling.enabled:
        return Scaling(plan.replicas, previous)
    scaling = spec.autoscaling
    current = min(max(previous, scaling.min_replicas), scaling.max_replicas)
    decision = autoscale(scaling, spec.slo.ttft_p99_ms, snapshot or MetricsSnapshot(error="no Prometheus URL configured"),
                         _autoscaler_state(ctx.stored.autoscaler), current, ready if build.finished else current,
                         ctx.now)
    return Scaling(decision.desired_replicas, previous,
                   _autoscaler_status(decision, ctx.stored.autoscaler, ctx.now), decision)
