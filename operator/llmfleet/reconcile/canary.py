"""The canary step: where a canary rollout stands, the replicas per revision while it runs,
and the route's weights."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api import LLMDeploymentSpec, Reason
from llmfleet.api.status import CanaryPhase, CanaryStatus
from llmfleet.gpu_discovery import GPU_RESOURCE
from llmfleet.planner.types import Plan
from llmfleet.reconcile.build import BuildState
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.events import Event
from llmfleet.reconcile.observations import Observations
from llmfleet.render.ttft_buckets import deployment_ttft_bounds_ms, recorded_ttft_bounds_ms
from llmfleet.rollout import CanaryState, Command, HistogramBounds, Observed, Split, advance, judge, supersede
from llmfleet.rollout import Outcome as AnalysisOutcome
from llmfleet.rollout.quality import judge_quality


@dataclass(frozen=True)
class CanaryStep:
    state: CanaryState | None  # the rollout to record (the last one, also when none runs now)
    split: Split | None = None  # replicas per revision while a canary runs
    events: tuple[Event, ...] = ()


def _histogram_bounds(spec: LLMDeploymentSpec, stable_workload: dict | None) -> HistogramBounds:
    """The canary's TTFT bounds are its spec's (this pass renders it); stable's, another spec's,
    are recorded on its serving workload."""
    canary = deployment_ttft_bounds_ms(spec)
    return HistogramBounds(canary if stable_workload is None else recorded_ttft_bounds_ms(stable_workload), canary)


def canary_state(stored: CanaryStatus | None) -> CanaryState | None:
    if stored is None or stored.phase is None or not stored.stable_revision or not stored.canary_revision:
        return None
    return CanaryState(stored.phase, stored.stable_revision, stored.canary_revision, stored.step_index or 0,
                       stored.canary_replicas or 0, stored.step_started_time, stored.message or "",
                       tuple(stored.failed_revisions or ()), stored.last_command,
                       AnalysisOutcome(stored.analysis_verdict) if stored.analysis_verdict else None,
                       stored.analysis_message or "", stored.analysis_time,
                       AnalysisOutcome(stored.quality_verdict) if stored.quality_verdict else None,
                       stored.quality_message or "")


def canary_status(canary: CanaryStep) -> CanaryStatus | None:
    state, split = canary.state, canary.split
    if state is None:
        return None
    return CanaryStatus(
        phase=state.phase, stable_revision=state.stable_revision, canary_revision=state.canary_revision,
        step_index=state.step_index, canary_replicas=split.canary_replicas if split else 0,
        weight_percent=split.weight_percent if split else 0, step_started_time=state.step_started,
        message=state.message[:1024] or None, failed_revisions=list(state.failed_revisions) or None,
        last_command=state.last_command, analysis_verdict=state.verdict.value if state.verdict else None,
        analysis_message=state.verdict_message[:1024] or None, analysis_time=state.evaluated,
        quality_verdict=state.quality.value if state.quality else None,
        quality_message=state.quality_message[:1024] or None)


def canary_runs(ctx: Context, spec: LLMDeploymentSpec, revision: str) -> bool:
    """A canary rolls `revision` out: steps are set and another revision serves as stable."""
    stable = ctx.stored.stable_revision
    # Not conditioned on seeing stable's Deployment: a child missing from the indexes for a pass
    # (a watch being re-established) must not end a canary.
    return bool(spec.rollout and spec.rollout.steps) and stable is not None and stable != revision


def _gpus_per_replica(workload: dict) -> int:
    """A Deployment's pod's GPUs, or a LeaderWorkerSet group's: its leader's and its workers'."""
    spec = workload["spec"]
    group = spec.get("leaderWorkerTemplate")
    if group is None:
        return _pod_gpus(spec["template"])
    return _pod_gpus(group["leaderTemplate"]) + (group["size"] - 1) * _pod_gpus(group["workerTemplate"])


def _pod_gpus(template: dict) -> int:
    return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU_RESOURCE, 0))
               for c in template["spec"]["containers"])


def walk_canary(ctx: Context, spec: LLMDeploymentSpec, plan: Plan, revision: str, build: BuildState,
                desired: int, observations: Observations) -> CanaryStep:
    stored = canary_state(ctx.stored.canary)
    if not canary_runs(ctx, spec, revision):
        if stored is not None and stored.active:
            # The spec went back to the stable revision, or dropped its steps: the canary ends.
            message = f"canary {stored.canary_revision} ended: the spec now asks for revision {revision}"
            return CanaryStep(supersede(stored, ctx.now, message), None, (Event.normal(Reason.CANARY_SUPERSEDED, message),))
        return CanaryStep(stored)
    serving = ctx.children.serving
    stable = ctx.stored.stable_revision
    canary_gpus = plan.tensor_parallel_size * plan.pipeline_parallel_size
    budget = spec.resources.gpu_budget if spec.resources else None
    stable_gpus = _gpus_per_replica(serving[stable]) if stable in serving else canary_gpus
    room = desired if budget is None else (budget - desired * stable_gpus) // canary_gpus
    samples, golden = observations.samples, observations.golden
    observed = Observed(revision, stable, build.finished, build.failed, ctx.children.ready(revision),
                        desired, max(0, room), ctx.now, Command.parse(ctx.rollout_command),
                        None if samples is None else judge(samples, spec.rollout.gates, spec.slo.ttft_p99_ms,
                                                           _histogram_bounds(spec, serving.get(stable))),
                        None if golden is None or spec.rollout.quality is None
                        else judge_quality(golden, spec.rollout.quality), observations.not_ready_reason)
    decision = advance(stored, tuple(spec.rollout.steps), observed, spec.rollout.gates,
                       check_quality=spec.rollout.quality is not None)
    events = tuple(Event.warning(reason, message) if reason == Reason.CANARY_ROLLED_BACK
                   else Event.normal(reason, message) for reason, message in decision.events)
    return CanaryStep(decision.state, decision.split, events)


def stable_rescaled(ctx: Context, canary: CanaryStep, autoscaled: bool) -> list[tuple[dict, int]]:
    """(the stable revision's Deployment, its replicas) when the autoscaler changed them while a
    canary runs or after one was rolled back. This pass renders only the current revision; the
    stable one's objects are an older spec's, so only their replica count is written. Without
    the autoscaler stable keeps the replicas its own plan gave it (another plan's count would
    not be its capacity)."""
    state, split = canary.state, canary.split
    if not autoscaled or split is None or state.phase == CanaryPhase.PROMOTED:
        return []
    deployment = ctx.children.serving.get(state.stable_revision)
    if deployment is None or (deployment.get("spec") or {}).get("replicas") == split.stable_replicas:
        return []
    return [(deployment, split.stable_replicas)]


def route_weights(ctx: Context, revision: str, canary: CanaryStep) -> dict[str, int]:
    """The HTTPRoute's weight per revision: a running canary's share of the replicas beside
    stable; otherwise all on the serving revision (stable until a new one has replaced it)."""
    state = canary.state
    if canary.split is not None and state is not None and state.phase != CanaryPhase.PROMOTED:
        weight = canary.split.weight_percent
        return {state.stable_revision: 100 - weight, state.canary_revision: weight}
    return {ctx.stored.stable_revision or revision: 100} if canary.split is None else {revision: 100}
