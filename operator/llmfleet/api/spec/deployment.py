"""`LLMDeploymentSpec`: the whole spec, its sections and the rules that span them."""

import re
from operator import attrgetter

from pydantic import Field

from llmfleet.api.base import ApiModel, CelRule, defaulted_model_field
from llmfleet.api.spec.autoscaling import AutoscalingSpec
from llmfleet.api.spec.engine import CALIBRATION_DATASET_FIELD, EngineSpec
from llmfleet.api.spec.model import OBJECT_STORE_SCHEME, ModelSpec, in_object_store
from llmfleet.api.spec.network_policy import NetworkPolicySpec
from llmfleet.api.spec.planning import PlanOverrides, ResourcesSpec, SloSpec, WorkloadSpec
from llmfleet.api.spec.rollout import RolloutSpec
from llmfleet.api.spec.routing import RoutingSpec


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _pin_allowed(pin: str, section: str, allowed: str, fix: str = "allow it") -> CelRule:
    """spec.plan.<pin>, when pinned, must be one of spec.<section>.<allowed>, when given."""
    section_of = attrgetter(".".join(_snake(part) for part in section.split(".")))
    return CelRule(
        rule=f"!has(self.plan) || !has(self.plan.{pin}) || !has(self.{section}) || "
        f"!has(self.{section}.{allowed}) || self.plan.{pin} in self.{section}.{allowed}",
        message=f"spec.plan.{pin} must be one of spec.{section}.{allowed}; change the override or {fix}",
        holds=lambda s: s.plan is None
        or getattr(s.plan, _snake(pin)) is None
        or section_of(s) is None
        or getattr(section_of(s), _snake(allowed)) is None
        or getattr(s.plan, _snake(pin)) in getattr(section_of(s), _snake(allowed)),
        field_path=f".plan.{pin}",
    )


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
        _pin_allowed("tensorParallelSize", "resources", "allowedTensorParallelSizes"),
        _pin_allowed("quantization", "resources", "allowedQuantizations"),
        _pin_allowed("quantization", "slo.quality", "allowedQuantizations", fix="the quality budget"),
        _pin_allowed("gpuType", "resources", "allowedGpuTypes"),
        _pin_allowed("kvCacheDtype", "resources", "allowedKvCacheDtypes"),
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
