"""The scale step: the replicas the revision should have, from the plan or the autoscaler."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from llmfleet.api import LLMDeploymentSpec
from llmfleet.api.status import AutoscalerStatus, ReplicaRecommendation
from llmfleet.autoscale import AutoscalerState, Decision, MetricsSnapshot, Recommendation, ReplicaCapacity, \
    target_ttft_p99_ms
from llmfleet.autoscale import decide as autoscale
from llmfleet.planner.capacity import replica_capacity
from llmfleet.planner.spec_adapter import plan_request_from_spec
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
        recommendations=tuple(Recommendation(r.time, r.replicas) for r in stored.recommendations or ()),
        last_scale_direction=stored.last_scale_direction, reversals=stored.reversals or 0)


def _autoscaler_status(decision: Decision, stored: AutoscalerStatus | None, now: datetime) -> AutoscalerStatus:
    state = decision.state
    unchanged = (stored is not None and stored.last_decision == decision.decision
                 and stored.desired_replicas == decision.desired_replicas)
    return AutoscalerStatus(
        desired_replicas=decision.desired_replicas, last_decision=decision.decision,
        last_decision_time=stored.last_decision_time if unchanged else now, reason=decision.reason[:1024],
        signal=decision.signal, reversals=state.reversals, last_scale_direction=state.last_scale_direction,
        inputs=decision.inputs, last_scale_time=state.last_scale_time, warming_since=state.warming_since,
        recommendations=[ReplicaRecommendation(time=r.time, replicas=r.replicas)
                         for r in state.recommendations] or None)


def _capacity(ctx: Context, spec: LLMDeploymentSpec, plan: Plan) -> ReplicaCapacity:
    """One replica of the served plan at the autoscaler's target, at the speed this deployment
    learned for it (its own traffic; the fleet's speeds are read only when it is observed)."""
    request = plan_request_from_spec(spec, learned=ctx.stored.learned_speeds or ())
    return replica_capacity(request, plan,
                            lambda floor_ms: target_ttft_p99_ms(spec.autoscaling, spec.slo.ttft_p99_ms, floor_ms),
                            spec.engine.max_input_len)


def scale(ctx: Context, spec: LLMDeploymentSpec, plan: Plan, build: BuildState, ready: int,
          snapshot: MetricsSnapshot | None) -> Scaling:
    """`ready` counts the replicas of the revision the autoscaler sizes."""
    stored_replicas = ctx.stored.replicas
    previous = stored_replicas if stored_replicas is not None else plan.replicas
    if not spec.autoscaling.enabled:
        # A pin of 0 (`kubectl scale --replicas=0`) stops serving; the planner never sees it.
        stopped = spec.plan is not None and spec.plan.replicas == 0
        return Scaling(0 if stopped else plan.replicas, previous)
    scaling = spec.autoscaling
    current = min(max(previous, scaling.min_replicas), scaling.max_replicas)
    decision = autoscale(scaling, spec.slo.ttft_p99_ms, snapshot or MetricsSnapshot(error="no Prometheus URL configured"),
                         _autoscaler_state(ctx.stored.autoscaler), current, ready if build.finished else current,
                         ctx.now, capacity=_capacity(ctx, spec, plan))
    return Scaling(decision.desired_replicas, previous,
                   _autoscaler_status(decision, ctx.stored.autoscaler, ctx.now), decision)
