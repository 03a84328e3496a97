"""The I/O of a pass, all before the pure part runs: Prometheus, the pods, the golden prompts."""

from __future__ import annotations

from llmfleet.inference import ask_golden_prompts
from llmfleet.inference.golden import Replica
from llmfleet.metrics import metrics_windows
from llmfleet.metrics.cadence import MetricsWindows
from llmfleet.planner.spec_adapter import serving_release
from llmfleet.reconcile import due
from llmfleet.reconcile.context import BUILD_COMPONENT, SERVER_COMPONENT, Context
from llmfleet.reconcile.observations import Fleet, Observations
from llmfleet.reconcile.pods import a_group_pod_unschedulable, last_build_failure, not_ready_reason
from llmfleet.reconcile.probes import AskNow, Asks
from llmfleet.render.group import WORKER_COMPONENT
from llmfleet.render.identity import COMPONENT_LABEL, REVISION_LABEL, selector_labels
from llmfleet.render.layout import GRPC_PORT, REQUEST_MODEL
from llmfleet.render.ttft_buckets import shared_ttft_bounds_ms
from llmfleet.rollout import Samples
from llmfleet.rollout.quality import GoldenAnswers, parse_prompts


# A group's workers too: a stuck worker is why its leader, the group's serving pod, is not ready.
SERVING_POD_COMPONENTS = (SERVER_COMPONENT, WORKER_COMPONENT)


def observe(ctx: Context, kube, metrics, fleet: Fleet, may_observe: bool = True, probes: Asks = AskNow()
            ) -> Observations:
    """Read what the pass will use, and nothing else. `metrics` (a PrometheusMetrics, or None) is
    read only when the deployment autoscales, a canary analysis is due, or its traffic is to be
    observed (`due.observation_due`, and `may_observe`: the caller's pacing). The canary's
    analysis and golden prompts are asked of `probes`: their answers may come in a later pass."""
    deployment = ctx.deployment
    release = serving_release(deployment.spec) if deployment is not None else None
    if release is None:  # an invalid spec: decide says why, nothing to read
        return Observations(fleet=fleet)
    namespace, name, uid = ctx.namespace, ctx.name, ctx.metadata.get("uid", ctx.name)
    request_model = REQUEST_MODEL[release.runtime]

    def windows() -> MetricsWindows:
        # Every window follows from how often Prometheus scrapes these pods.
        cadence = metrics.scrape_cadence(namespace, name, ctx.now, ctx.settings.scrape_interval_seconds)
        return metrics_windows(cadence, ctx.settings.observation_window_seconds)

    observe_revision = (due.observation_due(ctx.body, ctx.now, ctx.settings)
                        if may_observe and metrics is not None else None)
    autoscaled = deployment.spec.autoscaling.enabled and metrics is not None
    read_now = windows() if autoscaled or observe_revision else None
    analysis = due.analysis_query(ctx)
    samples = None
    if analysis is not None and metrics is None:
        samples = Samples(error="no Prometheus URL configured")
    elif analysis is not None:
        samples = probes.answer(uid, "analysis", analysis.evaluation, lambda: metrics.revision_samples(
            namespace, name, analysis.stable_revision, analysis.canary_revision,
            windows().analysis_seconds(analysis.step_elapsed_seconds), ctx.now, request_model))
    quality = due.quality_query(ctx)
    # The canary's pods are listed (and asked) only once its Deployment reports them ready.
    golden = (probes.answer(uid, "golden", quality, lambda: golden_answers(kube, ctx, quality, request_model))
              if quality is not None and ctx.children.ready(quality.canary_revision) >= quality.canary_replicas
              else None)
    asked = due.overdue_canary(ctx) or due.short_of_ready(ctx.body, ctx.children)
    pods = _pods_of(kube, ctx, asked, SERVING_POD_COMPONENTS) if asked else []
    failing = due.failing_build(ctx)
    return Observations(
        snapshot=(metrics.snapshot(namespace, name, read_now.rate.seconds, ctx.now, release.metrics,
                                   read_now.cadence.interval_seconds,
                                   deployment.spec.autoscaling.scale_down_stabilization_seconds,
                                   ttft_bounds_ms=shared_ttft_bounds_ms(ctx.children.serving.values(),
                                                                        deployment.spec))
                  if autoscaled else None),
        samples=samples, golden=golden,
        not_ready_reason=not_ready_reason(pods), group_unschedulable=a_group_pod_unschedulable(pods),
        build_failure=last_build_failure(_pods_of(kube, ctx, failing, (BUILD_COMPONENT,))) if failing else None,
        workload=(metrics.observed_workload(namespace, name, observe_revision, read_now.observation.seconds, ctx.now,
                                            release.metrics) if observe_revision else None),
        fleet=fleet)


def _pods_of(kube, ctx: Context, revision: str, components: tuple[str, ...] = (SERVER_COMPONENT,)) -> list[dict]:
    labels = {**selector_labels(ctx.name), REVISION_LABEL: revision}
    return kube.list_pods(ctx.namespace, ",".join([*(f"{key}={value}" for key, value in labels.items()),
                                                   f"{COMPONENT_LABEL} in ({','.join(components)})"]))


def _ready_replicas_of(kube, ctx: Context, revision: str) -> list[Replica]:
    return [Replica(pod["metadata"]["name"], f"{pod['status']['podIP']}:{GRPC_PORT}")
            for pod in _pods_of(kube, ctx, revision)
            if not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("podIP")
            and any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in pod["status"].get("conditions") or ())]


def golden_answers(kube, ctx: Context, query: due.QualityQuery, request_model: str) -> GoldenAnswers | None:
    """Both revisions' answers to the golden prompts; None while the canary's replicas are not
    all ready (the rollout waits for them anyway)."""
    canary = _ready_replicas_of(kube, ctx, query.canary_revision)
    if len(canary) < query.canary_replicas:
        return None
    stable = _ready_replicas_of(kube, ctx, query.stable_revision)
    if not stable:
        return GoldenAnswers(error=f"no ready replica of stable revision {query.stable_revision} to give the "
                                   "reference answers")
    prompts = query.gate.prompts
    if prompts is None:
        source = query.gate.prompts_from
        text = kube.config_map_value(ctx.namespace, source.name, source.key)
        prompts = parse_prompts(text or "")
        if not prompts:
            return GoldenAnswers(error=f"spec.rollout.quality.promptsFrom: ConfigMap {source.name} key {source.key} "
                                       + ("holds no prompt" if text is not None else "does not exist"))
    return ask_golden_prompts(stable[0], canary, request_model, prompts, query.gate.max_tokens)
