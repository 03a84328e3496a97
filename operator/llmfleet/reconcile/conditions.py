"""The conditions a pass reports, from its steps' facts and the reason constants."""

from __future__ import annotations

from llmfleet.api import ConditionStatus, ConditionType, Reason, find_condition
from llmfleet.api.conditions import Condition, derived_ready
from llmfleet.api.status import CanaryPhase, PlanStatus
from llmfleet.reconcile.build import BuildState
from llmfleet.reconcile.canary import CanaryStep
from llmfleet.reconcile.context import REPLAN_ANNOTATION, Context
from llmfleet.reconcile.rollout import Rollout
from llmfleet.reconcile.scale import Scaling
from llmfleet.rollout import Outcome as AnalysisOutcome

TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def _scaling_up(ctx: Context, rollout: Rollout, scaling: Scaling) -> bool:
    """Replicas were added (this pass, or within the start grace of an earlier ScalingUp) and
    are not all ready yet."""
    if not rollout.rolled_out or rollout.ready >= scaling.desired_replicas:
        return False
    if scaling.desired_replicas > scaling.previous_replicas:
        return True
    previous = find_condition(ctx.conditions_before, ConditionType.PROGRESSING)
    return (previous is not None and previous.status == TRUE and previous.reason == Reason.SCALING_UP
            and (ctx.now - previous.last_transition_time).total_seconds() < ctx.settings.replica_start_grace_seconds)


def _canary_conditions(ctx: Context, rollout: Rollout, canary: CanaryStep) -> tuple[tuple, tuple, tuple]:
    """Progressing, Degraded and WorkloadAvailable while a canary runs or was rolled back: the
    stable revision serves throughout."""
    state, stable = canary.state, rollout.stable_revision
    stable_ready = ctx.children.ready(stable)
    where = (f"canary {state.canary_revision} {state.phase.value}, {canary.split.weight_percent}% of replicas: "
             f"{state.message}")
    if state.phase == CanaryPhase.ROLLED_BACK:
        progressing = (FALSE, Reason.CANARY_ROLLED_BACK, state.message)
        degraded = (TRUE, Reason.CANARY_ROLLED_BACK, state.message)
    else:
        # A canary held beside a degraded stable revision says so in the reason.
        held = state.verdict == AnalysisOutcome.STABLE_DEGRADED and state.phase in (CanaryPhase.PROGRESSING,
                                                                                     CanaryPhase.PAUSED)
        progressing = ((TRUE, Reason.STABLE_DEGRADED, f"stable revision {stable} degraded; {where}") if held
                       else (TRUE, Reason.ROLLING_OUT, where))
        degraded = (FALSE, Reason.AS_PLANNED, where)
    available = ((TRUE, Reason.REPLICAS_READY,
                  f"stable revision {stable} serves with {stable_ready} replica(s) ready; {where}")
                 if stable_ready else (FALSE, Reason.REPLICAS_NOT_READY, f"stable revision {stable}: no replica ready"))
    return progressing, degraded, available


def _workload_available(rollout: Rollout, build: BuildState, desired: int, counts: str, short: str) -> tuple:
    """Which revision serves, if any: the current one once rolled out, else the stable one."""
    if desired == 0:
        return FALSE, Reason.SCALED_TO_ZERO, "spec.plan.replicas is 0: nothing serves (scale it up to serve again)"
    if rollout.rolled_out and rollout.ready >= min(desired, 1):
        return TRUE, Reason.REPLICAS_READY, f"revision {rollout.revision} serves with {counts}"
    # A new revision that builds, rolls out or failed does not take away what serves: the stable
    # one, or older ones where none is recorded (objects of an older operator).
    older_ready = rollout.ready_anywhere - (0 if rollout.rolled_out else rollout.ready)
    if rollout.stable_revision is not None and rollout.ready_anywhere or older_ready:
        new = "failed to build" if build.failed else "builds" if not build.finished else "rolls out"
        serving = f"revision {rollout.stable_revision} serves" if rollout.stable_revision else "older revisions serve"
        return (TRUE, Reason.REPLICAS_READY, f"{serving} with {rollout.ready_anywhere} replica(s) ready "
                f"while revision {rollout.revision} {new}")
    if not build.finished:
        return FALSE, build.reason, build.message
    return FALSE, Reason.REPLICAS_NOT_READY, short


def serving_conditions(ctx: Context, plan_status: PlanStatus, build: BuildState, rollout: Rollout, scaling: Scaling,
                canary: CanaryStep, pods_say: str | None) -> list[Condition]:
    """Every condition of a plannable spec, from the pass's facts and the reason constants;
    Ready derived from them. `pods_say` is why the revision's pods are not ready, when they say."""
    desired, ready = scaling.desired_replicas, rollout.ready
    counts = f"{ready}/{desired} replicas ready"
    short = f"{counts}; {pods_say}" if pods_say and ready < desired else counts
    scaling_up = _scaling_up(ctx, rollout, scaling)
    if plan_status.capacity_shortfall:
        planned = (FALSE, Reason.CAPACITY_SHORTFALL, f"{plan_status.capacity_shortfall}; serving "
                   f"{plan_status.summary or ''} x{plan_status.replicas} meanwhile (to plan again once "
                   f"GPUs are free, set the annotation {REPLAN_ANNOTATION})")
    else:
        planned = (TRUE, Reason.PLAN_FOUND,
                   f"{plan_status.summary or ''} x{desired}: " + (plan_status.rationale or [""])[0])
    revision = f"revision {rollout.revision}: "
    if canary.split is not None and not rollout.rolled_out:
        progressing, degraded, available = _canary_conditions(ctx, rollout, canary)
    else:
        available = _workload_available(rollout, build, desired, counts, short)
        if build.failed:
            progressing = (FALSE, Reason.BUILD_FAILED, revision + build.message)
        elif not build.finished:
            progressing = (TRUE, Reason.BUILDING, revision + build.message)
        elif not rollout.rolled_out:
            progressing = (TRUE, Reason.ROLLING_OUT, revision + counts)
        elif scaling_up:
            # What the added pods say (a group that cannot be placed whole: its Pending pod).
            progressing = (TRUE, Reason.SCALING_UP, revision + short)
        else:
            progressing = (FALSE, Reason.ROLLED_OUT, revision + counts)
        if build.failed:
            degraded = (TRUE, Reason.BUILD_FAILED, build.message)
        elif rollout.rolled_out and ready < desired and not scaling_up:
            degraded = (TRUE, Reason.BELOW_DESIRED_REPLICAS, short)
        else:
            degraded = (FALSE, Reason.AS_PLANNED, counts)
    after = ctx.condition(ctx.conditions_before, ConditionType.PLANNED, *planned)
    after = ctx.condition(after, ConditionType.ENGINE_BUILT, TRUE if build.finished else FALSE, build.reason,
                          build.message)
    after = ctx.condition(after, ConditionType.WORKLOAD_AVAILABLE, *available)
    after = ctx.condition(after, ConditionType.PROGRESSING, *progressing)
    after = ctx.condition(after, ConditionType.DEGRADED, *degraded)
    after = ctx.condition(after, ConditionType.READY, *derived_ready(after))
    return _autoscaling_conditions(ctx, after, scaling)


def _autoscaling_conditions(ctx: Context, after: list[Condition], scaling: Scaling) -> list[Condition]:
    if scaling.decision is None:
        return after
    decision = scaling.decision
    after = ctx.condition(after, ConditionType.AUTOSCALING_ACTIVE, TRUE, Reason.AUTOSCALER_DECIDING,
                          decision.reason)
    after = ctx.condition(after, ConditionType.METRICS_AVAILABLE, TRUE if decision.metrics_available else FALSE,
                          decision.metrics_reason, decision.metrics_message)
    if not decision.metrics_available:
        balance = (UNKNOWN, decision.metrics_reason, decision.metrics_message)
    elif decision.imbalance is not None:
        balance = (FALSE, Reason.REPLICA_IMBALANCE,
                   f"{decision.imbalance}. A Service spreads connections, not requests: clients that "
                   "keep one connection stay on one replica (docs/autoscaling.md, uneven load)")
    else:
        balance = (TRUE, Reason.NO_REPLICA_SWAMPED, "no replica breaches the target while another is idle "
                   "or far under it")
    return ctx.condition(after, ConditionType.REQUESTS_BALANCED, *balance)


def blocked_conditions(ctx: Context, reason: str, message: str) -> list[Condition]:
    """Planned and Ready False for a spec the operator cannot act on; what serves stays."""
    after = ctx.condition(ctx.conditions_before, ConditionType.PLANNED, FALSE, reason, message)
    return ctx.condition(after, ConditionType.READY, *derived_ready(after))
