"""`LLMDeployment.spec`: what the user asks for.

Lengths are in tokens, latencies in milliseconds, rates per second. The planner turns these
into a plan (GPU type, tensor parallelism, quantisation, KV dtype, replicas).
"""

import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from llmfleet.api.base import (
    DNS_SUBDOMAIN_PATTERN,
    MAX_URI_LENGTH,
    SECRET_KEY_PATTERN,
    URI_PATTERN,
    URI_WITH_CREDENTIALS_PATTERN,
    ApiModel,
    CelRule,
    defaulted_model_field,
    no_uri_credentials_rule,
    set_of,
)
from llmfleet.api.enums import (
    Runtime,
    TENSOR_PARALLEL_SIZES,
    CatalogModel,
    LocalAttentionKind,
    EndpointPickerFailureMode,
    GpuType,
    KvCacheDtype,
    LiveReplanning,
    Quantization,
)

TensorParallelSize = Literal[TENSOR_PARALLEL_SIZES]  # type: ignore[valid-type]


HUGGING_FACE_SCHEME = "hf://"
VOLUME_SCHEME = "pvc://"
OBJECT_STORE_SCHEME = "s3://"
# Where weights can come from: a Hugging Face hub repo, a directory on a PersistentVolumeClaim
# of the deployment's namespace, or a prefix in an S3 bucket (AWS or any S3-compatible store;
# bucket names follow S3's rules: 3-63 lower-case letters, digits, dots and hyphens).
WEIGHTS_SOURCE_PATTERN = (r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+"
                          r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+"
                          r"|s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/.*)?)$")
WEIGHTS_SOURCES = ("hf://<org>/<repo> (a Hugging Face hub repo), pvc://<claim>/<path> (a checkpoint "
                   "directory on a PersistentVolumeClaim in the namespace) or s3://<bucket>/<prefix> (a "
                   "checkpoint directory in an S3-compatible object store)")
WEIGHTS_SOURCE_MESSAGE = f"spec.model.source must be {WEIGHTS_SOURCES}"
SOURCE_REQUIRED_MESSAGE = f"spec.model.source is required to serve: {WEIGHTS_SOURCES}"


def hub_repo_id(uri: str | None) -> str | None:
    """The Hugging Face hub repo id of an hf://<org>/<repo> URI; None for any other URI or none."""
    return uri.removeprefix(HUGGING_FACE_SCHEME) if uri and uri.startswith(HUGGING_FACE_SCHEME) else None


def volume_source(uri: str | None) -> tuple[str, str] | None:
    """(claim, path in it) of a pvc://<claim>/<path> URI; None for any other URI or none."""
    if not uri or not uri.startswith(VOLUME_SCHEME):
        return None
    claim, _, path = uri.removeprefix(VOLUME_SCHEME).partition("/")
    return claim, path.strip("/")


HTTP_ENDPOINT_PATTERN = r"^https?://[^/]+(/.*)?$"


def in_object_store(uri: str | None) -> bool:
    """Whether the weights are under an s3://<bucket>/<prefix> URI."""
    return bool(uri) and uri.startswith(OBJECT_STORE_SCHEME)


# Keys people reach for when they paste a hub token into a spec. They are declared in the
# CRD only so that admission rejects them with a pointer to secretRef: pruning alone would
# drop them silently.
INLINE_CREDENTIAL_FIELDS = ("apiKey", "hfToken", "password", "token")
INLINE_CREDENTIAL_MESSAGE = (
    "inline credentials are not allowed in spec.model; store the token in a Secret and "
    "reference it with spec.model.secretRef {name, key}"
)


class SecretKeyReference(ApiModel):
    """A key in a Secret in the LLMDeployment's namespace."""

    name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the Secret, in the same namespace as the LLMDeployment.",
    )
    key: str = Field(
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key within the Secret whose value is the token.",
    )


class ObjectStoreOptions(ApiModel):
    """How to reach the object store of an s3:// source (AWS S3 needs none of this but a region)."""

    endpoint_url: str | None = Field(
        default=None,
        max_length=MAX_URI_LENGTH,
        pattern=URI_PATTERN,
        description="The S3 API endpoint of an S3-compatible store (MinIO, Ceph, a cloud's S3 "
        "gateway), e.g. http://minio.storage.svc:9000. Unset: AWS S3.",
    )
    region: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[a-z0-9][-a-z0-9]*$",
        description="The bucket's region, e.g. eu-west-1. Unset: the download client's default "
        "(the credentials file's profile, then us-east-1).",
    )

    cel_rules = (
        no_uri_credentials_rule("endpointUrl", "endpoint_url", "spec.model.objectStore.endpointUrl"),
        CelRule(
            rule=f"!has(self.endpointUrl) || self.endpointUrl.matches('{URI_WITH_CREDENTIALS_PATTERN}') || "
            f"self.endpointUrl.matches('{HTTP_ENDPOINT_PATTERN}')",
            message="spec.model.objectStore.endpointUrl must be an http:// or https:// URL of the S3 API, "
            "e.g. http://minio.storage.svc:9000",
            holds=lambda m: m.endpoint_url is None or re.match(URI_WITH_CREDENTIALS_PATTERN, m.endpoint_url)
            is not None or re.match(HTTP_ENDPOINT_PATTERN, m.endpoint_url) is not None,
            field_path=".endpointUrl",
        ),
    )


class LatentAttention(ApiModel):
    """Multi-head latent attention (DeepSeek-V2/V3/R1): the KV cache holds, per layer and token,
    one compressed latent plus one rope key shared by all heads, instead of K and V heads."""

    kv_lora_rank: int = Field(ge=1, description="Values in the cached KV latent (config.json kv_lora_rank).")
    qk_rope_head_dim: int = Field(
        ge=1, description="Values in the decoupled rope key, cached beside the latent (qk_rope_head_dim)."
    )
    qk_nope_head_dim: int = Field(
        ge=1, description="Per-head query/key dimension without rope (qk_nope_head_dim)."
    )
    v_head_dim: int = Field(ge=1, description="Per-head value dimension (v_head_dim).")
    q_lora_rank: int | None = Field(
        default=None,
        ge=1,
        description="Rank of the query's compressed projection (q_lora_rank); omit when queries are "
        "projected from the hidden state directly.",
    )


class LocalAttention(ApiModel):
    """Layers that attend to a bounded span of tokens (sliding window or chunked), optionally
    interleaved with full-attention layers."""

    kind: LocalAttentionKind = Field(
        default=LocalAttentionKind.SLIDING_WINDOW,
        description="SlidingWindow: each token attends to the last windowTokens tokens; Chunked: to "
        "the tokens of its own windowTokens-long chunk.",
    )
    window_tokens: int = Field(
        ge=1, description="Tokens a local layer attends to and keeps in its KV cache at most."
    )
    full_attention_layer_interval: int | None = Field(
        default=None,
        ge=2,
        description="Every n-th layer (the n-th, 2n-th, ..., counting from 1) attends to the whole "
        "context; omit when every layer is local. gpt-oss: 2; Llama 4: 4; Gemma 3: 6.",
    )


class ModelArchitecture(ApiModel):
    """Inline transformer architecture, for a model that is not in the catalog."""

    num_layers: int = Field(ge=1, le=1024, description="Number of transformer layers.")
    hidden_size: int = Field(ge=1, description="Hidden (model) dimension.")
    num_attention_heads: int = Field(ge=1, description="Number of query attention heads.")
    num_kv_heads: int = Field(
        ge=1,
        description="Number of key/value heads (fewer than numAttentionHeads with GQA/MQA); "
        "KV-cache bytes per token scale with it.",
    )
    head_dim: int = Field(ge=1, description="Dimension of one attention head.")
    vocab_size: int = Field(ge=1, description="Vocabulary size (rows of the embedding table).")
    intermediate_size: int = Field(ge=1, description="Feed-forward (MLP) inner dimension.")
    parameter_count_billions: float = Field(
        gt=0,
        description="Total parameter count in billions, all experts included "
        "(e.g. 8.03 for Llama 3.1 8B).",
    )
    num_experts: int | None = Field(
        default=None,
        ge=2,
        description="Mixture-of-experts only: experts per MoE layer. Omit for a dense model.",
    )
    experts_per_token: int | None = Field(
        default=None,
        ge=1,
        description="Mixture-of-experts only: experts each token is routed to. Set together "
        "with numExperts.",
    )
    num_shared_experts: int | None = Field(
        default=None,
        ge=1,
        description="Mixture-of-experts only: experts every token passes through besides its routed "
        "ones, each of expertIntermediateSize (DeepSeek-V3: 1; Llama 4: 1).",
    )
    expert_intermediate_size: int | None = Field(
        default=None,
        ge=1,
        description="Mixture-of-experts only: inner dimension of one expert's FFN, where it differs "
        "from intermediateSize (the dense layers'). Omitted: intermediateSize (Mixtral).",
    )
    dense_first_layers: int | None = Field(
        default=None,
        ge=1,
        description="Mixture-of-experts only: leading layers with a dense MLP instead of experts "
        "(DeepSeek-V3: 3).",
    )
    moe_layer_interval: int | None = Field(
        default=None,
        ge=2,
        description="Mixture-of-experts only: experts on every n-th layer (the n-th, 2n-th, ..., "
        "counting from 1), a dense MLP on the others (Llama 4 Maverick: 2). Omitted: every layer.",
    )
    latent_attention: LatentAttention | None = Field(
        default=None,
        description="Multi-head latent attention; omitted: grouped-query attention (numKvHeads K "
        "and V heads). With it, headDim is qkNopeHeadDim + qkRopeHeadDim and numKvHeads equals "
        "numAttentionHeads.",
    )
    local_attention: LocalAttention | None = Field(
        default=None,
        description="Sliding-window or chunked attention on some or all layers; omitted: every "
        "layer attends to the whole context.",
    )

    cel_rules = (
        CelRule(
            rule="self.numAttentionHeads % self.numKvHeads == 0",
            message="spec.model.architecture.numKvHeads must divide numAttentionHeads "
            "(each KV head serves a whole group of query heads)",
            holds=lambda a: a.num_attention_heads % a.num_kv_heads == 0,
            field_path=".numKvHeads",
        ),
        CelRule(
            rule="has(self.numExperts) == has(self.expertsPerToken)",
            message="spec.model.architecture: set both numExperts and expertsPerToken for a "
            "mixture-of-experts model, or neither for a dense model",
            holds=lambda a: (a.num_experts is None) == (a.experts_per_token is None),
        ),
        CelRule(
            rule="!has(self.numExperts) || !has(self.expertsPerToken) || "
            "self.expertsPerToken <= self.numExperts",
            message="spec.model.architecture.expertsPerToken must not exceed numExperts",
            holds=lambda a: a.num_experts is None
            or a.experts_per_token is None
            or a.experts_per_token <= a.num_experts,
            field_path=".expertsPerToken",
        ),
        CelRule(
            rule="has(self.numExperts) || !(has(self.numSharedExperts) || has(self.expertIntermediateSize) "
            "|| has(self.denseFirstLayers) || has(self.moeLayerInterval))",
            message="spec.model.architecture: numSharedExperts, expertIntermediateSize, "
            "denseFirstLayers and moeLayerInterval describe experts; set numExperts and "
            "expertsPerToken too, or drop them",
            holds=lambda a: a.num_experts is not None
            or not (a.num_shared_experts or a.expert_intermediate_size or a.dense_first_layers
                    or a.moe_layer_interval),
        ),
        CelRule(
            rule="!has(self.numExperts) || "
            "(self.numLayers / (has(self.moeLayerInterval) ? self.moeLayerInterval : 1)) "
            "* (has(self.moeLayerInterval) ? self.moeLayerInterval : 1) "
            "> (has(self.denseFirstLayers) ? self.denseFirstLayers : 0)",
            message="spec.model.architecture: denseFirstLayers and moeLayerInterval leave no "
            "layer with experts among numLayers; lower them",
            holds=lambda a: a.num_experts is None
            or (a.num_layers // (a.moe_layer_interval or 1)) * (a.moe_layer_interval or 1)
            > (a.dense_first_layers or 0),
            field_path=".denseFirstLayers",
        ),
        CelRule(
            rule="!has(self.latentAttention) || self.headDim == "
            "self.latentAttention.qkNopeHeadDim + self.latentAttention.qkRopeHeadDim",
            message="spec.model.architecture.headDim must be latentAttention.qkNopeHeadDim + "
            "qkRopeHeadDim with latent attention (the query/key head dimension)",
            holds=lambda a: a.latent_attention is None
            or a.head_dim == a.latent_attention.qk_nope_head_dim + a.latent_attention.qk_rope_head_dim,
            field_path=".headDim",
        ),
        CelRule(
            rule="!has(self.latentAttention) || self.numKvHeads == self.numAttentionHeads",
            message="spec.model.architecture.numKvHeads must equal numAttentionHeads with latent "
            "attention (every head expands its own key and value from the latent)",
            holds=lambda a: a.latent_attention is None or a.num_kv_heads == a.num_attention_heads,
            field_path=".numKvHeads",
        ),
    )


class ModelSpec(ApiModel):
    """Which model to serve (a catalog name or an inline architecture) and where its weights are."""

    name: CatalogModel | None = Field(
        default=None,
        description="Catalog model name. Set exactly one of name or architecture.",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="Inline architecture of a model that is not in the catalog. Set exactly "
        "one of name or architecture.",
    )
    source: str | None = Field(
        default=None,
        max_length=MAX_URI_LENGTH,
        pattern=URI_PATTERN,
        description="Where the weights come from: hf://<org>/<repo> (the Hugging Face hub, e.g. "
        "hf://meta-llama/Llama-3.1-8B-Instruct) or pvc://<claim>/<path> (a Hugging Face "
        "checkpoint directory on a PersistentVolumeClaim in the namespace). Required to serve. "
        "Never embed credentials: use secretRef.",
    )
    tokenizer: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Tokenizer to load (hub id or URI). Defaults to the one shipped with the "
        "weights.",
    )
    secret_ref: SecretKeyReference | None = Field(
        default=None,
        description="Secret key holding the credential used to download the weights and "
        "tokenizer, mounted as a file and never inline: for hf:// the hub token; for s3:// an "
        "AWS shared credentials file ([default] with aws_access_key_id and "
        "aws_secret_access_key). Unset with s3://, the client's own chain applies (workload "
        "identity, instance role).",
    )
    object_store: ObjectStoreOptions | None = Field(
        default=None,
        description="Endpoint and region of an s3:// source; only with an s3:// source.",
    )

    schema_only_properties = {
        key: {
            "type": "string",
            "maxLength": 4096,
            "description": "Not allowed: declared only so that admission can reject an inline "
            "credential. Use secretRef.",
        }
        for key in INLINE_CREDENTIAL_FIELDS
    }
    cel_rules = (
        CelRule(
            rule="has(self.name) != has(self.architecture)",
            message="spec.model: set exactly one of name (a catalog model such as "
            "llama-3.1-8b) or architecture (an inline architecture)",
            holds=lambda m: (m.name is None) != (m.architecture is None),
        ),
        CelRule(
            rule=" && ".join(f"!has(self.{key})" for key in INLINE_CREDENTIAL_FIELDS),
            message=INLINE_CREDENTIAL_MESSAGE,
            holds=None,  # _reject_inline_credentials: the model has no such fields
        ),
        no_uri_credentials_rule("source", "source", "spec.model.source"),
        # A URI with credentials gets only the rule above, which says what to do instead.
        CelRule(
            rule=f"!has(self.source) || self.source.matches('{URI_WITH_CREDENTIALS_PATTERN}') || "
            f"self.source.matches('{WEIGHTS_SOURCE_PATTERN}')",
            message=WEIGHTS_SOURCE_MESSAGE,
            holds=lambda m: m.source is None or re.match(URI_WITH_CREDENTIALS_PATTERN, m.source) is not None
            or re.match(WEIGHTS_SOURCE_PATTERN, m.source) is not None,
            field_path=".source",
        ),
        CelRule(
            rule=f"!has(self.objectStore) || has(self.source) && self.source.startsWith('{OBJECT_STORE_SCHEME}')",
            message=f"spec.model.objectStore applies only to an {OBJECT_STORE_SCHEME}<bucket>/<prefix> source; "
            "remove it or change spec.model.source",
            holds=lambda m: m.object_store is None or in_object_store(m.source),
            field_path=".objectStore",
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _reject_inline_credentials(cls, data: Any) -> Any:
        if isinstance(data, dict):
            inline = sorted(set(data) & set(INLINE_CREDENTIAL_FIELDS))
            if inline:
                raise ValueError(f"{INLINE_CREDENTIAL_MESSAGE} (found: {', '.join(inline)})")
        return data


class EngineSpec(ApiModel):
    """The serving runtime, its Triton + TensorRT-LLM image and the engine limits."""

    runtime: Runtime = Field(
        default=Runtime.LLMAPI,
        description="How TensorRT-LLM serves the model: llmapi (its PyTorch backend behind "
        "Triton's LLM-API model; the checkpoint is fetched, no engine build) or engine "
        "(trtllm-build engines behind the tensorrtllm backend). The image's release decides "
        "which are valid.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Triton Inference Server image with TensorRT-LLM "
        "(<registry>/nvidia/tritonserver:<yy.mm>-trtllm-python-py3); its tag must be a pinned "
        "release that has the runtime. Omit for the runtime's pinned image.",
    )
    revision: str = Field(
        default="1",
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Engine revision. Changing it rebuilds the engine and rolls out a new "
        "revision even when nothing else changed.",
    )
    max_batch_size: int = Field(
        default=256,
        ge=1,
        le=4096,
        description="trtllm-build --max_batch_size: most requests in one in-flight batch.",
    )
    max_input_len: int = Field(
        default=4096,
        ge=1,
        le=1048576,
        description="trtllm-build --max_input_len: longest prompt, in tokens. Must cover "
        "spec.workload.inputTokensP99.",
    )
    max_seq_len: int = Field(
        default=8192,
        ge=2,
        le=1048576,
        description="trtllm-build --max_seq_len: longest prompt plus output, in tokens. Must "
        "cover spec.workload.inputTokensP99 + outputTokensP99.",
    )
    max_num_tokens: int = Field(
        default=8192,
        ge=1,
        le=1048576,
        description="trtllm-build --max_num_tokens: most tokens (prefill chunks plus decode "
        "steps) processed in one engine iteration.",
    )

    cel_rules = (
        CelRule(
            rule="self.maxSeqLen > self.maxInputLen",
            message="spec.engine.maxSeqLen must be greater than maxInputLen (it counts the "
            "prompt plus at least one output token)",
            holds=lambda e: e.max_seq_len > e.max_input_len,
            field_path=".maxSeqLen",
        ),
    )


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
        "workload with spec.workload, and writes a better plan to status.recommendation; "
        "Automatic: it also serves that plan, rolled out as spec.rollout says; Off: neither.",
    )


class AutoscalingSpec(ApiModel):
    """Replica autoscaling on observed p99 TTFT."""

    enabled: bool = Field(
        default=False,
        description="Scale replicas on observed p99 TTFT. When false, replicas are the "
        "planned count for the peak workload (or spec.plan.replicas).",
    )
    min_replicas: int = Field(default=1, ge=1, description="Fewest replicas.")
    max_replicas: int = Field(default=4, ge=1, description="Most replicas.")
    target_ttft_p99_ms: int | None = Field(
        default=None,
        ge=1,
        description="p99 TTFT the autoscaler steers to, in milliseconds; at most "
        "spec.slo.ttftP99Ms. Defaults to 60 % of spec.slo.ttftP99Ms, so that scaling starts "
        "before the SLO breaks.",
    )
    tolerance_percent: float = Field(
        default=10.0,
        ge=0,
        le=100,
        description="Dead band around the target, in percent, within which nothing scales.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Window whose lowest recommendation is used for scaling up, in seconds.",
    )
    scale_down_stabilization_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Window whose highest recommendation is used for scaling down, in seconds.",
    )
    max_scale_up_step: int = Field(
        default=4, ge=1, description="Most replicas added by one scaling decision."
    )
    max_scale_down_step: int = Field(
        default=1, ge=1, description="Most replicas removed by one scaling decision."
    )
    cooldown_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Quiet time after any scaling decision before replicas are removed, in "
        "seconds, so that the metrics show the fleet the last decision left. Scale-ups never "
        "wait for it; they wait only while new replicas load their engine.",
    )

    cel_rules = (
        CelRule(
            rule="self.minReplicas <= self.maxReplicas",
            message="spec.autoscaling.minReplicas must be less than or equal to maxReplicas; "
            "raise maxReplicas or lower minReplicas",
            holds=lambda a: a.min_replicas <= a.max_replicas,
            field_path=".minReplicas",
        ),
    )


class PauseStep(ApiModel):
    """Hold the canary at its current weight."""

    duration_seconds: int = Field(ge=0, le=86400, description="How long to hold, in seconds.")


class AnalysisStep(ApiModel):
    """Hold the canary and compare it with the stable revision against the gates."""

    duration_seconds: int = Field(
        ge=1, le=86400, description="How long to collect metrics, in seconds."
    )
    interval_seconds: int = Field(
        default=30, ge=5, le=3600, description="Time between gate evaluations, in seconds; each "
        "compares the canary with stable over the window since the step began."
    )


class RolloutStep(ApiModel):
    """One canary step: exactly one of setWeight, pause or analysis."""

    set_weight: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Send this percentage of traffic to the new revision.",
    )
    pause: PauseStep | None = Field(default=None, description="Wait before the next step.")
    analysis: AnalysisStep | None = Field(
        default=None, description="Evaluate the gates before the next step."
    )

    cel_rules = (
        CelRule(
            rule="(has(self.setWeight) ? 1 : 0) + (has(self.pause) ? 1 : 0) + "
            "(has(self.analysis) ? 1 : 0) == 1",
            message="spec.rollout.steps[]: each step sets exactly one of setWeight, pause or "
            "analysis",
            holds=lambda s: [s.set_weight, s.pause, s.analysis].count(None) == 2,
        ),
    )


class RolloutGates(ApiModel):
    """Limits a canary must stay within to be promoted."""

    max_ttft_p99_regression_percent: float = Field(
        default=10.0,
        ge=0,
        le=1000,
        description="Largest accepted p99 TTFT increase of the canary over stable, in percent.",
    )
    max_ttft_mean_regression_percent: float = Field(
        default=50.0,
        ge=0,
        le=1000,
        description="Largest accepted mean TTFT increase of the canary over stable, in percent. "
        "The p99 is known only to within a histogram bucket (a canary 3x slower at 10-50 ms can "
        "share neighbouring buckets with stable); the mean, from the histogram's sum, is exact.",
    )
    max_error_rate_percent: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="Largest accepted share of failed canary requests, in percent.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description="Fewest requests each revision must serve in an analysis window before it "
        "can pass or fail; fewer is Inconclusive and the rollout holds.",
    )
    canary_ready_deadline_seconds: int = Field(
        default=900,
        ge=10,
        le=86400,
        description="How long the canary's replicas of a step may take to become ready "
        "(scheduling, image pull, engine load) before the canary is rolled back with the reason "
        "its pods give (e.g. the scheduler's).",
    )
    analysis_deadline_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="How long past its duration an analysis step may stay Inconclusive (no "
        "data, Prometheus down) before the rollout pauses for a person.",
    )


class ConfigMapKeyReference(ApiModel):
    """A key in a ConfigMap in the LLMDeployment's namespace."""

    name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the ConfigMap, in the same namespace as the LLMDeployment.",
    )
    key: str = Field(
        max_length=253,
        pattern=SECRET_KEY_PATTERN,
        description="Key within the ConfigMap whose value holds the prompts, one per line.",
    )


class QualityGate(ApiModel):
    """Golden prompts a new revision must answer as the stable one does, with greedy decoding:
    a faster engine that answers differently is rolled back."""

    prompts: list[Annotated[str, Field(min_length=1, max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=64, description="The golden prompts."
    )
    prompts_from: ConfigMapKeyReference | None = Field(
        default=None, description="A ConfigMap key holding the golden prompts, one per non-empty line."
    )
    max_tokens: int = Field(
        default=32, ge=1, le=1024, description="Tokens generated per prompt (greedy decoding)."
    )
    min_exact_match_percent: float = Field(
        default=90.0,
        ge=0,
        le=100,
        description="Fewest answers, in percent of prompts times canary replicas, that must equal "
        "stable's answer exactly.",
    )
    min_token_agreement_percent: float = Field(
        default=95.0,
        ge=0,
        le=100,
        description="Fewest answer tokens (whitespace-separated words, position by position), in "
        "percent, that must equal stable's.",
    )

    cel_rules = (
        CelRule(
            rule="has(self.prompts) != has(self.promptsFrom)",
            message="spec.rollout.quality: set exactly one of prompts or promptsFrom",
            holds=lambda s: (s.prompts is None) != (s.prompts_from is None),
        ),
    )


class RolloutSpec(ApiModel):
    """How a new revision (engine or plan change) replaces the current one."""

    steps: list[RolloutStep] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="Canary steps, in order. Omit to replace the revision once the new one "
        "is ready.",
    )
    gates: RolloutGates = defaulted_model_field(
        RolloutGates, "Promotion limits checked by analysis steps and throughout the canary."
    )
    quality: QualityGate | None = Field(
        default=None,
        description="Golden prompts checked on every canary replica once they are ready, before the "
        "first step; a failure rolls the canary back. Omit to skip the check.",
    )


class GatewayParentReference(ApiModel):
    """A Gateway (or a listener of one) the route attaches to, as Gateway API's parentRefs."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the Gateway.")
    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Namespace of the Gateway; omit for the LLMDeployment's namespace.",
    )
    section_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The Gateway listener to attach to; omit for all that allow the route.",
    )


class HttpRouteSpec(ApiModel):
    """Traffic through a Gateway API HTTPRoute: one backend Service per revision, weighted."""

    parent_refs: list[GatewayParentReference] = Field(
        min_length=1, max_length=32, description="The Gateways the HTTPRoute attaches to."
    )


class InferencePoolSpec(ApiModel):
    """Inference-aware routing: per revision a Gateway API Inference Extension InferencePool and
    its endpoint picker, which sends each request to the pod with the shortest queue, the most
    free KV cache and the longest cached prefix."""

    failure_mode: EndpointPickerFailureMode = Field(
        default=EndpointPickerFailureMode.FAIL_OPEN,
        description="When the endpoint picker does not answer: FailOpen routes the request to any pod "
        "of the pool (the default: serving outlives the picker), FailClose refuses it.",
    )
    image: str | None = Field(
        default=None, min_length=1, max_length=512,
        description="Endpoint picker image; omit for the pinned release's (docs/render.md). Another tag "
        "must take the same flags and configuration.",
    )


class RoutingSpec(ApiModel):
    """How requests reach the revisions besides the deployment's Service."""

    http_route: HttpRouteSpec | None = Field(
        default=None,
        description="Render an HTTPRoute (gateway.networking.k8s.io/v1) whose weighted backends are "
        "per-revision Services: all weight on the serving revision, split by the canary's share "
        "during a canary rollout. Needs the Gateway API CRDs in the cluster.",
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description="Route through inference-aware endpoint pickers: the HTTPRoute's backends become "
        "one InferencePool (inference.networking.k8s.io/v1) per revision instead of Services, each "
        "with its endpoint picker Deployment. Needs httpRoute, the InferencePool CRD and a Gateway "
        "implementation that supports it.",
    )

    cel_rules = (
        CelRule(
            rule="!has(self.inferencePool) || has(self.httpRoute)",
            message="spec.routing.inferencePool needs spec.routing.httpRoute: requests reach the pools "
            "through the HTTPRoute; add httpRoute.parentRefs naming your Gateway",
            holds=lambda r: r.inference_pool is None or r.http_route is not None,
            field_path=".inferencePool",
        ),
    )


# Kubernetes label syntax: an optional DNS-subdomain prefix and '/', then a name of up to 63
# characters; values up to 63 characters, possibly empty.
# ('[.]', not an escaped dot: the pattern is also a CEL string literal, where '\.' is no escape.)
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_LABEL_KEY_LENGTH = 253 + 1 + 63
MAX_LABEL_VALUE_LENGTH = 63


def _valid_label(key: str, value: str) -> bool:
    return (len(key) <= MAX_LABEL_KEY_LENGTH and re.match(LABEL_KEY_PATTERN, key) is not None
            and len(value) <= MAX_LABEL_VALUE_LENGTH and re.match(LABEL_VALUE_PATTERN, value) is not None)


class LabelSelector(ApiModel):
    """Objects whose labels include all of these; empty selects every one."""

    match_labels: dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE_LENGTH)]] = Field(
        default_factory=dict, max_length=16, description="Labels the objects must carry, key: value."
    )

    cel_rules = (
        CelRule(
            rule=f"!has(self.matchLabels) || self.matchLabels.all(k, size(k) <= {MAX_LABEL_KEY_LENGTH} && "
            f"k.matches('{LABEL_KEY_PATTERN}') && size(self.matchLabels[k]) <= {MAX_LABEL_VALUE_LENGTH} && "
            f"self.matchLabels[k].matches('{LABEL_VALUE_PATTERN}'))",
            message="spec.networkPolicy: matchLabels keys and values must be Kubernetes labels, e.g. "
            "kubernetes.io/metadata.name: gateways (values of up to 63 letters, digits, '-', '_', '.')",
            holds=lambda m: all(_valid_label(key, value) for key, value in m.match_labels.items()),
            field_path=".matchLabels",
        ),
    )


class NetworkPeer(ApiModel):
    """Pods let in, as a NetworkPolicy peer: namespaceSelector alone, every pod of the matching
    namespaces; podSelector alone, the matching pods of the LLMDeployment's namespace; both, the
    matching pods of the matching namespaces."""

    namespace_selector: LabelSelector | None = Field(default=None, description="Namespaces, by label.")
    pod_selector: LabelSelector | None = Field(default=None, description="Pods, by label.")

    cel_rules = (
        CelRule(
            rule="has(self.namespaceSelector) || has(self.podSelector)",
            message="spec.networkPolicy: each peer needs namespaceSelector, podSelector or both, e.g. "
            "namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}",
            holds=lambda m: m.namespace_selector is not None or m.pod_selector is not None,
        ),
    )


class NetworkPolicySpec(ApiModel):
    """Who may reach the serving pods; everyone else is refused by the cluster's network plugin
    (it must enforce NetworkPolicy)."""

    clients: list[NetworkPeer] | None = Field(
        default=None,
        max_length=16,
        description="Who may send inference requests (Triton's HTTP and gRPC ports): the Gateway's "
        "or the clients' pods. Omit for every pod of the LLMDeployment's namespace. The "
        "operator's own namespace is always let in (it sends the canary's golden prompts).",
    )
    metrics_scrapers: list[NetworkPeer] = Field(
        min_length=1,
        max_length=16,
        description="Who may read Triton's metrics port: the Prometheus the operator reads, e.g. "
        "namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}. Autoscaling "
        "and canary analysis need it.",
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
    )
