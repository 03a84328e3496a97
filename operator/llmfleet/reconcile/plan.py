"""The plan step: which plan serves, and how it was come by."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from llmfleet.api import LLMDeploymentSpec
from llmfleet.api.enums import LiveReplanning
from llmfleet.api.status import LLMDeploymentStatus, PlanStatus
from llmfleet.planner import plan as make_plan
from llmfleet.planner.spec_adapter import plan_from_status, plan_request_from_spec, plan_status_from_plan
from llmfleet.planner.types import Plan
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.observations import Fleet


class PlanOrigin(str, Enum):
    STORED = "stored"  # the plan already served, kept
    PLANNED = "planned"  # a new plan for the spec
    ADOPTED = "adopted"  # live re-planning's recommendation, now served


@dataclass(frozen=True)
class PlanChoice:
    plan: Plan | None  # None: no allowed configuration meets the spec
    status: PlanStatus
    origin: PlanOrigin = PlanOrigin.STORED


def live_replanning(spec: LLMDeploymentSpec) -> LiveReplanning:
    return spec.plan.live_replanning if spec.plan else LiveReplanning.RECOMMEND


def settled(stored: LLMDeploymentStatus) -> bool:
    """The current revision is the stable one: no rollout or canary under way."""
    return stored.current_revision is not None and stored.current_revision == stored.stable_revision


def choose_plan(ctx: Context, spec: LLMDeploymentSpec, fleet: Fleet) -> PlanChoice:
    """The stored plan while the spec is unchanged and no re-plan is asked for, so an operator
    upgrade with new calibration neither re-plans nor rebuilds what serves, and GPUs freed or
    taken elsewhere do not move it; the recommended plan instead once the revision has settled
    when live re-planning is automatic; else a new plan for the cluster's GPUs now, with the
    speeds learned so far unless live re-planning is off."""
    stored = ctx.stored
    if (stored.plan is not None and stored.observed_generation == ctx.generation
            and stored.replan_request == ctx.replan_request):
        recommended = stored.recommendation
        if (recommended is not None and live_replanning(spec) == LiveReplanning.AUTOMATIC and settled(stored)
                and plan_from_status(recommended.plan) is not None):
            return PlanChoice(plan_from_status(recommended.plan), recommended.plan, PlanOrigin.ADOPTED)
        reused = plan_from_status(stored.plan)
        if reused is not None or not stored.plan.gpu_type:
            return PlanChoice(reused, stored.plan)
    # Off keeps live metrics out of the plan entirely: one deployment's slowed or swamped engines
    # must not move a plan its user pinned to the catalog's model.
    learned = ([] if live_replanning(spec) == LiveReplanning.OFF
               else [*(stored.learned_speeds or ()), *fleet.speeds])
    request = plan_request_from_spec(spec, cluster_gpus=fleet.gpus, learned=learned)
    fresh = make_plan(request)
    return PlanChoice(fresh if fresh.feasible else None,
                      plan_status_from_plan(fresh, request.workload.peak_requests_per_sec), PlanOrigin.PLANNED)
