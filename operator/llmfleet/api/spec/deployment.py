"""`LLMDeploymentSpec`: the whole spec, its sections and the rules that span them."""

from pydantic import Field

from llmfleet.api.base import ApiModel, CelRule, defaulted_model_field
from llmfleet.api.spec.autoscaling import AutoscalingSpec
from llmfleet.api.spec.engine import CALIBRATION_DATASET_FIELD, EngineSpec
from llmfleet.api.spec.model import OBJECT_STORE_SCHEME, ModelSpec, in_object_store
from llmfleet.api.spec.network_policy import NetworkPolicySpec
from llmfleet.api.spec.planning import PlanOverrides, ResourcesSpec, SloSpec, WorkloadSpec
from llmfleet.api.spec.rollout import RolloutSpec
from llmfleet.api.spec.routing import RoutingSpec


class LLMDeploymentSpec(ApiModel):
    """Desired state of an LLMDeployment."""

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = defaulted_model_field(EngineSpec, "Serving image and engine build limits.")
    slo: SloSpec = Field(description="Latency and quality objectives.")
    workload: WorkloadSpec = Field(description="Expected traffic at peak.")
    resources: ResourcesSpec | None = Field(
        default=None, description="Limits on the planner's choices; omit for no limits."
    )
    plan: PlanOverrides | None = Field(
        default=None, description="Pinned plan choices; omit to let the planner choose all."
    )
    autoscaling: AutoscalingSpec = defaulted_model_field(
        AutoscalingSpec, "Replica autoscaling on p99 TTFT."
    )
    rollout: RolloutSpec | None = Field(
        default=None, description="Canary rollout of new revisions; omit to replace directly."
    )
    routing: RoutingSpec | None = Field(
        default=None, description="Gateway API routing; omit to serve through the Service alone."
    )
    network_policy: NetworkPolicySpec | None = Field(
        default=None,
        description="Render a NetworkPolicy that lets only these peers reach the serving pods; "
        "omit for none (the namespace's own policies apply).",
    )

    cel_rules = (
        CelRule(
            rule="!has(self.plan) || !has(self.plan.tensorParallelSize) || "
            "!has(self.resources) || !has(self.resources.allowedTensorParallelSizes) || "
            "self.plan.tensorParallelSize in self.resources.allowedTensorParallelSizes",
            message="spec.plan.tensorParallelSize must be one of "
            "spec.resources.allowedTensorParallelSizes; change the override or allow it",
            holds=lambda s: s.plan is None
            or s.plan.tensor_parallel_size is None
            or s.resources is None
            or s.resources.allowed_tensor_parallel_sizes is None
            or s.plan.tensor_parallel_size in s.resources.allowed_tensor_parallel_sizes,
            field_path=".plan.tensorParallelSize",
        ),
        CelRule(
            rule="!has(self.plan) || !has(self.plan.quantization) || !has(self.resources) || "
            "!has(self.resources.allowedQuantizations) || "
            "self.plan.quantization in self.resources.allowedQuantizations",
            message="spec.plan.quantization must be one of spec.resources.allowedQuantizations; "
            "change the override or allow it",
            holds=lambda s: s.plan is None
            or s.plan.quantization is None
            or s.resources is None
            or s.resources.allowed_quantizations is None
            or s.plan.quantization in s.resources.allowed_quantizations,
            field_path=".plan.quantization",
        ),
        CelRule(
            rule="!has(self.plan) || !has(self.plan.quantization) || !has(self.slo.quality) || "
            "!has(self.slo.quality.allowedQuantizations) || "
            "self.plan.quantization in self.slo.quality.allowedQuantizations",
            message="spec.plan.quantization must be one of "
            "spec.slo.quality.allowedQuantizations; change the override or the quality budget",
            holds=lambda s: s.plan is None
            or s.plan.quantization is None
            or s.slo.quality is None
            or s.slo.quality.allowed_quantizations is None
            or s.plan.quantization in s.slo.quality.allowed_quantizations,
            field_path=".plan.quantization",
        ),
        CelRule(
            rule="!has(self.plan) || !has(self.plan.gpuType) || !has(self.resources) || "
            "!has(self.resources.allowedGpuTypes) || "
            "self.plan.gpuType in self.resources.allowedGpuTypes",
            message="spec.plan.gpuType must be one of spec.resources.allowedGpuTypes; change "
            "the override or allow it",
            holds=lambda s: s.plan is None
            or s.plan.gpu_type is None
            or s.resources is None
            or s.resources.allowed_gpu_types is None
            or s.plan.gpu_type in s.resources.allowed_gpu_types,
            field_path=".plan.gpuType",
        ),
        CelRule(
            rule="!has(self.plan) || !has(self.plan.kvCacheDtype) || !has(self.resources) || "
            "!has(self.resources.allowedKvCacheDtypes) || "
            "self.plan.kvCacheDtype in self.resources.allowedKvCacheDtypes",
            message="spec.plan.kvCacheDtype must be one of "
            "spec.resources.allowedKvCacheDtypes; change the override or allow it",
            holds=lambda s: s.plan is None
            or s.plan.kv_cache_dtype is None
            or s.resources is None
            or s.resources.allowed_kv_cache_dtypes is None
            or s.plan.kv_cache_dtype in s.resources.allowed_kv_cache_dtypes,
            field_path=".plan.kvCacheDtype",
        ),
        CelRule(
            rule="!has(self.plan) || !has(self.plan.tensorParallelSize) || "
            "!has(self.resources) || !has(self.resources.gpuBudget) || "
            "self.plan.tensorParallelSize * (has(self.plan.replicas) ? self.plan.replicas : 1)"
            " <= self.resources.gpuBudget",
            message="spec.plan.tensorParallelSize x spec.plan.replicas (GPUs needed) exceeds "
            "spec.resources.gpuBudget; raise the budget or lower the overrides",
            holds=lambda s: s.plan is None
            or s.plan.tensor_parallel_size is None
            or s.resources is None
            or s.resources.gpu_budget is None
            or s.plan.tensor_parallel_size * (1 if s.plan.replicas is None else s.plan.replicas)
            <= s.resources.gpu_budget,
            field_path=".plan.tensorParallelSize",
        ),
        CelRule(
            rule="!has(self.plan) || !has(self.plan.replicas) || !self.autoscaling.enabled",
            message="spec.plan.replicas pins the replica count and cannot be combined with "
            "spec.autoscaling.enabled=true; remove one of them",
            holds=lambda s: s.plan is None or s.plan.replicas is None or not s.autoscaling.enabled,
            field_path=".plan.replicas",
        ),
        CelRule(
            rule="!has(self.autoscaling.targetTtftP99Ms) || "
            "self.autoscaling.targetTtftP99Ms <= self.slo.ttftP99Ms",
            message="spec.autoscaling.targetTtftP99Ms must not exceed spec.slo.ttftP99Ms "
            "(steering above the SLO would break it); lower the target or omit it",
            holds=lambda s: s.autoscaling.target_ttft_p99_ms is None
            or s.autoscaling.target_ttft_p99_ms <= s.slo.ttft_p99_ms,
            field_path=".autoscaling.targetTtftP99Ms",
        ),
        CelRule(
            rule="self.engine.maxInputLen >= self.workload.inputTokensP99",
            message="spec.engine.maxInputLen must be at least spec.workload.inputTokensP99 "
            "(the engine would refuse longer prompts); raise maxInputLen",
            holds=lambda s: s.engine.max_input_len >= s.workload.input_tokens_p99,
            field_path=".engine.maxInputLen",
        ),
        CelRule(
            rule="self.engine.maxSeqLen >= "
            "self.workload.inputTokensP99 + self.workload.outputTokensP99",
            message="spec.engine.maxSeqLen must be at least spec.workload.inputTokensP99 + "
            "outputTokensP99 (the engine would cut longer requests); raise maxSeqLen",
            holds=lambda s: s.engine.max_seq_len
            >= s.workload.input_tokens_p99 + s.workload.output_tokens_p99,
            field_path=".engine.maxSeqLen",
        ),
        CelRule(
            rule=f"!has(self.engine.calibrationDataset) || "
            f"!self.engine.calibrationDataset.startsWith('{OBJECT_STORE_SCHEME}') || "
            f"has(self.model.source) && self.model.source.startsWith('{OBJECT_STORE_SCHEME}')",
            message=f"{CALIBRATION_DATASET_FIELD}: an {OBJECT_STORE_SCHEME} calibration set is synced with the "
            "weights' object store settings and credentials (spec.model.objectStore, secretRef), so "
            f"spec.model.source must be {OBJECT_STORE_SCHEME} too; put the set in that store, on a claim "
            "(pvc://) or in a hub dataset repo (hf://datasets/)",
            holds=lambda s: not in_object_store(s.engine.calibration_dataset) or in_object_store(s.model.source),
            field_path=".engine.calibrationDataset",
        ),
    )
