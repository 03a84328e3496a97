"""One level-based pipeline for every LLMDeployment event and timer tick:
observe -> plan -> render -> server-side apply -> prune -> one status patch -> events.

`decide` is pure: from the stored object, its children and the time it returns
what to apply, what to delete, the status and the events. `reconcile` does the
I/O around it through the k8s gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from llmfleet.api import (
    ConditionStatus,
    ConditionType,
    InvalidSpecError,
    LLMDeployment,
    find_condition,
    set_condition,
)
from llmfleet.api.conditions import Condition
from llmfleet.api.status import AutoscalerStatus, ReplicaRecommendation
from llmfleet.autoscale import AutoscalerState, MetricsSnapshot, Recommendation, display_round
from llmfleet.autoscale import decide as autoscale
from llmfleet.planner import plan as make_plan
from llmfleet.planner.spec_adapter import plan_request_from_spec, plan_status_from_plan, serving_release
from llmfleet.render import RenderSettings, engine_build, render, revision_hash, serving
from llmfleet.render.identity import COMPONENT_LABEL, REVISION_LABEL, selector_labels
from llmfleet.render.pod import engine_cache_claim

SERVER_COMPONENT = serving.COMPONENT
BUILD_COMPONENT = engine_build.COMPONENT
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
# Conditions whose True status is bad news, for the event type on transitions.
BAD_WHEN_TRUE = {ConditionType.DEGRADED.value}


@dataclass(frozen=True)
class OperatorSettings:
    render: RenderSettings = field(default_factory=RenderSettings)
    timer_interval_seconds: float = 5.0
    # The window of the p99 TTFT query: a few scrapes, short enough to react within ~20 s.
    metrics_window_seconds: int = 30


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
    events: list[Event] = field(default_factory=list)


@dataclass(frozen=True)
class BuildState:
    finished: bool
    failed: bool
    reason: str
    message: str


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _labels(obj: dict) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def build_state(children: list[dict], revision: str) -> BuildState:
    job = next((c for c in children if c["kind"] == "Job"
                and _labels(c).get(REVISION_LABEL) == revision), None)
    if job is None:
        return BuildState(False, False, "BuildPending", "the Job filling the engine cache is being created")
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition["type"] in ("Complete", "SuccessCriteriaMet"):
            return BuildState(True, False, "EngineReady", f"engine cache entry ready (Job {job['metadata']['name']})")
        if condition["type"] in ("Failed", "FailureTarget"):
            reason = condition.get("reason") or "BackoffLimitExceeded"
            return BuildState(False, True, "BuildFailed",
                              f"Job {job['metadata']['name']} failed ({reason}): "
                              f"{condition.get('message') or 'see the Job pod logs'}")
    return BuildState(False, False, "Building", f"Job {job['metadata']['name']} is filling the engine cache")


def _serving_deployments(children: list[dict]) -> dict[str, dict]:
    return {_labels(c).get(REVISION_LABEL): c for c in children
            if c["kind"] == "Deployment" and _labels(c).get(COMPONENT_LABEL) == SERVER_COMPONENT}


def _ready_replicas(deployment: dict | None) -> int:
    return ((deployment or {}).get("status") or {}).get("readyReplicas") or 0


def _conditions(body: dict) -> list[Condition]:
    raw = (body.get("status") or {}).get("conditions") or []
    return [Condition.model_validate(c) for c in raw]


def _transition_events(before: list[Condition], after: list[Condition]) -> list[Event]:
    events = []
    for condition in after:
        previous = find_condition(before, condition.type)
        if previous is not None and previous.status == condition.status and previous.reason == condition.reason:
            continue
        good = (condition.status == TRUE) != (condition.type in BAD_WHEN_TRUE)
        events.append(Event("Normal" if good else "Warning", condition.reason, condition.message))
    return events


def _dump_conditions(conditions: list[Condition]) -> list[dict]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def _autoscaler_state(body: dict) -> AutoscalerState:
    raw = (body.get("status") or {}).get("autoscaler")
    if not raw:
        return AutoscalerState()
    stored = AutoscalerStatus.model_validate(raw)
    return AutoscalerState(
        last_scale_time=stored.last_scale_time, warming_since=stored.warming_since,
        recommendations=tuple(Recommendation(r.time, r.replicas) for r in stored.recommendations or ()))


def _autoscaler_status(decision, now: datetime) -> dict:
    state = decision.state
    status = AutoscalerStatus(
        desired_replicas=decision.desired_replicas, last_decision=decision.decision,
        last_decision_time=now, reason=decision.reason[:1024], inputs=decision.inputs,
        last_scale_time=state.last_scale_time, warming_since=state.warming_since,
        recommendations=[ReplicaRecommendation(time=r.time, replicas=r.replicas)
                         for r in state.recommendations] or None)
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def decide_invalid(body: dict, error: InvalidSpecError, now: datetime) -> Outcome:
    """A stored object the models reject (e.g. written before a CRD upgrade)."""
    generation = body["metadata"].get("generation")
    message = "; ".join(f"{path}: {text}" for path, text in error.problems)
    before = _conditions(body)
    after = set_condition(before, ConditionType.PLANNED, FALSE, "InvalidSpec", message, now, generation)
    after = set_condition(after, ConditionType.READY, FALSE, "InvalidSpec", message, now, generation)
    return Outcome(status={"observedGeneration": generation, "conditions": _dump_conditions(after)},
                   events=_transition_events(before, after))


def decide(body: dict, children: list[dict], settings: OperatorSettings, now: datetime,
           snapshot: MetricsSnapshot | None = None) -> Outcome:
    """`snapshot` is the deployment's metrics when autoscaling is enabled (None: no
    Prometheus configured, which the autoscaler treats like an outage: hold)."""
    deployment = LLMDeployment.from_manifest(body)
    metadata = body["metadata"]
    name, generation = metadata["name"], metadata.get("generation")
    spec = deployment.spec
    plan = make_plan(plan_request_from_spec(spec))
    plan_status = plan_status_from_plan(plan).model_dump(mode="json", by_alias=True, exclude_none=True)
    before = _conditions(body)

    def condition(conditions, kind, status, reason, message):
        return set_condition(conditions, kind, status, reason, message, now, generation)

    if not plan.feasible:
        # Keep whatever already serves; create nothing new for an unmeetable spec.
        closest = (plan_status.get("rejected") or [None])[0]
        message = "no allowed configuration meets the spec" + (
            f"; closest: {closest['option']}: {closest['reason']}" if closest else "")
        after = condition(before, ConditionType.PLANNED, FALSE, "PlanInfeasible", message)
        after = condition(after, ConditionType.READY, FALSE, "PlanInfeasible", message)
        return Outcome(status={"observedGeneration": generation, "plan": plan_status,
                               "conditions": _dump_conditions(after)},
                       events=_transition_events(before, after))

    revision = revision_hash(spec, plan)
    build = build_state(children, revision)
    serving = _serving_deployments(children)
    ready = _ready_replicas(serving.get(revision))
    desired_replicas = plan.replicas
    autoscaler_status = None
    events: list[Event] = []
    if spec.autoscaling.enabled:
        scaling = spec.autoscaling
        stored_replicas = (body.get("status") or {}).get("replicas")
        current = stored_replicas if stored_replicas is not None else plan.replicas
        current = min(max(current, scaling.min_replicas), scaling.max_replicas)
        decision = autoscale(scaling, spec.slo.ttft_p99_ms,
                             snapshot or MetricsSnapshot(error="no Prometheus URL configured"),
                             _autoscaler_state(body), current, ready if build.finished else current, now)
        desired_replicas = decision.desired_replicas
        autoscaler_status = _autoscaler_status(decision, now)
        if desired_replicas != current:
            events.append(Event("Normal", decision.decision.value, decision.reason))
    serving_replicas = desired_replicas if build.finished else 0
    manifests = render(deployment, plan, revision, settings.render, serving_replicas=serving_replicas)
    rolled_out = build.finished and ready >= desired_replicas

    # Older revisions keep serving until the new one is fully ready; then they go.
    wanted = {_key(m) for m in manifests}
    delete = []
    for child in children:
        if _key(child) in wanted:
            continue
        child_revision = _labels(child).get(REVISION_LABEL)
        keep_serving = (child_revision is not None and child_revision != revision and not rolled_out
                        and child_revision in serving and _labels(child).get(COMPONENT_LABEL) != BUILD_COMPONENT)
        if not keep_serving:
            delete.append(child)
    ready_anywhere = sum(_ready_replicas(d) for rev, d in serving.items()
                         if rev == revision or not rolled_out)

    after = condition(before, ConditionType.PLANNED, TRUE, "PlanFound",
                      f"{plan_status.get('summary', '')} x{desired_replicas}: "
                      + (plan_status.get("rationale") or [""])[0])
    if build.failed:
        after = condition(after, ConditionType.ENGINE_BUILT, FALSE, build.reason, build.message)
    else:
        after = condition(after, ConditionType.ENGINE_BUILT, TRUE if build.finished else FALSE,
                          build.reason, build.message)
    after = condition(after, ConditionType.WORKLOAD_AVAILABLE, TRUE if ready_anywhere else FALSE,
                      "ReplicasReady" if ready_anywhere else "NoReadyReplicas",
                      f"{ready_anywhere} replica(s) ready to serve")
    progressing = not rolled_out and not build.failed
    after = condition(after, ConditionType.PROGRESSING, TRUE if progressing else FALSE,
                      ("Building" if not build.finished else "RollingOut") if progressing
                      else ("BuildFailed" if build.failed else "RolledOut"),
                      f"revision {revision}: " + (build.message if not build.finished else
                                                  f"{ready}/{desired_replicas} replicas ready"))
    degraded = build.failed or (build.finished and 0 < ready < desired_replicas and rolled_out)
    after = condition(after, ConditionType.DEGRADED, TRUE if degraded else FALSE,
                      build.reason if build.failed else ("BelowDesiredReplicas" if degraded else "AsPlanned"),
                      build.message if build.failed else f"{ready}/{desired_replicas} replicas ready")
    after = condition(after, ConditionType.READY, TRUE if rolled_out else FALSE,
                      "Serving" if rolled_out else (build.reason if not build.finished else "ReplicasNotReady"),
                      f"revision {revision} serves with {ready}/{desired_replicas} replicas ready"
                      if rolled_out else (build.message if not build.finished
                                          else f"{ready}/{desired_replicas} replicas ready"))
    if autoscaler_status is not None:
        after = condition(after, ConditionType.AUTOSCALING_ACTIVE, TRUE, decision.decision.value,
                          decision.reason)
        after = condition(after, ConditionType.METRICS_AVAILABLE,
                          TRUE if decision.metrics_available else FALSE,
                          decision.metrics_reason, decision.metrics_message)

    selector = ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))
    revisions = [{"name": rev, "planSummary": plan_status.get("summary") if rev == revision else None,
                  "engineRevision": spec.engine.revision if rev == revision else None,
                  "replicas": (d.get("spec") or {}).get("replicas", 0), "readyReplicas": _ready_replicas(d)}
                 for rev, d in sorted(serving.items(), key=lambda item: item[0] != revision)
                 if rev is not None and (rev == revision or not rolled_out)]
    status = {
        "observedGeneration": generation,
        "plan": plan_status,
        "replicas": desired_replicas,
        "readyReplicas": ready,
        "selector": selector,
        "currentRevision": revision,
        "revisions": [{k: v for k, v in r.items() if v is not None} for r in revisions] or None,
        "conditions": _dump_conditions(after),
        "autoscaler": autoscaler_status,
        "ttftP99Ms": display_round(snapshot.ttft_p99_ms, 1) if snapshot is not None else None,
    }
    return Outcome(ensure=[engine_cache_claim(metadata["namespace"], settings.render)],
                   apply=manifests, delete=delete, status=status,
                   events=events + _transition_events(before, after))


def reconcile(body: dict, kube, settings: OperatorSettings, now: datetime, metrics=None) -> Outcome:
    """Bring the cluster to the state `decide` wants for this LLMDeployment.

    `metrics` (a llmfleet.metrics.PrometheusMetrics, or None) is read only when the
    deployment autoscales."""
    metadata = body["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    autoscaling = ((body.get("spec") or {}).get("autoscaling") or {}).get("enabled")
    try:
        snapshot = None
        if autoscaling and metrics is not None:
            release = serving_release(LLMDeployment.from_manifest(body).spec)
            snapshot = metrics.snapshot(namespace, name, settings.metrics_window_seconds, now, release.metrics)
        outcome = decide(body, kube.list_children(namespace, name), settings, now, snapshot)
    except InvalidSpecError as error:
        outcome = decide_invalid(body, error, now)
    for manifest in outcome.ensure:
        kube.ensure(manifest)
    for manifest in outcome.apply:
        kube.apply(manifest)
    for child in outcome.delete:
        kube.delete(child)
    kube.patch_status(namespace, name, outcome.status)
    for event in outcome.events:
        kube.emit_event(body, event.type, event.reason, event.message)
    return outcome
