"""`spec.model.architecture`: the inline transformer architecture of a model not in the catalog."""

from pydantic import Field

from llmfleet.api.base import ApiModel, CelRule
from llmfleet.api.enums import LocalAttentionKind


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

    model_class: str | None = Field(
        default=None,
        max_length=128,
        pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="The model's Hugging Face class (config.json `architectures[0]`, e.g. "
        "Qwen3MoeForCausalLM; `llmfleet model import` fills it). The serving release is checked by "
        "it: a class the pinned release does not run is planned but not rendered. Omit to be checked "
        "by the attention kinds alone.",
    )
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
