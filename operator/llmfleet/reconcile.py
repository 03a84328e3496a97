"""One level-based pipeline for every LLMDeployment event and timer tick, in named steps:

    context -> validate -> plan -> build -> scale -> render -> roll out and prune
            -> conditions -> status (diffed with the stored one) -> events

`decide` is pure: from the stored object, its children and the time it returns what to apply,
what to delete, the new status, whether it differs from the stored one, and the events.
`reconcile` does the I/O around it through the k8s gateway and patches status only on change.
Every error a user can cause (a spec the models reject, a spec render refuses) ends as a
condition, never as an exception Kopf would retry forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import cached_property

from pydantic import ValidationError

from llmfleet.api import (
    ConditionStatus,
    QualityGate,
    ConditionType,
    InvalidSpecError,
    LLMDeployment,
    LLMDeploymentSpec,
    Reason,
    find_condition,
    set_condition,
)
from llmfleet.api.conditions import Condition
from llmfleet.api.enums import LiveReplanning
from llmfleet.api.status import (
    AutoscalerStatus,
    CanaryPhase,
    CanaryStatus,
    LearnedSpeed,
    LLMDeploymentStatus,
    ReplicaRecommendation,
)
from llmfleet.autoscale import AutoscalerState, MetricsSnapshot, Recommendation, describe_ttft_p99, display_round
from llmfleet.autoscale import decide as autoscale
from llmfleet.k8s import WriteRefused
from llmfleet.metrics import metrics_windows
from llmfleet.metrics.cadence import RATE_WINDOW_SCRAPES
from llmfleet.planner import plan as make_plan
from llmfleet.planner.live import (
    ObservedWorkload,
    engine_for_plan,
    fit_speed_factor,
    learn,
    recommend,
    workload_as_observed,
    workload_drift,
)
from llmfleet.planner.spec_adapter import (
    learned_speeds,
    model_key,
    plan_from_status,
    plan_request_from_spec,
    plan_status_from_plan,
    serving_release,
    speed_factors_for,
)
from llmfleet.planner.types import ClusterGpus, Plan, SpeedFactor
from llmfleet.inference import ask_golden_prompts
from llmfleet.inference.golden import Replica
from llmfleet.render import (
    RenderError,
    engine_build,
    namespace_prerequisites,
    render,
    revision_hash,
    serving,
)
from llmfleet.render.identity import COMPONENT_LABEL, REVISION_LABEL, selector_labels
from llmfleet.render.layout import GRPC_PORT, REQUEST_MODEL, TTFT_HISTOGRAM_BUCKETS_MS
from llmfleet.render.pod import GPU_RESOURCE
from llmfleet.rollout import (
    CanaryState,
    Command,
    Observed,
    Samples,
    Split,
    advance,
    analysis_due,
    judge,
    replicas_overdue,
    supersede,
)
from llmfleet.rollout import Outcome as AnalysisOutcome
from llmfleet.rollout.quality import GoldenAnswers, judge_quality, parse_prompts
from llmfleet.settings import OperatorSettings

log = logging.getLogger(__name__)
SERVER_COMPONENT = serving.COMPONENT
BUILD_COMPONENT = engine_build.COMPONENT
TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
# Conditions whose True status is bad news, for the event type on transitions.
BAD_WHEN_TRUE = {ConditionType.DEGRADED.value}
# Any new value asks for a new plan without a spec change (e.g. after a catalog update).
# Room in a condition message for the apiserver's words about a refused write.
MAX_REFUSAL_CHARS = 900
REPLAN_ANNOTATION = "llmfleet.io/replan"
# `<verb>/<id>` (promote, abort, pause, resume, retry), written by `llmfleet rollout`.
ROLLOUT_COMMAND_ANNOTATION = "llmfleet.io/rollout-command"


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    # Shared objects the workload needs, created when missing and otherwise left alone.
    ensure: list[dict] = field(default_factory=list)
    apply: list[dict] = field(default_factory=list)
    delete: list[dict] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    # False: the status equals the stored one and is not written.
    status_changed: bool = True
    events: list[Event] = field(default_factory=list)
    # The pass read the revision's traffic from Prometheus (set by `reconcile`).
    observed: bool = False
    # The object changed while the pass ran, so its status was not written (set by `reconcile`):
    # the pass must be made again, from the new version.
    superseded: bool = False


@dataclass(frozen=True)
class BuildState:
    finished: bool
    failed: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Context:
    """What one pass reads, built once: the stored object and status, the children, the time."""

    body: dict
    children: tuple[dict, ...]
    settings: OperatorSettings
    now: datetime
    snapshot: MetricsSnapshot | None = None

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def generation(self) -> int | None:
        return self.body["metadata"].get("generation")

    @property
    def raw_status(self) -> dict:
        return self.body.get("status") or {}

    @cached_property
    def stored(self) -> LLMDeploymentStatus:
        """The stored status; empty when it no longer parses (written by an older operator)."""
        try:
            return LLMDeploymentStatus.model_validate(self.raw_status)
        except ValidationError:
            return LLMDeploymentStatus()

    @cached_property
    def conditions_before(self) -> list[Condition]:
        return list(self.stored.conditions or [])

    @property
    def replan_request(self) -> str | None:
        return (self.body["metadata"].get("annotations") or {}).get(REPLAN_ANNOTATION)

    def condition(self, conditions: list[Condition], kind: ConditionType, status: ConditionStatus,
                  reason: str, message: str) -> list[Condition]:
        return set_condition(conditions, kind, status, reason, message, self.now, self.generation)


def _labels(obj: dict) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _ready_replicas(deployment: dict | None) -> int:
    return ((deployment or {}).get("status") or {}).get("readyReplicas") or 0


# --- validate -------------------------------------------------------------------------------------

def _validate(ctx: Context) -> LLMDeployment:
    """The typed object; InvalidSpecError names every field the models reject."""
    return LLMDeployment.from_manifest(ctx.body)


# --- plan -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanChoice:
    plan: Plan | None  # None: no allowed configuration meets the spec
    status: dict  # status.plan
    # How it was come by: the stored plan kept, a new one planned, or the recommendation adopted.
    origin: str = "stored"


def _dump(model) -> dict:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _settled(stored: LLMDeploymentStatus) -> bool:
    """The current revision is the stable one: no rollout or canary under way."""
    return stored.current_revision is not None and stored.current_revision == stored.stable_revision


def _plan(ctx: Context, spec: LLMDeploymentSpec, cluster_gpus: Callable[[], ClusterGpus] | None,
          fleet_speeds: Callable[[], list[LearnedSpeed]] | None) -> PlanChoice:
    """The stored plan while the spec is unchanged and no re-plan is asked for, so an operator
    upgrade with new calibration neither re-plans nor rebuilds what serves, and GPUs freed or
    taken elsewhere do not move it; the recommended plan instead once the revision has settled
    when live re-planning is automatic; else a new plan for the cluster's GPUs now, with the
    speeds learned so far."""
    stored = ctx.stored
    if (stored.plan is not None and stored.observed_generation == ctx.generation
            and stored.replan_request == ctx.replan_request):
        recommended = stored.recommendation
        if (recommended is not None and _live_replanning(spec) == LiveReplanning.AUTOMATIC and _settled(stored)
                and plan_from_status(recommended.plan) is not None):
            return PlanChoice(plan_from_status(recommended.plan), _dump(recommended.plan), "adopted")
        reused = plan_from_status(stored.plan)
        if reused is not None or not stored.plan.gpu_type:
            return PlanChoice(reused, _dump(stored.plan))
    request = plan_request_from_spec(spec, cluster_gpus=cluster_gpus() if cluster_gpus else None,
                                     learned=_all_learned(ctx, fleet_speeds))
    fresh = make_plan(request)
    return PlanChoice(fresh if fresh.feasible else None,
                      _dump(plan_status_from_plan(fresh, request.workload.peak_requests_per_sec)), "planned")


def _all_learned(ctx: Context, fleet_speeds: Callable[[], list[LearnedSpeed]] | None) -> list[LearnedSpeed]:
    return [*(ctx.stored.learned_speeds or ()), *(fleet_speeds() if fleet_speeds else ())]


# --- learn from live traffic ----------------------------------------------------------------------

def _live_replanning(spec: LLMDeploymentSpec) -> LiveReplanning:
    return spec.plan.live_replanning if spec.plan else LiveReplanning.RECOMMEND


def observation_due(body: dict, now: datetime, settings: OperatorSettings) -> str | None:
    """The revision whose traffic to observe now: live re-planning is on, the revision has
    settled (rolled out, no canary, its plan made for this generation) and serves, and the
    last observation written is older than the interval (the caller paces the ones that told
    nothing new, and were not written). Read from the raw body: the ticker asks this of every
    deployment."""
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


@dataclass(frozen=True)
class Learning:
    status: dict  # observation, learnedSpeeds and recommendation, as far as they change
    events: tuple[Event, ...] = ()


def _learn(ctx: Context, spec: LLMDeploymentSpec, choice: PlanChoice, revision: str,
           observed: ObservedWorkload | None, cluster_gpus: Callable[[], ClusterGpus] | None,
           fleet_speeds: Callable[[], list[LearnedSpeed]] | None) -> Learning:
    """From an observation of the served revision: the speed fitted to it, folded into the
    learned speeds, and a recommendation when a plan for the observed workload with those
    speeds differs from the one served. A recommendation goes when the plan changes."""
    stored = ctx.stored
    if choice.origin == "adopted":
        recommended = stored.recommendation
        return Learning({"recommendation": None}, (Event("Normal", Reason.REPLANNED,
                                                         f"serving the recommended plan: {recommended.message}"),))
    if choice.origin == "planned":
        return Learning({"recommendation": None})
    if observed is None or choice.plan is None:
        return Learning({})
    observation = {"time": ctx.now.strftime("%Y-%m-%dT%H:%M:%SZ"), "revision": revision,
                   "windowSeconds": observed.window_seconds, "requests": round(observed.requests),
                   "requestsPerSecond": round(observed.requests_per_second, 3), "replicas": observed.replicas}
    requested_seconds = ctx.settings.observation_window_seconds
    widened = (f"the {requested_seconds} s window holds fewer than {RATE_WINDOW_SCRAPES} scrapes: widened to "
               f"{observed.window_seconds} s; " if observed.window_seconds > requested_seconds else "")
    if observed.error:
        return Learning(_news(ctx, {**observation, "message": f"{widened}Prometheus: {observed.error}"[:1024]}))
    plan = choice.plan
    fleet = fleet_speeds() if fleet_speeds else []  # parsed from every deployment's status: once
    request = plan_request_from_spec(spec, cluster_gpus=cluster_gpus() if cluster_gpus else None,
                                     learned=[*(stored.learned_speeds or ()), *fleet])
    declared, planned_peak = request.workload, stored.plan.peak_requests_per_second
    workload = workload_as_observed(declared, observed, planned_peak, longest_prompt_tokens=spec.engine.max_input_len,
                                    longest_sequence_tokens=spec.engine.max_seq_len)
    fit = fit_speed_factor(engine_for_plan(request, plan), workload, observed,
                           min_requests=ctx.settings.observation_min_requests,
                           ttft_histogram_top_ms=TTFT_HISTOGRAM_BUCKETS_MS[-1])
    observation.update({"ttftP99Ms": _round(observed.ttft_p99_ms, 1),
                        "inputTokensMean": _round(observed.input_tokens_mean, 1),
                        "outputTokensMean": _round(observed.output_tokens_mean, 1),
                        "prefixReuseFraction": _round(observed.prefix_reuse_fraction, 3),
                        "speedFactor": _round(fit.factor, 4), "message": (widened + fit.note)[:1024]})
    speeds = list(stored.learned_speeds or ())
    if fit.factor is not None:
        known = next((SpeedFactor(plan.gpu_type, plan.quantization, s.speed_factor, s.requests) for s in speeds
                      if (s.model, s.gpu_type.value, s.quantization.value)
                      == (model_key(spec), plan.gpu_type, plan.quantization)), None)
        speeds = learned_speeds(spec, speeds, learn(known, plan.gpu_type, plan.quantization, fit.factor,
                                                    round(observed.requests)))
    request = replace(request, workload=workload, space=replace(
        request.space, speed_factors=speed_factors_for(spec, [*speeds, *fleet])))
    drift = workload_drift(declared, observed, planned_peak)
    advice = recommend(request, plan, drift, replicas_autoscaled=spec.autoscaling.enabled)
    if drift and advice is None:
        observation["message"] = f"{observation['message']}; {'; '.join(drift)}: the served plan meets it"[:1024]
    status = {**_news(ctx, {k: v for k, v in observation.items() if v is not None}),
              "learnedSpeeds": [_dump(s) for s in speeds] or None, "recommendation": None}
    if advice is None:
        return Learning(status)
    recommended = plan_status_from_plan(advice.plan, workload.peak_requests_per_sec)
    before = stored.recommendation
    unchanged = before is not None and before.reason == advice.reason and before.plan.summary == recommended.summary \
        and before.plan.replicas == recommended.replicas
    status["recommendation"] = {"reason": advice.reason, "message": advice.message[:2048],
                                "time": (before.time if unchanged else ctx.now).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "plan": _dump(recommended)}
    return Learning(status, () if unchanged else (Event("Normal", advice.reason, advice.message),))


def _news(ctx: Context, observation: dict) -> dict:
    """{"observation": ...} when it tells something the stored one did not (its time aside): an
    idle deployment's empty windows are not written again and again."""
    def story(observed: dict | None) -> dict:
        return {key: value for key, value in (observed or {}).items() if key != "time"}
    return {} if story(ctx.raw_status.get("observation")) == story(observation) else {"observation": observation}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# --- build ----------------------------------------------------------------------------------------

def _build_job(children, revision: str | None) -> dict | None:
    return next((c for c in children if c["kind"] == "Job" and _labels(c).get(REVISION_LABEL) == revision), None)


def build_state(children: tuple[dict, ...] | list[dict], revision: str, last_failure: str | None = None) -> BuildState:
    """Where the revision's build (or prepare) Job is; `last_failure` what its last failed pod
    said (`failing_build`, `last_build_failure`), quoted while it retries and once it failed."""
    why = f"; last failure: {last_failure}" if last_failure else ""
    job = _build_job(children, revision)
    if job is None:
        return BuildState(False, False, Reason.BUILD_PENDING, "the Job filling the engine cache is being created")
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition["type"] in ("Complete", "SuccessCriteriaMet"):
            return BuildState(True, False, Reason.ENGINE_READY,
                              f"engine cache entry ready (Job {job['metadata']['name']})")
        if condition["type"] in ("Failed", "FailureTarget"):
            reason = condition.get("reason") or "BackoffLimitExceeded"
            return BuildState(False, True, Reason.BUILD_FAILED,
                              f"Job {job['metadata']['name']} failed ({reason}): "
                              f"{condition.get('message') or 'see the Job pod logs'}{why}")
    failed_attempts = status.get("failed") or 0
    retrying = (f"; {failed_attempts} attempt{'s' if failed_attempts != 1 else ''} failed, retried with the "
                f"Job's backoff (backoffLimit {(job.get('spec') or {}).get('backoffLimit', 6)})"
                if failed_attempts else "")
    return BuildState(False, False, Reason.BUILDING,
                      f"Job {job['metadata']['name']} is filling the engine cache{retrying}{why if retrying else ''}")


def failing_build(body: dict, children) -> str | None:
    """The current revision, when its build Job has had a failed attempt: then the reconcile
    pass reads the Job's pods for what the last one said."""
    revision = ((body.get("status") or {}).get("currentRevision"))
    job = _build_job(children, revision) if revision else None
    return revision if job is not None and ((job.get("status") or {}).get("failed") or 0) > 0 else None


def last_build_failure(pods: list[dict]) -> str | None:
    """The newest failed container of the build pods, with the last line of its termination
    message (the log's tail: the error a failing tool prints last)."""
    failures = []
    for pod in pods:
        status = pod.get("status") or {}
        for entry in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            for state in (entry.get("state") or {}, entry.get("lastState") or {}):
                terminated = state.get("terminated") or {}
                if terminated.get("exitCode"):
                    failures.append((terminated.get("finishedAt") or "", pod["metadata"]["name"], entry["name"],
                                     terminated))
    if not failures:
        return None
    _, pod_name, container, terminated = max(failures, key=lambda failure: failure[0])
    said = _last_line(terminated.get("message"))
    return f"pod {pod_name} container {container} exited with code {terminated['exitCode']}" + (
        f": {said}" if said else "")


def _last_line(message: str | None) -> str | None:
    """The last non-empty line of a termination message: what a failing program printed last."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


# --- scale ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scaling:
    desired_replicas: int
    # The replicas before this pass: stored, or the plan's on the first pass.
    previous_replicas: int
    autoscaler: dict | None = None
    decision: object | None = None  # autoscale.Decision when the autoscaler decided


def _autoscaler_state(stored: AutoscalerStatus | None) -> AutoscalerState:
    if stored is None:
        return AutoscalerState()
    return AutoscalerState(
        last_scale_time=stored.last_scale_time, warming_since=stored.warming_since,
        recommendations=tuple(Recommendation(r.time, r.replicas) for r in stored.recommendations or ()))


def _autoscaler_status(decision, stored: AutoscalerStatus | None, now: datetime) -> dict:
    state = decision.state
    unchanged = (stored is not None and stored.last_decision == decision.decision
                 and stored.desired_replicas == decision.desired_replicas)
    status = AutoscalerStatus(
        desired_replicas=decision.desired_replicas, last_decision=decision.decision,
        last_decision_time=stored.last_decision_time if unchanged else now, reason=decision.reason[:1024],
        inputs=decision.inputs, last_scale_time=state.last_scale_time, warming_since=state.warming_since,
        recommendations=[ReplicaRecommendation(time=r.time, replicas=r.replicas)
                         for r in state.recommendations] or None)
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def _scale(ctx: Context, spec: LLMDeploymentSpec, plan: Plan, build: BuildState, ready: int) -> Scaling:
    stored_replicas = ctx.stored.replicas
    previous = stored_replicas if stored_replicas is not None else plan.replicas
    if not spec.autoscaling.enabled:
        return Scaling(plan.replicas, previous)
    scaling = spec.autoscaling
    current = min(max(previous, scaling.min_replicas), scaling.max_replicas)
    decision = autoscale(scaling, spec.slo.ttft_p99_ms,
                         ctx.snapshot or MetricsSnapshot(error="no Prometheus URL configured"),
                         _autoscaler_state(ctx.stored.autoscaler), current, ready if build.finished else current,
                         ctx.now)
    return Scaling(decision.desired_replicas, previous,
                   _autoscaler_status(decision, ctx.stored.autoscaler, ctx.now), decision)


# --- roll out and prune ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Rollout:
    revision: str
    stable_revision: str | None
    serving: dict[str, dict]  # revision -> its serving Deployment
    ready: int  # ready replicas of the current revision
    ready_anywhere: int  # ready replicas of every revision that still serves
    delete: list[dict]

    @property
    def rolled_out(self) -> bool:
        return self.stable_revision == self.revision


def _serving_deployments(children) -> dict[str, dict]:
    return {_labels(c).get(REVISION_LABEL): c for c in children
            if c["kind"] == "Deployment" and _labels(c).get(COMPONENT_LABEL) == SERVER_COMPONENT}


def _roll_out(ctx: Context, revision: str, build: BuildState, desired: int, manifests: list[dict],
              canary: "CanaryStep") -> Rollout:
    """Without canary steps a new revision surges beside the stable one and becomes stable once
    all its replicas are ready; with them, once the canary is promoted. Then the older
    revisions go. A revision that completed once stays stable when replicas are later lost or
    added (that is Degraded or a scale-up, not a rollout)."""
    serving = _serving_deployments(ctx.children)
    ready = _ready_replicas(serving.get(revision))
    stable = ctx.stored.stable_revision
    if canary.split is not None:
        if canary.state.phase == CanaryPhase.PROMOTED:
            stable = revision
    elif stable != revision and build.finished and revision in serving and ready >= desired:
        stable = revision
    rolled_out = stable == revision
    wanted = {_key(m) for m in manifests}
    # Components an older revision keeps while it still serves: never its build Job, and its
    # own Service only while routing is on (switched off, every revision's Service goes).
    kept_components = {_labels(m).get(COMPONENT_LABEL) for m in manifests} - {BUILD_COMPONENT}
    delete = []
    for child in ctx.children:
        if _key(child) in wanted:
            continue
        child_revision = _labels(child).get(REVISION_LABEL)
        # Until the new revision is stable only the stable one keeps serving (every older one
        # while no stable revision is recorded, as for objects of an older operator).
        keep_serving = (not rolled_out and child_revision in serving and child_revision != revision
                        and (child_revision == stable or ctx.stored.stable_revision is None)
                        and _labels(child).get(COMPONENT_LABEL) in kept_components)
        if not keep_serving:
            delete.append(child)
    ready_anywhere = sum(_ready_replicas(d) for rev, d in serving.items() if rev == revision or not rolled_out)
    return Rollout(revision, stable, serving, ready, ready_anywhere, delete)


# --- canary ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CanaryStep:
    state: CanaryState | None  # the rollout to record (the last one, also when none runs now)
    split: Split | None = None  # replicas per revision while a canary runs
    events: tuple[Event, ...] = ()


def _canary_state(stored: CanaryStatus | None) -> CanaryState | None:
    if stored is None or stored.phase is None or not stored.stable_revision or not stored.canary_revision:
        return None
    return CanaryState(stored.phase, stored.stable_revision, stored.canary_revision, stored.step_index or 0,
                       stored.canary_replicas or 0, stored.step_started_time, stored.message or "",
                       tuple(stored.failed_revisions or ()), stored.last_command,
                       AnalysisOutcome(stored.analysis_verdict) if stored.analysis_verdict else None,
                       stored.analysis_message or "", stored.analysis_time,
                       AnalysisOutcome(stored.quality_verdict) if stored.quality_verdict else None,
                       stored.quality_message or "")


def _canary_status(state: CanaryState | None, split: Split | None) -> dict | None:
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
        quality_message=state.quality_message[:1024] or None,
    ).model_dump(mode="json", by_alias=True, exclude_none=True)


def _canary_runs(ctx: Context, spec: LLMDeploymentSpec, revision: str) -> bool:
    """A canary rolls `revision` out: steps are set and another revision serves as stable."""
    stable = ctx.stored.stable_revision
    # Not conditioned on seeing stable's Deployment: a child missing from the indexes for a pass
    # (a watch being re-established) must not end a canary.
    return bool(spec.rollout and spec.rollout.steps) and stable is not None and stable != revision


def _gpus_per_replica(deployment: dict) -> int:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU_RESOURCE, 0)) for c in containers)


def _canary(ctx: Context, spec: LLMDeploymentSpec, plan: Plan, revision: str, build: BuildState,
            desired: int, samples: Samples | None, golden: GoldenAnswers | None,
            not_ready_reason: str | None) -> CanaryStep:
    stored = _canary_state(ctx.stored.canary)
    if not _canary_runs(ctx, spec, revision):
        if stored is not None and stored.active:
            # The spec went back to the stable revision, or dropped its steps: the canary ends.
            message = f"canary {stored.canary_revision} ended: the spec now asks for revision {revision}"
            return CanaryStep(supersede(stored, ctx.now, message), None, (Event("Normal", "CanarySuperseded", message),))
        return CanaryStep(stored)
    serving = _serving_deployments(ctx.children)
    stable = ctx.stored.stable_revision
    canary_gpus = plan.tensor_parallel_size * plan.pipeline_parallel_size
    budget = spec.resources.gpu_budget if spec.resources else None
    stable_gpus = _gpus_per_replica(serving[stable]) if stable in serving else canary_gpus
    room = desired if budget is None else (budget - desired * stable_gpus) // canary_gpus
    observed = Observed(revision, stable, build.finished, build.failed, _ready_replicas(serving.get(revision)),
                        desired, max(0, room), ctx.now,
                        Command.parse((ctx.body["metadata"].get("annotations") or {}).get(ROLLOUT_COMMAND_ANNOTATION)),
                        None if samples is None else judge(samples, spec.rollout.gates),
                        None if golden is None or spec.rollout.quality is None
                        else judge_quality(golden, spec.rollout.quality), not_ready_reason)
    decision = advance(stored, tuple(spec.rollout.steps), observed, spec.rollout.gates,
                       check_quality=spec.rollout.quality is not None)
    events = tuple(Event("Warning" if reason == Reason.CANARY_ROLLED_BACK else "Normal", reason, message)
                   for reason, message in decision.events)
    return CanaryStep(decision.state, decision.split, events)


def _route_weights(ctx: Context, revision: str, canary: CanaryStep) -> dict[str, int]:
    """The HTTPRoute's weight per revision: a running canary's share of the replicas beside
    stable; otherwise all on the serving revision (stable until a new one has replaced it)."""
    state = canary.state
    if canary.split is not None and state is not None and state.phase != CanaryPhase.PROMOTED:
        weight = canary.split.weight_percent
        return {state.stable_revision: 100 - weight, state.canary_revision: weight}
    return {ctx.stored.stable_revision or revision: 100} if canary.split is None else {revision: 100}


# --- conditions -----------------------------------------------------------------------------------

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


def _canary_conditions(rollout: Rollout, canary: CanaryStep) -> tuple[tuple, tuple, tuple]:
    """Progressing, Degraded and Ready while a canary runs or was rolled back: the stable
    revision serves throughout."""
    state, stable = canary.state, rollout.stable_revision
    stable_ready = _ready_replicas(rollout.serving.get(stable))
    where = (f"canary {state.canary_revision} {state.phase.value}, {canary.split.weight_percent}% of replicas: "
             f"{state.message}")
    if state.phase == CanaryPhase.ROLLED_BACK:
        progressing = (FALSE, Reason.CANARY_ROLLED_BACK, state.message)
        degraded = (TRUE, Reason.CANARY_ROLLED_BACK, state.message)
    else:
        progressing = (TRUE, Reason.ROLLING_OUT, where)
        degraded = (FALSE, Reason.AS_PLANNED, where)
    ready = ((TRUE, Reason.SERVING, f"stable revision {stable} serves with {stable_ready} replica(s) ready; {where}")
             if stable_ready else (FALSE, Reason.REPLICAS_NOT_READY, f"stable revision {stable}: no replica ready"))
    return progressing, degraded, ready


def _conditions(ctx: Context, plan_status: dict, build: BuildState, rollout: Rollout, scaling: Scaling,
                canary: CanaryStep, pods_say: str | None) -> list[Condition]:
    """Every condition of a plannable spec, from the pass's facts and the reason constants.
    `pods_say` is why the revision's pods are not ready, when they say."""
    desired, ready = scaling.desired_replicas, rollout.ready
    counts = f"{ready}/{desired} replicas ready"
    short = f"{counts}; {pods_say}" if pods_say and ready < desired else counts
    scaling_up = _scaling_up(ctx, rollout, scaling)
    if plan_status.get("capacityShortfall"):
        planned = (FALSE, Reason.CAPACITY_SHORTFALL, f"{plan_status['capacityShortfall']}; serving "
                   f"{plan_status.get('summary', '')} x{plan_status.get('replicas')} meanwhile (to plan again once "
                   f"GPUs are free, set the annotation {REPLAN_ANNOTATION})")
    else:
        planned = (TRUE, Reason.PLAN_FOUND,
                   f"{plan_status.get('summary', '')} x{desired}: " + (plan_status.get("rationale") or [""])[0])
    after = ctx.condition(ctx.conditions_before, ConditionType.PLANNED, *planned)
    after = ctx.condition(after, ConditionType.ENGINE_BUILT, TRUE if build.finished else FALSE, build.reason,
                          build.message)
    after = ctx.condition(after, ConditionType.WORKLOAD_AVAILABLE, TRUE if rollout.ready_anywhere else FALSE,
                          Reason.REPLICAS_READY if rollout.ready_anywhere else Reason.NO_READY_REPLICAS,
                          f"{rollout.ready_anywhere} replica(s) ready to serve")
    revision = f"revision {rollout.revision}: "
    if build.failed:
        progressing = (FALSE, Reason.BUILD_FAILED, revision + build.message)
    elif not build.finished:
        progressing = (TRUE, Reason.BUILDING, revision + build.message)
    elif not rollout.rolled_out:
        progressing = (TRUE, Reason.ROLLING_OUT, revision + counts)
    elif scaling_up:
        progressing = (TRUE, Reason.SCALING_UP, revision + counts)
    else:
        progressing = (FALSE, Reason.ROLLED_OUT, revision + counts)
    if canary.split is not None and not rollout.rolled_out:
        progressing, degraded, ready_condition = _canary_conditions(rollout, canary)
        after = ctx.condition(after, ConditionType.PROGRESSING, *progressing)
        after = ctx.condition(after, ConditionType.DEGRADED, *degraded)
        after = ctx.condition(after, ConditionType.READY, *ready_condition)
        return _autoscaling_conditions(ctx, after, scaling)
    after = ctx.condition(after, ConditionType.PROGRESSING, *progressing)
    if build.failed:
        degraded = (TRUE, Reason.BUILD_FAILED, build.message)
    elif rollout.rolled_out and ready < desired and not scaling_up:
        degraded = (TRUE, Reason.BELOW_DESIRED_REPLICAS, short)
    else:
        degraded = (FALSE, Reason.AS_PLANNED, counts)
    after = ctx.condition(after, ConditionType.DEGRADED, *degraded)
    if rollout.rolled_out and ready >= min(desired, 1):
        ready_condition = (TRUE, Reason.SERVING, f"revision {rollout.revision} serves with {counts}")
    elif rollout.stable_revision is not None and rollout.ready_anywhere:
        # A new revision that builds, rolls out or failed does not take away what serves.
        new = "failed to build" if build.failed else "builds" if not build.finished else "rolls out"
        ready_condition = (TRUE, Reason.SERVING, f"revision {rollout.stable_revision} serves with "
                           f"{rollout.ready_anywhere} replica(s) ready while revision {rollout.revision} {new}")
    elif not build.finished:
        ready_condition = (FALSE, build.reason, build.message)
    else:
        ready_condition = (FALSE, Reason.REPLICAS_NOT_READY, short)
    after = ctx.condition(after, ConditionType.READY, *ready_condition)
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


def _blocked_conditions(ctx: Context, reason: str, message: str) -> list[Condition]:
    """Planned and Ready False for a spec the operator cannot act on; what serves stays."""
    after = ctx.condition(ctx.conditions_before, ConditionType.PLANNED, FALSE, reason, message)
    return ctx.condition(after, ConditionType.READY, FALSE, reason, message)


# --- status and events ----------------------------------------------------------------------------

def _dump_conditions(conditions: list[Condition]) -> list[dict]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def merge_patched(stored: dict, patch: dict) -> dict:
    """`stored` after a JSON merge patch (RFC 7386): None removes, mappings merge, the rest replaces."""
    merged = dict(stored)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patched(merged[key], value)
        else:
            merged[key] = value
    return merged


def _replacing(stored: dict, section: dict) -> dict:
    """A merge patch that turns `stored` into `section`: a merge patch keeps what it does not
    name, so each key `section` dropped is written as None (removed), nested mappings likewise.
    A pass computes each status section it writes whole; merged onto the stored one, a field it
    cleared (a canary's verdict when its step passes, an autoscaler's warmingSince) would stay."""
    patch = {key: None for key in stored if key not in section}
    for key, value in section.items():
        before = stored.get(key)
        patch[key] = _replacing(before, value) if isinstance(value, dict) and isinstance(before, dict) else value
    return patch


def _normalised(status: dict) -> dict:
    try:
        return LLMDeploymentStatus.model_validate(status).model_dump(mode="json", by_alias=True, exclude_none=True)
    except ValidationError:
        return {"unparsable": status}


def _transition_events(before: list[Condition], after: list[Condition]) -> list[Event]:
    """One event per condition that changed status or reason; several conditions moving to
    the same reason in one pass (a build holds EngineBuilt, Progressing and Ready) tell one
    story, told once, in the words of the first."""
    events: dict[tuple[str, str], Event] = {}
    for condition in after:
        previous = find_condition(before, condition.type)
        if previous is not None and previous.status == condition.status and previous.reason == condition.reason:
            continue
        good = (condition.status == TRUE) != (condition.type in BAD_WHEN_TRUE)
        event_type = "Normal" if good else "Warning"
        events.setdefault((event_type, condition.reason), Event(event_type, condition.reason, condition.message))
    return list(events.values())


def _outcome(ctx: Context, status: dict, conditions: list[Condition], *, events: list[Event] = (),
             **changes) -> Outcome:
    """The pass's result: the status with its conditions, diffed with the stored one."""
    status = {**status, "observedGeneration": ctx.generation, "replanRequest": ctx.replan_request,
              "conditions": _dump_conditions(conditions)}
    # What this pass leaves out of the status stays; a section it writes is written whole.
    status = {key: value for key, value in _replacing(ctx.raw_status, status).items() if key in status}
    changed = _normalised(merge_patched(ctx.raw_status, status)) != _normalised(ctx.raw_status)
    return Outcome(status=status, status_changed=changed,
                   events=[*events, *_transition_events(ctx.conditions_before, conditions)], **changes)


def decide_invalid(ctx: Context, reason: str, message: str, plan_status: dict | None = None) -> Outcome:
    """A spec the models reject or render refuses: say so, keep whatever already serves."""
    status = {"plan": plan_status} if plan_status is not None else {}
    return _outcome(ctx, status, _blocked_conditions(ctx, reason, message))


def decide(body: dict, children, settings: OperatorSettings, now: datetime,
           snapshot: MetricsSnapshot | None = None, samples: Samples | None = None,
           golden: GoldenAnswers | None = None, not_ready_reason: str | None = None,
           deployment: LLMDeployment | None = None, build_failure: str | None = None,
           cluster_gpus: Callable[[], ClusterGpus] | None = None, observed: ObservedWorkload | None = None,
           fleet_speeds: Callable[[], list[LearnedSpeed]] | None = None) -> Outcome:
    """`snapshot` is the deployment's metrics when autoscaling is enabled (None: no
    Prometheus configured, which the autoscaler treats like an outage: hold); `samples` the
    canary and stable revisions' requests when an analysis step is due (`analysis_query`);
    `golden` their answers to the golden prompts when the quality gate is due (`quality_query`);
    `not_ready_reason` what the pods say when the canary's replicas are overdue (`overdue_canary`)
    or the current revision is short of ready replicas (`short_of_ready`); `build_failure` what
    its failed build pod said (`failing_build`). `deployment` is the body already parsed, if the
    caller has it. `cluster_gpus` gives the cluster's GPUs, asked only when planning anew (None:
    any type the spec allows). `observed` is the served revision's traffic when an observation
    was due (`observation_due`); `fleet_speeds` the speeds other deployments learned."""
    ctx = Context(body, tuple(children), settings, now, snapshot)
    try:
        deployment = _validate(ctx) if deployment is None else deployment
    except InvalidSpecError as error:
        return decide_invalid(ctx, Reason.INVALID_SPEC, "; ".join(f"{path}: {text}" for path, text in error.problems))
    spec = deployment.spec
    choice = _plan(ctx, spec, cluster_gpus, fleet_speeds)
    if choice.plan is None:
        # Keep whatever already serves; create nothing new for an unmeetable spec.
        closest = (choice.status.get("rejected") or [None])[0]
        message = "no allowed configuration meets the spec" + (
            f"; closest: {closest['option']}: {closest['reason']}" if closest else "")
        return decide_invalid(ctx, Reason.PLAN_INFEASIBLE, message, choice.status)
    plan = choice.plan
    revision = revision_hash(spec, plan)
    learning = _learn(ctx, spec, choice, revision, observed, cluster_gpus, fleet_speeds)
    build = build_state(ctx.children, revision,
                        build_failure if revision == ctx.stored.current_revision else None)
    # While a canary runs the autoscaler sizes the stable revision, which takes most traffic.
    sized = ctx.stored.stable_revision if _canary_runs(ctx, spec, revision) else revision
    scaling = _scale(ctx, spec, plan, build, _ready_replicas(_serving_deployments(ctx.children).get(sized)))
    canary = _canary(ctx, spec, plan, revision, build, scaling.desired_replicas, samples, golden,
                     not_ready_reason)
    serving_replicas = (canary.split.canary_replicas if canary.split is not None
                        else scaling.desired_replicas if build.finished else 0)
    try:
        manifests = render(deployment, plan, revision, settings.render, serving_replicas=serving_replicas,
                           route_weights=_route_weights(ctx, revision, canary))
    except RenderError as error:
        return decide_invalid(ctx, Reason.RENDER_FAILED, str(error), choice.status)
    rollout = _roll_out(ctx, revision, build, scaling.desired_replicas, manifests, canary)
    pods_say = not_ready_reason if revision == ctx.stored.current_revision else None
    conditions = _conditions(ctx, choice.status, build, rollout, scaling, canary, pods_say)
    revisions = [{"name": rev, "planSummary": choice.status.get("summary") if rev == revision else None,
                  "engineRevision": spec.engine.revision if rev == revision else None,
                  "replicas": (d.get("spec") or {}).get("replicas", 0), "readyReplicas": _ready_replicas(d)}
                 for rev, d in sorted(rollout.serving.items(), key=lambda item: item[0] != revision)
                 if rev is not None and (rev == revision or not rollout.rolled_out)]
    status = {
        "plan": choice.status,
        "replicas": scaling.desired_replicas,
        "readyReplicas": rollout.ready,
        "selector": ",".join(f"{k}={v}" for k, v in sorted(selector_labels(ctx.name).items())),
        "currentRevision": revision,
        "stableRevision": rollout.stable_revision,
        "revisions": [{k: v for k, v in r.items() if v is not None} for r in revisions] or None,
        "autoscaler": scaling.autoscaler,
        "canary": _canary_status(canary.state, canary.split),
        "ttftP99Ms": display_round(snapshot.ttft_p99_ms, 1) if snapshot is not None else None,
        "ttftP99": describe_ttft_p99(snapshot.ttft_p99_ms, snapshot) if snapshot is not None else None,
        **learning.status,
    }
    scale_events = ([Event("Normal", scaling.decision.decision.value, scaling.decision.reason)]
                    if scaling.decision is not None and scaling.desired_replicas != scaling.previous_replicas else [])
    return _outcome(ctx, status, conditions, events=[*scale_events, *canary.events, *learning.events],
                    ensure=namespace_prerequisites(deployment, settings.render), apply=manifests,
                    delete=rollout.delete)


def _rollout_view(body: dict, deployment: LLMDeployment | None) -> tuple[LLMDeploymentSpec, CanaryState] | None:
    """The spec and the stored canary of a body whose canary has steps; None otherwise."""
    try:
        spec = (LLMDeployment.from_manifest(body) if deployment is None else deployment).spec
        stored = LLMDeploymentStatus.model_validate(body.get("status") or {})
    except (InvalidSpecError, ValidationError):
        return None
    state = _canary_state(stored.canary)
    if state is None or not spec.rollout or not spec.rollout.steps:
        return None
    return spec, state


def analysis_query(body: dict, now: datetime, deployment: LLMDeployment | None = None
                   ) -> tuple[str, str, int] | None:
    """(stable revision, canary revision, seconds since the step began) when the canary's current
    step is an analysis whose next evaluation is due."""
    view = _rollout_view(body, deployment)
    if view is None:
        return None
    spec, state = view
    steps = spec.rollout.steps
    if state.step_index >= len(steps) or not analysis_due(state, steps[state.step_index], now):
        return None
    elapsed = int((now - state.step_started).total_seconds()) if state.step_started else 0
    return state.stable_revision, state.canary_revision, elapsed


@dataclass(frozen=True)
class QualityQuery:
    stable_revision: str
    canary_revision: str
    canary_replicas: int
    gate: QualityGate


def quality_query(body: dict, deployment: LLMDeployment | None = None) -> QualityQuery | None:
    """What to ask when a warming canary still owes its golden prompts."""
    view = _rollout_view(body, deployment)
    if view is None:
        return None
    spec, state = view
    if state.phase != CanaryPhase.WARMING or spec.rollout.quality is None or state.quality == AnalysisOutcome.SUCCESSFUL:
        return None
    return QualityQuery(state.stable_revision, state.canary_revision, state.canary_replicas, spec.rollout.quality)


def overdue_canary(body: dict, now: datetime, deployment: LLMDeployment | None = None) -> str | None:
    """The canary revision when the replicas its phase or step waits for are past
    canaryReadyDeadlineSeconds (its pods then say why)."""
    view = _rollout_view(body, deployment)
    if view is None:
        return None
    spec, state = view
    steps = spec.rollout.steps
    waits_for_replicas = state.phase == CanaryPhase.WARMING or (
        state.phase == CanaryPhase.PROGRESSING and state.step_index < len(steps)
        and steps[state.step_index].set_weight is not None)
    return state.canary_revision if waits_for_replicas and replicas_overdue(state, spec.rollout.gates, now) else None


def not_ready_reason(pods: list[dict]) -> str | None:
    """Why pods are not ready, from the first that says: the scheduler's message for a Pending
    pod, an eviction, a waiting or crashed container's reason, or a node gone silent."""
    for pod in pods:
        status = pod.get("status") or {}
        name = pod["metadata"]["name"]
        conditions = {c.get("type"): c for c in status.get("conditions") or ()}
        scheduled = conditions.get("PodScheduled") or {}
        if scheduled.get("status") == "False":
            return f"pod {name} is {status.get('phase', 'Pending')}: {scheduled.get('reason', '')}: " \
                   f"{scheduled.get('message', '')}".strip()
        disruption = conditions.get("DisruptionTarget") or {}
        if disruption.get("status") == "True":
            return f"pod {name} is being evicted: {disruption.get('reason', '')}: {disruption.get('message', '')}"
        containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        for entry in containers:
            waiting = (entry.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
                last_said = _last_line(((entry.get("lastState") or {}).get("terminated") or {}).get("message"))
                return (f"pod {name} container {entry['name']}: {waiting['reason']}{_restarts(entry)}: "
                        f"{waiting.get('message', '')}").rstrip(": ") + (f"; it last said: {last_said}"
                                                                         if last_said else "")
        # The node lifecycle controller marks a silent node's pods not ready and leaves what its
        # kubelet last reported: containers that say ready in a pod that is not.
        if (conditions.get("Ready") or {}).get("status") == "False" and (status.get("containerStatuses") or []) \
                and all(entry.get("ready") for entry in status["containerStatuses"]):
            return (f"pod {name} is not ready though its containers last reported ready: its node "
                    f"{(pod.get('spec') or {}).get('nodeName', '?')} stopped reporting")
    return None


def _restarts(container_status: dict) -> str:
    """' (restarted N times, last exit code C)' for a container that has restarted, else ''."""
    count = container_status.get("restartCount") or 0
    if not count:
        return ""
    last = ((container_status.get("lastState") or {}).get("terminated") or {})
    exit_code = f", last exit code {last['exitCode']}" if last.get("exitCode") is not None else ""
    return f" (restarted {count} time{'s' if count != 1 else ''}{exit_code})"


# Canary phases after which nothing happens until the spec or a command changes.
_SETTLED_CANARY_PHASES = {CanaryPhase.PROMOTED.value, CanaryPhase.ROLLED_BACK.value,
                          CanaryPhase.SUPERSEDED.value}


def needs_periodic_pass(body: dict, children) -> bool:
    """Whether time alone can change this deployment's decisions, so that it is passed every
    tick: the autoscaler reads metrics, a canary walks timed steps and deadlines, replicas short
    of ready change their story (restarts, the scale-up grace), a recommendation waits to be
    served. Anything else moves only on a
    change of the object or one of its children, which triggers a pass by itself."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    if (spec.get("autoscaling") or {}).get("enabled"):
        return True
    if status.get("recommendation") and (spec.get("plan") or {}).get("liveReplanning") == LiveReplanning.AUTOMATIC.value:
        return True  # to serve it once the revision settles
    phase = (((body.get("status") or {}).get("canary")) or {}).get("phase")
    if phase is not None and phase not in _SETTLED_CANARY_PHASES:
        return True
    return short_of_ready(body, children) is not None


def short_of_ready(body: dict, children) -> str | None:
    """The stored current revision when its serving Deployment has fewer ready replicas than it
    asks for: its pods are then asked why (and only then, not on every pass)."""
    revision = ((body.get("status") or {}).get("currentRevision"))
    deployment = _serving_deployments(children).get(revision)
    if revision is None or deployment is None:
        return None
    return revision if (deployment.get("spec") or {}).get("replicas", 0) > _ready_replicas(deployment) else None


def _pods_of(kube, namespace: str, name: str, revision: str, component: str = SERVER_COMPONENT) -> list[dict]:
    labels = {**selector_labels(name), REVISION_LABEL: revision, COMPONENT_LABEL: component}
    return kube.list_pods(namespace, ",".join(f"{key}={value}" for key, value in labels.items()))


def _ready_replicas_of(kube, namespace: str, name: str, revision: str) -> list[Replica]:
    pods = _pods_of(kube, namespace, name, revision)
    return [Replica(pod["metadata"]["name"], f"{pod['status']['podIP']}:{GRPC_PORT}") for pod in pods
            if not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("podIP")
            and any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in pod["status"].get("conditions") or ())]


def golden_answers(kube, namespace: str, name: str, query: QualityQuery, request_model: str) -> GoldenAnswers | None:
    """Both revisions' answers to the golden prompts; None while the canary's replicas are not
    all ready (the rollout waits for them anyway)."""
    canary = _ready_replicas_of(kube, namespace, name, query.canary_revision)
    if len(canary) < query.canary_replicas:
        return None
    stable = _ready_replicas_of(kube, namespace, name, query.stable_revision)
    if not stable:
        return GoldenAnswers(error=f"no ready replica of stable revision {query.stable_revision} to give the "
                                   "reference answers")
    prompts = query.gate.prompts
    if prompts is None:
        source = query.gate.prompts_from
        text = kube.config_map_value(namespace, source.name, source.key)
        prompts = parse_prompts(text or "")
        if not prompts:
            return GoldenAnswers(error=f"spec.rollout.quality.promptsFrom: ConfigMap {source.name} key {source.key} "
                                       + ("holds no prompt" if text is not None else "does not exist"))
    return ask_golden_prompts(stable[0], canary, request_model, prompts, query.gate.max_tokens)


def refused_write_status(status: dict, message: str, now: datetime) -> dict:
    """The status a pass decided, with Degraded saying which write the apiserver refused."""
    conditions = [Condition.model_validate(c) for c in status.get("conditions") or []]
    degraded = set_condition(conditions, ConditionType.DEGRADED, ConditionStatus.TRUE, Reason.CHILD_WRITE_REFUSED,
                             f"the apiserver refused {message[:MAX_REFUSAL_CHARS]}; retrying", now,
                             status.get("observedGeneration"))
    return {**status, "conditions": _dump_conditions(degraded)}


def reconcile(body: dict, kube, settings: OperatorSettings, now: datetime, metrics=None,
              children: list[dict] = (), cluster_gpus: Callable[[], ClusterGpus] | None = None,
              fleet_speeds: Callable[[], list[LearnedSpeed]] | None = None, may_observe: bool = True) -> Outcome:
    """Bring the cluster to the state `decide` wants for this LLMDeployment.

    `children` are the objects it owns, `cluster_gpus` gives the cluster's GPUs and
    `fleet_speeds` the speeds every deployment learned (all from the operator's indexes).
    `metrics` (a llmfleet.metrics.PrometheusMetrics, or None) is read only when the
    deployment autoscales, a canary analysis is due, or its traffic is to be observed
    (`observation_due`, and `may_observe`: the caller's pacing)."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    # Parsed once for the whole pass; an invalid body is left to decide, which says why.
    try:
        deployment = LLMDeployment.from_manifest(body)
    except InvalidSpecError:
        deployment = None
    release = serving_release(deployment.spec) if deployment is not None else None
    autoscaled = bool(((body.get("spec") or {}).get("autoscaling") or {}).get("enabled")) and release is not None
    query = analysis_query(body, now, deployment)
    observe = (observation_due(body, now, settings) if may_observe and metrics is not None and release is not None
               else None)
    windows = None
    if metrics is not None and release is not None and (autoscaled or query is not None or observe):
        # Every window of this pass follows from how often Prometheus scrapes these pods.
        windows = metrics_windows(metrics.scrape_cadence(namespace, name, now, settings.scrape_interval_seconds),
                                  settings.observation_window_seconds)
    snapshot = None
    if autoscaled and windows is not None:
        snapshot = metrics.snapshot(namespace, name, windows.rate.seconds, now, release.metrics,
                                    windows.cadence.interval_seconds)
    samples = None
    if query is not None and release is not None:
        stable_revision, canary_revision, step_elapsed_seconds = query
        samples = (metrics.revision_samples(namespace, name, stable_revision, canary_revision,
                                            windows.analysis_seconds(step_elapsed_seconds), now,
                                            REQUEST_MODEL[release.runtime])
                   if windows is not None else Samples(error="no Prometheus URL configured"))
    quality = quality_query(body, deployment)
    # The canary's pods are listed (and asked) only once its Deployment reports them ready.
    golden = (golden_answers(kube, namespace, name, quality, REQUEST_MODEL[release.runtime])
              if quality is not None and release is not None
              and _ready_replicas(_serving_deployments(children).get(quality.canary_revision))
              >= quality.canary_replicas else None)
    asked = overdue_canary(body, now, deployment) or short_of_ready(body, children)
    why_not_ready = not_ready_reason(_pods_of(kube, namespace, name, asked)) if asked else None
    observed = (metrics.observed_workload(namespace, name, observe, windows.observation.seconds, now,
                                          release.metrics) if observe else None)
    failing = failing_build(body, children)
    build_failure = last_build_failure(_pods_of(kube, namespace, name, failing, BUILD_COMPONENT)) \
        if failing else None
    outcome = decide(body, children, settings, now, snapshot, samples, golden, why_not_ready, deployment,
                     build_failure, cluster_gpus, observed, fleet_speeds)
    outcome.observed = observed is not None
    live = {(child["kind"], child["metadata"]["name"]): child for child in children}
    try:
        for manifest in outcome.ensure:
            kube.ensure(manifest)
        for manifest in outcome.apply:
            kube.apply(manifest, live.get((manifest["kind"], manifest["metadata"]["name"])))
    except WriteRefused as refused:
        # Kopf retries the pass; until then only status can tell the user why nothing changes.
        kube.patch_status(namespace, name, refused_write_status(outcome.status, str(refused), now),
                          metadata.get("resourceVersion"))
        kube.emit_event(body, "Warning", Reason.CHILD_WRITE_REFUSED, str(refused))
        raise
    for child in outcome.delete:
        kube.delete(child)
    # Only from the version this pass read: a pass that started from a stale copy (one handler
    # ran just before with news) must not write its decisions over the newer ones, nor tell
    # them again in events.
    if outcome.status_changed and not kube.patch_status(namespace, name, outcome.status,
                                                        metadata.get("resourceVersion")):
        log.debug("%s/%s changed while it was reconciled; the next pass starts from the new version",
                 namespace, name)
        outcome.superseded = True
        return outcome
    for event in outcome.events:
        kube.emit_event(body, event.type, event.reason, event.message)
    return outcome
