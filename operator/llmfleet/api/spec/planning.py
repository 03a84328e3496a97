"""`spec.slo`, `spec.workload`, `spec.resources`, `spec.plan`: the planner's objectives, traffic, limits, pins."""

from typing import Literal

from pydantic import Field

from llmfleet.api.base import DNS_SUBDOMAIN_PATTERN, ApiModel, CelRule, set_of
from llmfleet.api.enums import TENSOR_PARALLEL_SIZES, GpuType, KvCacheDtype, LiveReplanning, Quantization


TensorParallelSize = Literal[TENSOR_PARALLEL_SIZES]  # type: ignore[valid-type]


class QualityBudget(ApiModel):
    """How much output quality the user will trade for speed."""

    allowed_quantizations: set_of(Quantization, len(Quantization)) | None = Field(
        default=None,
        description="Quantisations whose quality is acceptable for this model. Omit to allow "
        "any within maxQualityLossPercent (with neither set: BF16, FP16 and FP8 only).",
    )
    max_quality_loss_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Largest accepted quality loss versus BF16, in percent, as published for "
        "each quantisation in the catalog. Omit for no limit.",
    )


class SloSpec(ApiModel):
    """Service-level objectives the plan must meet at the peak workload."""

    ttft_p99_ms: int = Field(
        ge=1,
        description="99th-percentile time to first token (queueing plus prefill), in "
        "milliseconds. Must be positive.",
    )
    tpot_p99_ms: int = Field(
        ge=1,
        description="99th-percentile time per output token after the first (decode step), "
        "in milliseconds. Must be positive.",
    )
    goodput_floor_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Lowest acceptable share of requests that meet both latency objectives, "
        "in percent.",
    )
    quality: QualityBudget | None = Field(
        default=None, description="Quality budget; omit (or leave both fields unset) to allow "
        "only the near-lossless formats (BF16, FP16, FP8) unless spec.plan.quantization pins another."
    )


class WorkloadSpec(ApiModel):
    """The traffic the plan is sized for."""

    input_tokens_mean: int = Field(ge=1, description="Mean prompt length, in tokens.")
    input_tokens_p99: int = Field(
        ge=1, description="99th-percentile prompt length, in tokens (at least the mean)."
    )
    output_tokens_mean: int = Field(ge=1, description="Mean generated length, in tokens.")
    output_tokens_p99: int = Field(
        ge=1, description="99th-percentile generated length, in tokens (at least the mean)."
    )
    peak_requests_per_second: float = Field(
        gt=0,
        description="Peak arrival rate the plan must serve within the SLO, in requests "
        "per second.",
    )
    prefix_sharing_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fraction (0..1) of prompt tokens expected to hit the KV-cache prefix "
        "reuse (shared system prompts). Omit for none.",
    )

    cel_rules = (
        CelRule(
            rule="self.inputTokensP99 >= self.inputTokensMean",
            message="spec.workload.inputTokensP99 must be at least inputTokensMean",
            holds=lambda w: w.input_tokens_p99 >= w.input_tokens_mean,
            field_path=".inputTokensP99",
        ),
        CelRule(
            rule="self.outputTokensP99 >= self.outputTokensMean",
            message="spec.workload.outputTokensP99 must be at least outputTokensMean",
            holds=lambda w: w.output_tokens_p99 >= w.output_tokens_mean,
            field_path=".outputTokensP99",
        ),
    )


class ResourcesSpec(ApiModel):
    """Limits on what the planner may choose. An omitted list allows every value."""

    allowed_gpu_types: set_of(GpuType, len(GpuType)) | None = Field(
        default=None,
        description="GPU types the planner may choose from.",
    )
    gpu_budget: int | None = Field(
        default=None,
        ge=1,
        description="Most GPUs all replicas together may use (tensorParallelSize x "
        "pipelineParallelSize x replicas). Omit for no limit.",
    )
    allowed_tensor_parallel_sizes: set_of(TensorParallelSize, len(TENSOR_PARALLEL_SIZES)) | None = (
        Field(
            default=None,
            description="Tensor-parallel sizes the planner may choose from (each of 1, 2, 4, 8).",
        )
    )
    allowed_quantizations: set_of(Quantization, len(Quantization)) | None = Field(
        default=None,
        description="Quantisations the planner may build engines with.",
    )
    allowed_kv_cache_dtypes: set_of(KvCacheDtype, len(KvCacheDtype)) | None = Field(
        default=None,
        description="KV-cache element types the planner may choose from.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PriorityClass of the serving and build pods: who gets scarce GPUs. The "
        "scheduler preempts lower-priority pods for them, so the planner counts GPUs that "
        "lower-priority pods hold as free. Omit for the cluster's default priority.",
    )


class PlanOverrides(ApiModel):
    """Pins for individual plan choices (the planner chooses whatever is not pinned), and what
    live metrics may change."""

    gpu_type: GpuType | None = Field(default=None, description="Pin the GPU type.")
    tensor_parallel_size: TensorParallelSize | None = Field(
        default=None, description="Pin the tensor-parallel size (1, 2, 4 or 8)."
    )
    quantization: Quantization | None = Field(default=None, description="Pin the quantisation.")
    kv_cache_dtype: KvCacheDtype | None = Field(
        default=None, description="Pin the KV-cache element type."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="Pin the replica count (0 stops serving but keeps the resource). This is "
        "the scale subresource's spec replicas: `kubectl scale` writes it. Not allowed while "
        "spec.autoscaling.enabled is true.",
    )
    live_replanning: LiveReplanning = Field(
        default=LiveReplanning.RECOMMEND,
        description="What live metrics may do to the plan. Recommend: the operator learns how fast "
        "the served configuration really runs (status.learnedSpeeds), compares the observed "
        "workload with spec.workload, and writes a better plan to status.recommendation, and "
        "its plans use the speeds every deployment of the model learned; Automatic: it also "
        "serves that plan, rolled out as spec.rollout says; Off: none of these, and its plans use "
        "the catalog's latency model with no learned speed.",
    )
