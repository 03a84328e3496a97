"""What a deployment is due: a pass on the next tick, an observation of its traffic, an
analysis of its canary, the golden prompts, a look at its pods. Pure questions, asked before
any I/O so that a pass reads only what it will use. `needs_periodic_pass` and
`observation_due` read the raw body: the ticker asks them of every deployment every tick."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from llmfleet.api import QualityGate
from llmfleet.api.enums import LiveReplanning
from llmfleet.api.status import CanaryPhase
from llmfleet.reconcile.canary import canary_state
from llmfleet.reconcile.context import Children, Context
from llmfleet.rollout import CanaryState, analysis_due, replicas_overdue
from llmfleet.rollout import Outcome as AnalysisOutcome
from llmfleet.settings import OperatorSettings

# Canary phases after which nothing happens until the spec or a command changes.
_SETTLED_CANARY_PHASES = {CanaryPhase.PROMOTED.value, CanaryPhase.ROLLED_BACK.value,
                          CanaryPhase.SUPERSEDED.value}


def needs_periodic_pass(body: dict, children) -> bool:
    """Whether time alone can change this deployment's decisions, so that it is passed every
    tick: the autoscaler reads metrics, a canary walks timed steps and deadlines, replicas short
    of ready change their story (restarts, the scale-up grace), a recommendation waits to be
    served. Anything else moves only on a change of the object or one of its children, which
    triggers a pass by itself."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    if (spec.get("autoscaling") or {}).get("enabled"):
        return True
    if status.get("recommendation") and (spec.get("plan") or {}).get("liveReplanning") == LiveReplanning.AUTOMATIC.value:
        return True  # to serve it once the revision settles
    phase = (status.get("canary") or {}).get("phase")
    if phase is not None and phase not in _SETTLED_CANARY_PHASES:
        return True
    return short_of_ready(body, Children.sorted_from(children)) is not None


def observation_due(body: dict, now: datetime, settings: OperatorSettings) -> str | None:
    """The revision whose traffic to observe now: live re-planning is on, the revision has
    settled (rolled out, no canary, its plan made for this generation) and serves, and the
    last observation written is older than the interval (the caller paces the ones that told
    nothing new, and were not written)."""
    spec_plan = ((body.get("spec") or {}).get("plan")) or {}
    if spec_plan.get("liveReplanning", LiveReplanning.RECOMMEND.value) == LiveReplanning.OFF.value:
        return None
    status = body.get("status") or {}
    revision = status.get("currentRevision")
    if (revision is None or revision != status.get("stableRevision") or not status.get("readyReplicas")
            or status.get("observedGeneration") != body["metadata"].get("generation")):
        return None
    last = (status.get("observation") or {}).get("time")
    if last is not None:
        observed_at = datetime.strptime(last, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        if (now - observed_at).total_seconds() < settings.observation_interval_seconds:
            return None
    return revision


def short_of_ready(body: dict, children: Children) -> str | None:
    """The stored current revision when its serving Deployment has fewer ready replicas than it
    asks for: its pods are then asked why (and only then, not on every pass)."""
    revision = (body.get("status") or {}).get("currentRevision")
    deployment = children.serving.get(revision)
    if revision is None or deployment is None:
        return None
    return revision if (deployment.get("spec") or {}).get("replicas", 0) > children.ready(revision) else None


def failing_build(ctx: Context) -> str | None:
    """The current revision, when its build Job has had a failed attempt: then its pods are
    read for what the last one said."""
    revision = ctx.stored.current_revision
    job = ctx.children.build_jobs.get(revision) if revision else None
    return revision if job is not None and ((job.get("status") or {}).get("failed") or 0) > 0 else None


def _running_canary(ctx: Context) -> CanaryState | None:
    """The stored canary of a deployment whose spec has canary steps."""
    deployment = ctx.deployment
    if deployment is None or not deployment.spec.rollout or not deployment.spec.rollout.steps:
        return None
    return canary_state(ctx.stored.canary)


@dataclass(frozen=True)
class AnalysisQuery:
    stable_revision: str
    canary_revision: str
    step_elapsed_seconds: int
    step_started: datetime | None = None
    last_evaluated: datetime | None = None

    @property
    def evaluation(self) -> tuple:
        """Which evaluation this is, whatever the second it is asked in."""
        return self.stable_revision, self.canary_revision, self.step_started, self.last_evaluated


def analysis_query(ctx: Context) -> AnalysisQuery | None:
    """The canary's current step, when it is an analysis whose next evaluation is due."""
    state = _running_canary(ctx)
    if state is None:
        return None
    steps = ctx.deployment.spec.rollout.steps
    if state.step_index >= len(steps) or not analysis_due(state, steps[state.step_index], ctx.now):
        return None
    elapsed = int((ctx.now - state.step_started).total_seconds()) if state.step_started else 0
    return AnalysisQuery(state.stable_revision, state.canary_revision, elapsed, state.step_started, state.evaluated)


@dataclass(frozen=True)
class QualityQuery:
    stable_revision: str
    canary_revision: str
    canary_replicas: int
    gate: QualityGate


def quality_query(ctx: Context) -> QualityQuery | None:
    """What to ask when a warming canary still owes its golden prompts."""
    state = _running_canary(ctx)
    quality = ctx.deployment.spec.rollout.quality if state is not None else None
    if state is None or state.phase != CanaryPhase.WARMING or quality is None \
            or state.quality == AnalysisOutcome.SUCCESSFUL:
        return None
    return QualityQuery(state.stable_revision, state.canary_revision, state.canary_replicas, quality)


def overdue_canary(ctx: Context) -> str | None:
    """The canary revision when the replicas its phase or step waits for are past
    canaryReadyDeadlineSeconds (its pods then say why)."""
    state = _running_canary(ctx)
    if state is None:
        return None
    rollout = ctx.deployment.spec.rollout
    waits_for_replicas = state.phase == CanaryPhase.WARMING or (
        state.phase == CanaryPhase.PROGRESSING and state.step_index < len(rollout.steps)
        and rollout.steps[state.step_index].set_weight is not None)
    return state.canary_revision if waits_for_replicas and replicas_overdue(state, rollout.gates, ctx.now) else None
