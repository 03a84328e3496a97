"""The pure part of a pass, step by step: from the context and the observations, what to apply,
what to delete, the new status and the events. Every error a user can cause (a spec the models
reject, a spec render refuses, one no plan meets) ends as a condition, never as an exception
Kopf would retry forever; what already serves stays."""

from __future__ import annotations

from llmfleet.api import LLMDeployment, Reason
from llmfleet.api.status import PlanStatus, RevisionStatus
from llmfleet.autoscale import describe_ttft_p99, display_round
from llmfleet.planner.types import Plan
from llmfleet.reconcile.build import build_state
from llmfleet.reconcile.canary import canary_runs, canary_status, route_weights, stable_rescaled, walk_canary
from llmfleet.reconcile.conditions import blocked_conditions, serving_conditions
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.events import Event
from llmfleet.reconcile.learn import learn_from_traffic
from llmfleet.reconcile.observations import Observations
from llmfleet.reconcile.plan import choose_plan
from llmfleet.reconcile.pods import room_for_a_part
from llmfleet.reconcile.rollout import Rollout, roll_out
from llmfleet.reconcile.scale import Scaling, scale
from llmfleet.reconcile.status import Outcome, outcome
from llmfleet.render import RenderError, namespace_prerequisites, render, revision_hash
from llmfleet.render.identity import selector_labels


def decide(ctx: Context, observations: Observations) -> Outcome:
    # validate
    deployment = ctx.parsed
    if not isinstance(deployment, LLMDeployment):
        return blocked(ctx, Reason.INVALID_SPEC, "; ".join(f"{path}: {text}" for path, text in deployment.problems))
    spec = deployment.spec
    # plan
    choice = choose_plan(ctx, spec, observations.fleet)
    if choice.plan is None:
        closest = (choice.status.rejected or [None])[0]
        return blocked(ctx, Reason.PLAN_INFEASIBLE, "no allowed configuration meets the spec" + (
            f"; closest: {closest.option}: {closest.reason}" if closest else ""), choice.status)
    plan = choice.plan
    revision = revision_hash(spec, plan)
    # learn
    learning = learn_from_traffic(ctx, spec, choice, revision, observations)
    # build
    current = revision == ctx.stored.current_revision
    build = build_state(ctx.children, revision, observations.build_failure if current else None)
    # scale: while a canary runs the autoscaler sizes the stable revision, which takes most traffic
    sized = ctx.stored.stable_revision if canary_runs(ctx, spec, revision) else revision
    scaling = scale(ctx, spec, plan, build, ctx.children.ready(sized), observations.snapshot)
    # canary
    canary = walk_canary(ctx, spec, plan, revision, build, scaling.desired_replicas, observations)
    # render
    serving_replicas = (canary.split.canary_replicas if canary.split is not None
                        else scaling.desired_replicas if build.finished else 0)
    try:
        manifests = render(deployment, plan, revision, ctx.settings.render, serving_replicas=serving_replicas,
                           route_weights=route_weights(ctx, revision, canary))
    except RenderError as error:
        return blocked(ctx, Reason.RENDER_FAILED, str(error), choice.status)
    # roll out and prune
    rollout = roll_out(ctx, revision, build, scaling.desired_replicas, manifests, canary)
    # conditions
    conditions = serving_conditions(ctx, choice.status, build, rollout, scaling, canary,
                                    _pods_say(plan, observations) if current else None)
    # status and events
    snapshot = observations.snapshot
    status = {
        "plan": choice.status,
        "replicas": scaling.desired_replicas,
        "ready_replicas": rollout.ready,
        "selector": ",".join(f"{k}={v}" for k, v in sorted(selector_labels(ctx.name).items())),
        "current_revision": revision,
        "stable_revision": rollout.stable_revision,
        "revisions": _revisions(ctx, rollout, choice.status.summary, spec.engine.revision),
        "autoscaler": scaling.autoscaler,
        "canary": canary_status(canary),
        "ttft_p99_ms": display_round(snapshot.ttft_p99_ms, 1) if snapshot is not None else None,
        "ttft_p99": describe_ttft_p99(snapshot.ttft_p99_ms, snapshot) if snapshot is not None else None,
        **learning.changes,
    }
    return outcome(ctx, status, conditions, events=[*_scale_events(scaling), *canary.events, *learning.events],
                   ensure=namespace_prerequisites(deployment, plan, ctx.settings.render), apply=manifests,
                   scale=stable_rescaled(ctx, canary, scaling.autoscaler is not None), delete=rollout.delete)


def blocked(ctx: Context, reason: str, message: str, plan_status: PlanStatus | None = None) -> Outcome:
    """A spec the operator cannot act on: say so, keep whatever already serves, create nothing."""
    return outcome(ctx, {"plan": plan_status} if plan_status is not None else {},
                   blocked_conditions(ctx, reason, message))


def _revisions(ctx: Context, rollout: Rollout, plan_summary: str | None,
               engine_revision: str | None) -> list[RevisionStatus] | None:
    """status.revisions: the current revision first, then those still serving beside it."""
    revision = rollout.revision
    return [RevisionStatus(name=name, plan_summary=plan_summary if name == revision else None,
                           engine_revision=engine_revision if name == revision else None,
                           replicas=(deployment.get("spec") or {}).get("replicas", 0),
                           ready_replicas=ctx.children.ready(name))
            for name, deployment in sorted(ctx.children.serving.items(), key=lambda item: item[0] != revision)
            if name is not None and (name == revision or not rollout.rolled_out)] or None


def _pods_say(plan: Plan, observations: Observations) -> str | None:
    """Why the revision's pods are not ready; for a group the scheduler cannot place, also which
    nodes lack what (the cluster's GPUs are read only then)."""
    said = observations.not_ready_reason
    if said is None or not observations.group_unschedulable or observations.fleet.gpus is None:
        return said
    return f"{said}; {room_for_a_part(observations.fleet.gpus, plan)}"


def _scale_events(scaling: Scaling) -> list[Event]:
    if scaling.decision is None or scaling.desired_replicas == scaling.previous_replicas:
        return []
    return [Event.normal(scaling.decision.decision.value, scaling.decision.reason)]
