"""The serving Deployment (Triton), its Service and its PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

from llmfleet.api import LLMDeployment
from llmfleet.catalog.release_record import ReleaseRecord
from llmfleet.gpu_discovery import GPU_RESOURCE
from llmfleet.planner.types import Plan
from llmfleet.render import layout, pod
from llmfleet.render.identity import COMPONENT_LABEL, DEPLOYMENT_LABEL, REVISION_LABEL, serving_image
from llmfleet.render.settings import RenderSettings

COMPONENT = "server"
CONTAINER = "triton"
MODEL_REPO_VOLUME = "model-repository"
MODEL_CONFIG_VOLUME = "model-config"
MODEL_CONFIG_PATH = "/model-config"
SHM_VOLUME = "dshm"
# NCCL (TP all-reduce) and the python backend exchange tensors through /dev/shm.
SHM_GIB_PER_GPU = 2
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 16
# Where the Triton TensorRT-LLM image keeps the tokenizer models' code (to verify per release).
# tensorrtllm_backend's model repositories: all_models/<layout>/<model>/...
ALL_MODELS = "all_models/"
MPIRUN = "mpirun"
# The image runs as a non-root user; the flag only matters where it does not.
MPIRUN_FLAGS = ("--allow-run-as-root",)
# Loading a large engine takes minutes: the startup probe allows up to 30 minutes. It polls
# often because a loaded engine that waits for its next probe is scale-up time lost, and a
# health GET costs nothing next to serving.
STARTUP_PROBE_PERIOD_SECONDS = 2
STARTUP_PROBE_FAILURES = 900
PROGRESS_DEADLINE_SECONDS = 3600
DRAIN_DELAY_SECONDS = 5
EXIT_MARGIN_SECONDS = 5
# Triton's exit timeout once the preStop drain has ended: unloading the models, and any request
# already inside its last ensemble step. Nothing else can finish after SIGTERM (below).
STOP_SECONDS = 10
DRAIN_POLL_SECONDS = 0.5
DRAIN_IDLE_POLLS = 2

# The preStop hook drains the replica while Triton still serves, because Triton's own drain after
# SIGTERM cannot finish an ensemble request: ServerStop stops every model's scheduler
# (triton-inference-server/core@r24.12:src/model_repository_manager/model_lifecycle.cc
# StopAllModels), so the postprocessing step of each token generated afterwards is refused
# (src/dynamic_batch_scheduler.cc Enqueue, "Server is stopping"), the stream gets nothing more,
# and r24.12's ensemble then never ends the request (src/ensemble_scheduler/ensemble_scheduler.cc
# PrepareSteps skips the steps' final responses once its status is an error; core 5280db8, #466,
# fixed the hang in 2026, still without finishing the stream). A decoupled model's requests are
# not counted in flight at all once its execute() returned (src/dynamic_batch_scheduler.h
# InflightInferenceCount). So: wait DRAIN_DELAY_SECONDS for proxies to drop the endpoint, then
# until the engine reports no active request (the release's request gauge; a request still in
# the ensemble's first step reaches the engine within a poll, and the gauge lags by a stats
# period, hence DRAIN_IDLE_POLLS reads in a row), or the budget ends. Metrics that cannot be read
# end the wait; a runtime that exports no such gauge (the LLM-API one) waits the delay only.
DRAIN_SCRIPT = """\
import re, sys, time, urllib.request
delay, budget, url, poll, polls, gauge, label, value = sys.argv[1:]
end = time.monotonic() + float(budget)
time.sleep(float(delay))
busy = re.compile("^" + re.escape(gauge) + r"\\{[^}]*" + re.escape(label + '="' + value + '"') + r"[^}]*\\} (\\S+)$", re.M)
idle = 0
while idle < int(polls) and time.monotonic() < end:
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        break
    idle = idle + 1 if all(float(found) == 0 for found in busy.findall(text)) else 0
    if idle < int(polls):
        time.sleep(float(poll))
"""

SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(layout.METRICS_PORT),
    "prometheus.io/path": "/metrics",
}
PORTS = (("http", layout.HTTP_PORT), ("grpc", layout.GRPC_PORT), ("metrics", layout.METRICS_PORT))


def exit_timeout_seconds(settings: RenderSettings) -> int:
    """How long Triton waits after SIGTERM, when the preStop drain is over."""
    return max(min(STOP_SECONDS, settings.termination_grace_period_seconds - DRAIN_DELAY_SECONDS - EXIT_MARGIN_SECONDS), 1)


def drain_budget_seconds(settings: RenderSettings) -> int:
    """How long the preStop hook may drain: the grace period less Triton's stop and a margin
    so that it exits before SIGKILL."""
    return max(settings.termination_grace_period_seconds - exit_timeout_seconds(settings) - EXIT_MARGIN_SECONDS,
               DRAIN_DELAY_SECONDS)


def drain_hook(settings: RenderSettings) -> dict[str, Any]:
    """The serving container's preStop: `DRAIN_SCRIPT` with the image's python3."""
    return {"exec": {"command": [
        "python3", "-c", DRAIN_SCRIPT, str(DRAIN_DELAY_SECONDS), str(drain_budget_seconds(settings)),
        f"http://127.0.0.1:{layout.METRICS_PORT}/metrics", str(DRAIN_POLL_SECONDS), str(DRAIN_IDLE_POLLS),
        layout.REQUEST_GAUGE, layout.REQUEST_TYPE_LABEL, layout.ACTIVE_REQUESTS]}}


def _server_flags(settings: RenderSettings) -> list[str]:
    return [
        f"--model-repository={layout.MODEL_REPOSITORY_PATH}",
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--disable-auto-complete-config",
        f"--http-port={layout.HTTP_PORT}",
        f"--grpc-port={layout.GRPC_PORT}",
        f"--metrics-port={layout.METRICS_PORT}",
        "--metrics-config=histogram_latencies=true",
        f"--exit-timeout-secs={exit_timeout_seconds(settings)}",
    ]


def triton_command(plan: Plan, settings: RenderSettings) -> list[str]:
    """The container's main process. One GPU: tritonserver itself. A TP/PP group: one
    tritonserver per rank under mpirun, in the foreground (the upstream launcher script starts
    mpirun and returns, which would end the container); rank 0 loads every model and serves,
    the others load only `tensorrt_llm` and work as its MPI ranks. Each rank's python backend
    gets its own shared-memory prefix, as upstream's launcher gives it."""
    world_size = pod.gpus_per_replica(plan)
    if world_size == 1:
        return ["tritonserver", "--model-control-mode=none", *_server_flags(settings)]
    return [MPIRUN, *MPIRUN_FLAGS, *rank_contexts(world_size, settings)]


def rank_contexts(world_size: int, settings: RenderSettings, other_rank_flags: tuple[str, ...] = ()) -> list[str]:
    """mpirun's app contexts, one rank each: `-n 1 tritonserver ... : -n 1 tritonserver ...`;
    `other_rank_flags` go to every rank but 0 (a group's ranks off the leader serve nothing)."""
    contexts: list[str] = []
    for rank in range(world_size):
        models = (["--model-control-mode=none"] if rank == 0 else
                  ["--model-control-mode=explicit", f"--load-model={layout.TENSORRT_LLM_MODEL}"])
        extra = [flag for flag in other_rank_flags if flag not in models] if rank else []
        contexts += ["-n", "1", "tritonserver", *models, *extra, *_server_flags(settings),
                     f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        if rank < world_size - 1:
            contexts.append(":")
    return contexts


def _probe(path: str, *, period_seconds: int, failure_threshold: int, timeout_seconds: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_seconds,
        "timeoutSeconds": timeout_seconds,
        "failureThreshold": failure_threshold,
    }


def model_code_files(release: ReleaseRecord) -> list[tuple[str, str]]:
    """(path in the operator's image, path in the model repository) of the release's Triton
    model code: tensorrtllm_backend's all_models/<layout>/<model>/... at the release's tag."""
    return [(file.image_path, file.path.split("/", 2)[2]) for file in release.model_code
            if file.path.startswith(ALL_MODELS)]


def _model_repository_assembly(models: list[str], code: list[tuple[str, str]]) -> dict[str, Any]:
    """Init container: the ConfigMap's configs plus the model code from the image, copied into
    the repository the server reads."""
    lines = ["set -eu"]
    lines += [f'cp -RL "{MODEL_CONFIG_PATH}/{model}" "{layout.MODEL_REPOSITORY_PATH}/"' for model in models]
    lines += [f'cp "{image_path}" "{layout.MODEL_REPOSITORY_PATH}/{repository_path}"' for image_path, repository_path in code]
    return {"command": ["/bin/bash", "-c", "\n".join(lines) + "\n"]}


def _volumes_and_mounts(config_map_name: str, volume_items: list[dict[str, str]], gpus: int,
                        settings: RenderSettings) -> tuple[list, list, list]:
    """(volumes, server mounts, init container mounts)."""
    config_map = {"name": MODEL_CONFIG_VOLUME, "configMap": {"name": config_map_name, "items": volume_items}}
    shm = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory",
                                            "sizeLimit": f"{SHM_GIB_PER_GPU * gpus}Gi"}}
    repository = {"name": MODEL_REPO_VOLUME, "emptyDir": {}}
    volumes = [config_map, pod.engine_cache_volume(settings, read_only=True), shm, pod.tmp_volume(), repository]
    server_mounts = [{"name": MODEL_REPO_VOLUME, "mountPath": layout.MODEL_REPOSITORY_PATH, "readOnly": True},
                     pod.engine_cache_mount(read_only=True),
                     {"name": SHM_VOLUME, "mountPath": layout.SHM_PATH}, pod.tmp_mount()]
    init_mounts = [{"name": MODEL_CONFIG_VOLUME, "mountPath": MODEL_CONFIG_PATH, "readOnly": True},
                   {"name": MODEL_REPO_VOLUME, "mountPath": layout.MODEL_REPOSITORY_PATH}]
    return volumes, server_mounts, init_mounts


def serving_pod_template(deployment: LLMDeployment, plan: Plan, labels: dict[str, str], config_map_name: str,
                         volume_items: list[dict[str, str]], settings: RenderSettings, release: ReleaseRecord,
                         *, gpus: int) -> dict[str, Any]:
    """The pod template of a serving pod holding `gpus` GPUs: a replica's on one node, or one
    node's share of a replica spanning nodes (group.py derives its leader and workers from it)."""
    image = serving_image(deployment.spec)
    volumes, server_mounts, init_mounts = _volumes_and_mounts(config_map_name, volume_items, gpus, settings)
    server = {
        "name": CONTAINER,
        "image": image,
        "command": triton_command(plan, settings),
        "env": pod.writable_home_env(),
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in PORTS],
        "resources": {
            "requests": {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_PER_GPU_GIB * gpus}Gi",
                         GPU_RESOURCE: str(gpus)},
            "limits": {GPU_RESOURCE: str(gpus)},
        },
        "startupProbe": _probe("/v2/health/ready", period_seconds=STARTUP_PROBE_PERIOD_SECONDS,
                               failure_threshold=STARTUP_PROBE_FAILURES, timeout_seconds=5),
        # Polled as often as the startup probe (the first readiness probe comes up to a period
        # after startup passes); five failures leave a busy server 10 s before it is dropped.
        "readinessProbe": _probe("/v2/health/ready", period_seconds=STARTUP_PROBE_PERIOD_SECONDS,
                                 failure_threshold=5, timeout_seconds=2),
        "livenessProbe": _probe("/v2/health/live", period_seconds=10, failure_threshold=6, timeout_seconds=5),
        # Draining: a terminating pod leaves the Service's endpoints at once, but proxies
        # learn it a moment later; Triton must not stop taking requests before they do, and
        # must finish its streams before SIGTERM, after which no ensemble request progresses.
        "lifecycle": {"preStop": drain_hook(settings)},
        "volumeMounts": server_mounts,
        **pod.container_defaults(),
    }
    assembly = {
        "name": "model-repository",
        "image": settings.model_code_image,
        **_model_repository_assembly(list(dict.fromkeys(item["path"].split("/")[0] for item in volume_items)),
                                     model_code_files(release)),
        "volumeMounts": init_mounts,
        **pod.container_defaults(),
    }
    pod_spec = {
        "securityContext": pod.pod_security_context(),
        # Long enough for in-flight streams to finish after the endpoint is removed.
        "terminationGracePeriodSeconds": settings.termination_grace_period_seconds,
        **pod.gpu_scheduling(plan, deployment.spec.resources, gpus),
        **pod.image_pull_secrets(settings),
        "initContainers": [assembly],
        "containers": [server],
        "volumes": volumes,
    }
    return {"metadata": {"labels": dict(labels), "annotations": dict(SCRAPE_ANNOTATIONS)}, "spec": pod_spec}


def serving_deployment(deployment: LLMDeployment, plan: Plan, metadata: dict[str, Any],
                       config_map_name: str, volume_items: list[dict[str, str]], serving_replicas: int,
                       settings: RenderSettings, release: ReleaseRecord) -> dict[str, Any]:
    labels = metadata["labels"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": serving_replicas,
            "selector": {"matchLabels": _revision_selector(labels)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS,
            "revisionHistoryLimit": 2,
            "template": serving_pod_template(deployment, plan, labels, config_map_name, volume_items, settings,
                                             release, gpus=pod.gpus_per_replica(plan)),
        },
    }


def _revision_selector(labels: dict[str, str]) -> dict[str, str]:
    # Kept as first released: a Deployment's selector is immutable. Its ReplicaSets never
    # adopt the build Job's pods (those have a controller), unlike a PodDisruptionBudget.
    return {DEPLOYMENT_LABEL: labels[DEPLOYMENT_LABEL], REVISION_LABEL: labels[REVISION_LABEL]}


def serving_pod_selector(labels: dict[str, str]) -> dict[str, str]:
    """One revision's serving pods, not its engine build's."""
    return {**_revision_selector(labels), COMPONENT_LABEL: COMPONENT}


def service(metadata: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    """Spans every revision of the deployment (canaries share it)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
                      for name, port in PORTS],
        },
    }


def pod_disruption_budget(metadata: dict[str, Any]) -> dict[str, Any]:
    labels = metadata["labels"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": serving_pod_selector(labels)}},
    }
