"""Names, labels, owner references and the hashes that key revisions and engines."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from llmfleet.api import API_VERSION, KIND, LLMDeployment, LLMDeploymentSpec
from llmfleet.catalog import load_catalog
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.catalog.release_record import release_for
from llmfleet.planner.types import Plan
from llmfleet.render.settings import RenderError
from llmfleet.render.ttft_buckets import deployment_ttft_bounds_ms

MAX_NAME_LENGTH = 63  # DNS-1123 label: Service, Job (its pods' job-name label) and label values
NAME_DIGEST_LENGTH = 6
REVISION_HASH_LENGTH = 10
ENGINE_CACHE_KEY_LENGTH = 20

NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
DEPLOYMENT_LABEL = "llmfleet.io/deployment"
REVISION_LABEL = "llmfleet.io/revision"
PROJECT = "llmfleet"


@dataclass(frozen=True)
class ChildKind:
    api_version: str
    kind: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]


# Every kind render may create: the operator watches (indexes) and prunes exactly these.
CHILD_KINDS = (
    ChildKind("v1", "ConfigMap", "configmaps"),
    ChildKind("batch/v1", "Job", "jobs"),
    ChildKind("apps/v1", "Deployment", "deployments"),
    ChildKind("v1", "Service", "services"),
    ChildKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    # Only with spec.routing.httpRoute, in clusters with the Gateway API CRDs.
    ChildKind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes"),
    # Only with spec.networkPolicy.
    ChildKind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    # Only with spec.routing.inferencePool, in clusters with the Gateway API Inference Extension CRDs.
    ChildKind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools"),
    # Only for a plan whose replica spans nodes, in clusters with the LeaderWorkerSet controller.
    ChildKind(load_lws_record().api_version, load_lws_record().kind, load_lws_record().plural),
)


def kubectl_kinds() -> str:
    """CHILD_KINDS as `kubectl get` takes them (plural.group)."""
    return ",".join(f"{kind.plural}.{kind.group}" if kind.group else kind.plural for kind in CHILD_KINDS)


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def fit_name(*parts: str) -> str:
    """`parts` joined by '-', within 63 characters. A too-long first part (the deployment
    name) is cut and tagged with a digest of its full value, so cut names stay distinct."""
    name = "-".join(parts)
    if len(name) <= MAX_NAME_LENGTH:
        return name
    base, suffix = parts[0], "".join(f"-{part}" for part in parts[1:])
    room = MAX_NAME_LENGTH - len(suffix) - NAME_DIGEST_LENGTH - 1
    return f"{base[:room].rstrip('-')}-{_digest(base)[:NAME_DIGEST_LENGTH]}{suffix}"


def deployment_identity(deployment: LLMDeployment) -> tuple[str, str, str]:
    """(name, namespace, uid) of the LLMDeployment; all three are needed to own children."""
    metadata = deployment.metadata
    missing = [key for key in ("name", "namespace", "uid") if not metadata.get(key)]
    if missing:
        raise RenderError(f"LLMDeployment metadata lacks {', '.join(missing)}; render needs "
                          "the stored object (name, namespace and uid)")
    return metadata["name"], metadata["namespace"], metadata["uid"]


def service_name(name: str) -> str:
    """The Service every revision of the LLMDeployment `name` serves behind."""
    return fit_name(name)


def selector_labels(name: str) -> dict[str, str]:
    """Labels shared by every revision of one LLMDeployment (the Service selects on these)."""
    return {DEPLOYMENT_LABEL: fit_name(name)}


def deployment_labels(name: str, component: str) -> dict[str, str]:
    """Labels of a child shared by all revisions (the Service)."""
    return {
        NAME_LABEL: PROJECT,
        INSTANCE_LABEL: fit_name(name),
        MANAGED_BY_LABEL: PROJECT,
        COMPONENT_LABEL: component,
        **selector_labels(name),
    }


def revision_labels(name: str, revision: str, component: str) -> dict[str, str]:
    return {**deployment_labels(name, component), REVISION_LABEL: revision}


def metadata(deployment: LLMDeployment, name: str, labels: dict[str, str]) -> dict[str, Any]:
    owner_name, namespace, uid = deployment_identity(deployment)
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [{
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": owner_name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }],
    }


def require_feasible(plan: Plan) -> None:
    if not plan.feasible or None in (plan.gpu_type, plan.tensor_parallel_size, plan.quantization,
                                     plan.kv_cache_dtype):
        raise RenderError("only a feasible plan can be rendered (Planned=False creates no workload)")


def require_whole_nodes(plan: Plan) -> None:
    """A replica spanning nodes runs one pod per node, each with an equal share of its GPUs and
    whole TP groups (planner.layout places stages node after node)."""
    nodes, gpus, tp = plan.nodes_per_replica, plan.layout.gpus, plan.tensor_parallel_size or 1
    if nodes > 1 and (gpus % nodes or (gpus // nodes) % tp):
        raise RenderError(f"the plan's replica spans {nodes} nodes ({plan.layout.label}, {gpus} {plan.gpu_type}), "
                          f"which do not hold equal shares of whole TP{tp} groups; pin spec.plan.tensorParallelSize "
                          "to a size whose pipeline stages fill whole nodes")


def serving_image(spec: LLMDeploymentSpec) -> str:
    """spec.engine.image, or the pinned image of spec.engine.runtime when it is omitted."""
    return spec.engine.image or release_for(spec.engine.runtime.value, None).image


def prefix_reuse_enabled(spec: LLMDeploymentSpec) -> bool:
    return (spec.workload.prefix_sharing_fraction or 0.0) > 0.0


def build_calibrates(spec: LLMDeploymentSpec, plan: Plan) -> bool:
    """Whether the plan's build runs a calibration set through the model (the release record's
    quantize.calibration: the quantised formats and any quantised KV cache; never llmapi)."""
    catalog = load_catalog()
    release = release_for(spec.engine.runtime.value, spec.engine.image)
    return release.calibrates(catalog.quantization(plan.quantization).qformat,
                              catalog.kv_cache_dtype(plan.kv_cache_dtype).kv_cache_dtype_flag)


def _engine_build_inputs(spec: LLMDeploymentSpec, plan: Plan) -> dict[str, Any]:
    require_feasible(plan)
    # The resolved image: omitting spec.engine.image or naming the pinned one is one engine. The
    # calibration set counts only where the build reads it (below), so that its addition to the
    # API left every existing key as it was and a BF16 build ignores it.
    engine = {**spec.engine.model_dump(mode="json", exclude={"calibration_dataset"}), "image": serving_image(spec)}
    calibration = spec.engine.calibration_dataset if build_calibrates(spec, plan) else None
    # Weights and tokenizer identity; the token reference does not change the engine. The
    # object store's endpoint counts only when set, so that its addition to the API left every
    # existing key (and engine) as it was.
    unset_later_fields = {"object_store"} if spec.model.object_store is None else set()
    return {
        "model": spec.model.model_dump(mode="json", exclude={"secret_ref"} | unset_later_fields),
        # Image (TensorRT-LLM version), engine revision and trtllm-build limits.
        "engine": engine,
        # Engines are compiled for one GPU architecture.
        "gpu": load_catalog().gpu(plan.gpu_type).gfd_product,
        "tensorParallelSize": plan.tensor_parallel_size,
        "pipelineParallelSize": plan.pipeline_parallel_size,
        # Only beyond their defaults, so every TP-only plan keeps its key (and engine).
        **({"expertParallelSize": plan.expert_parallel_size} if plan.expert_parallel_size > 1 else {}),
        **({"attentionDataParallel": True} if plan.attention_data_parallel else {}),
        "quantization": plan.quantization,
        "kvCacheDtype": plan.kv_cache_dtype,
        **({"calibrationDataset": calibration} if calibration is not None else {}),
    }


def engine_cache_key(spec: LLMDeploymentSpec, plan: Plan) -> str:
    """Key of the engine cache entry: a hash of everything the engine build reads."""
    return _digest(_engine_build_inputs(spec, plan))[:ENGINE_CACHE_KEY_LENGTH]


def revision_hash(spec: LLMDeploymentSpec, plan: Plan) -> str:
    """Short stable hash of what the pods serve: the engine plus the serving options rendered
    into the model repository, the TTFT histogram's bounds among them (so that all pods of a
    revision export the same buckets). Replicas do not change it, nor autoscaling but for the
    target its bounds are dense around."""
    return _digest({
        "engine": _engine_build_inputs(spec, plan),
        "enableKvCacheReuse": prefix_reuse_enabled(spec),
        "ttftHistogramBoundsMs": list(deployment_ttft_bounds_ms(spec)),
    })[:REVISION_HASH_LENGTH]
