"""Pure rendering: (LLMDeployment, Plan, revision, settings) -> Kubernetes manifests.

No kopf, Kubernetes client, HTTP, clock or file I/O: the same inputs always give the same
list of plain dicts, in a fixed order. docs/render.md describes what is rendered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llmfleet.api import InferencePoolSpec, LLMDeployment, Runtime
from llmfleet.catalog.release_record import release_for
from llmfleet.planner.spec_adapter import release_requirement_for_spec
from llmfleet.planner.types import Plan
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.catalog.router_record import load_router_record
from llmfleet.render import engine_build, group, inference_pool, layout, llmapi, network_policy, pod, routing, serving
from llmfleet.render.identity import (
    COMPONENT_LABEL,
    REVISION_LABEL,
    deployment_identity,
    deployment_labels,
    engine_cache_key,
    fit_name,
    metadata,
    require_feasible,
    require_whole_nodes,
    revision_hash,
    revision_labels,
    selector_labels,
    service_name,
)
from llmfleet.render.model_repo import config_map_key, model_repository_files, volume_items
from llmfleet.render.pod import engine_cache_claim
from llmfleet.render.settings import RenderError, RenderSettings
from llmfleet.render.ttft_buckets import bounds_annotation, deployment_ttft_bounds_ms

MODEL_REPOSITORY_COMPONENT = "model-repository"
SERVICE_COMPONENT = "service"


def engine_build_job_name(name: str, revision: str, runtime: str = Runtime.ENGINE.value) -> str:
    """The Job filling the cache entry: it builds an engine, or (llmapi) prepares a checkpoint."""
    return fit_name(name, revision, "engine-build" if runtime == Runtime.ENGINE.value else "prepare")


def revision_object_name(name: str, revision: str) -> str:
    """`<name>-<revision>`, cut to fit: the name of a revision's serving Deployment (or
    LeaderWorkerSet) and of its InferencePool."""
    return fit_name(name, revision)


def revision_service_name(name: str, revision: str) -> str:
    """`<name>-<revision>-backend`: a revision's own Service, the HTTPRoute's backend where no
    InferencePool stands between. Not the workload's name: a LeaderWorkerSet makes a headless
    Service of its own name for its groups (kubernetes-sigs/lws@v0.9.0:
    pkg/controllers/leaderworkerset_controller.go, reconcileHeadlessServices), and the two
    would clash."""
    return fit_name(name, revision, "backend")


def render(deployment: LLMDeployment, plan: Plan, revision: str, settings: RenderSettings, *,
           serving_replicas: int, route_weights: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """The LLMDeployment's children for one revision, in apply order: model repository
    ConfigMap, engine build Job, serving Deployment (a LeaderWorkerSet of one group per replica
    when a replica spans nodes), Service, PodDisruptionBudget; with
    spec.routing.httpRoute also the revision's own Service and the HTTPRoute; with
    spec.networkPolicy a NetworkPolicy.

    `serving_replicas` is the reconciler's decision (0 until the build Job has succeeded);
    `route_weights` the HTTPRoute's weight per revision (default: all on `revision`).
    """
    require_feasible(plan)
    spec = deployment.spec
    release = release_for(spec.engine.runtime.value, spec.engine.image)
    # Judged from the spec, not taken from the plan: a plan stored by an operator that did not
    # know the release's limits is refused too.
    needed = release_requirement_for_spec(spec, release)
    if needed is not None:
        raise RenderError(needed.message)
    require_whole_nodes(plan)
    if serving_replicas < 0:
        raise RenderError(f"serving_replicas must be at least 0, got {serving_replicas}")
    name, _, _ = deployment_identity(deployment)
    key = engine_cache_key(spec, plan)

    def child(child_name: str, component: str) -> dict[str, Any]:
        return metadata(deployment, child_name, revision_labels(name, revision, component))

    unbuildable = release.support.layout_problem(plan.pipeline_parallel_size, plan.expert_parallel_size,
                                                 plan.attention_data_parallel, release.release)
    if unbuildable:
        raise RenderError(f"the plan's layout {plan.layout.label}: {unbuildable}")
    files = (llmapi.model_repository_files(spec, plan, key) if release.runtime == Runtime.LLMAPI.value
             else model_repository_files(spec, key))
    config_map_name = fit_name(name, revision, "model-repo")
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child(config_map_name, MODEL_REPOSITORY_COMPONENT),
        "data": {config_map_key(path): content for path, content in files.items()},
    }
    job = engine_build.engine_build_job(
        deployment, plan, key, child(engine_build_job_name(name, revision, release.runtime), engine_build.COMPONENT),
        settings,
        release)
    server = _serving_workload(deployment, plan, child(revision_object_name(name, revision), serving.COMPONENT),
                               config_map_name, volume_items(files), serving_replicas, settings, release)
    # What its pods export, for readers without this revision's spec (its canary's analysis).
    server["metadata"]["annotations"] = bounds_annotation(deployment_ttft_bounds_ms(spec))
    # Every revision's pods that serve: single-node replicas and group leaders (a group's workers
    # have their own component), so a Service spanning both kinds during a canary selects both.
    serving_pods = {**selector_labels(name), COMPONENT_LABEL: serving.COMPONENT}
    service = serving.service(metadata(deployment, service_name(name), deployment_labels(name, SERVICE_COMPONENT)),
                              serving_pods)
    budget = serving.pod_disruption_budget(child(fit_name(name, revision), serving.COMPONENT))
    children = [config_map, job, server, service, budget]
    if spec.routing is not None and spec.routing.http_route is not None:
        weights = route_weights if route_weights is not None else {revision: 100}
        revision_pods = {**serving_pods, REVISION_LABEL: revision}
        pool = spec.routing.inference_pool
        if pool is None:
            children.append(routing.revision_service(
                child(revision_service_name(name, revision), routing.REVISION_SERVICE_COMPONENT), revision_pods))
        else:
            children += _inference_pool_children(name, revision, revision_pods, pool, settings, child)
        children.append(routing.http_route(
            metadata(deployment, service_name(name), deployment_labels(name, routing.ROUTE_COMPONENT)),
            spec.routing.http_route,
            {(revision_object_name if pool is not None else revision_service_name)(name, routed): weight
             for routed, weight in weights.items()},
            load_router_record() if pool is not None else None))
    if spec.network_policy is not None:
        pickers = ({**selector_labels(name), COMPONENT_LABEL: inference_pool.PICKER_COMPONENT}
                   if spec.routing is not None and spec.routing.http_route is not None
                   and spec.routing.inference_pool is not None else None)
        children.append(network_policy.network_policy(
            metadata(deployment, service_name(name), deployment_labels(name, network_policy.COMPONENT)),
            serving_pods, spec.network_policy,
            settings.operator_namespace, selector_labels(name) if plan.nodes_per_replica > 1 else None, pickers))
    return children


def _serving_workload(deployment: LLMDeployment, plan: Plan, metadata: dict[str, Any], config_map_name: str,
                      items: list[dict[str, str]], serving_replicas: int, settings: RenderSettings,
                      release) -> dict[str, Any]:
    """A Deployment of whole replicas, or a LeaderWorkerSet when a replica spans nodes."""
    if plan.nodes_per_replica == 1:
        return serving.serving_deployment(deployment, plan, metadata, config_map_name, items, serving_replicas,
                                          settings, release)
    base = serving.serving_pod_template(deployment, plan, metadata["labels"], config_map_name, items, settings,
                                        release, gpus=pod.gpus_per_pod(plan))
    return group.leader_worker_set(metadata, plan, base, serving_replicas, settings, load_lws_record())


def namespace_prerequisites(deployment: LLMDeployment, plan: Plan, settings: RenderSettings) -> list[dict[str, Any]]:
    """Objects of the deployment's namespace that its children need and that outlive it (shared
    by every deployment there): created when missing, never changed or deleted. The engine
    cache claim; with spec.routing.inferencePool the endpoint pickers' ServiceAccount and its
    RoleBinding to the chart's ClusterRole; for a replica spanning nodes, the group leaders'."""
    _, namespace, _ = deployment_identity(deployment)
    routing = deployment.spec.routing
    pickers = (inference_pool.picker_prerequisites(namespace, settings.endpoint_picker_cluster_role)
               if routing is not None and routing.inference_pool is not None else [])
    launchers = (group.launcher_prerequisites(namespace, settings.rank_launcher_cluster_role)
                 if plan.nodes_per_replica > 1 else [])
    return [engine_cache_claim(namespace, settings), *pickers, *launchers]


def _inference_pool_children(name: str, revision: str, pods: dict[str, str], pool: InferencePoolSpec,
                             settings: RenderSettings, child: Callable[[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The revision's InferencePool (named like its serving Deployment, which the HTTPRoute
    names) and its endpoint picker: ConfigMap, Deployment, Service."""
    record = load_router_record()
    picker_name = fit_name(name, revision, "epp")
    config_map = inference_pool.picker_config_map(child(picker_name, inference_pool.PICKER_COMPONENT))
    return [
        inference_pool.inference_pool(child(revision_object_name(name, revision), inference_pool.POOL_COMPONENT),
                                      pods, picker_name, pool, record),
        config_map,
        inference_pool.picker_deployment(child(picker_name, inference_pool.PICKER_COMPONENT),
                                         revision_object_name(name, revision), picker_name, pool, record, settings),
        inference_pool.picker_service(child(picker_name, inference_pool.PICKER_COMPONENT), record),
    ]


__all__ = [
    "RenderError", "RenderSettings", "engine_build_job_name", "engine_cache_key",
    "layout", "namespace_prerequisites", "render", "revision_hash", "revision_object_name", "revision_service_name",
]
