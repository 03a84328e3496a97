"""A model's architecture (catalog entries, inline specs and imported Hugging Face configs alike)
and what follows from it: parameter counts, the bytes of KV cache a token takes, the features a
release must support."""

from __future__ import annotations

import functools
from dataclasses import dataclass

# How a local-attention layer bounds what it attends to (HF config: layer_types).
LOCAL_ATTENTION_KINDS = ("sliding", "chunked")
# Each kind as the release records name the feature (support.architectures.features).
LOCAL_ATTENTION_FEATURES = {"sliding": "sliding_window_attention", "chunked": "chunked_attention"}


@dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer with gated MLP (Llama family), optionally MoE.

    Attention is grouped-query (K and V heads) unless ``kv_lora_rank`` is set: then it is
    multi-head latent attention (DeepSeek-V2/V3), which caches one latent of kv_lora_rank values
    plus a rope key of qk_rope_head_dim values per layer and token. With
    ``local_attention_window_tokens`` set, layers attend to at most that many tokens, except every
    ``full_attention_layer_interval``-th layer (counting from 1), which attends to the whole
    context. With experts, layer i (from 0) is an MoE layer when i >= dense_first_layers and
    (i + 1) is a multiple of moe_layer_interval; the others are dense MLPs of intermediate_size.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    num_experts: int = 1
    experts_per_token: int = 1
    tie_word_embeddings: bool = False
    source: str = "inline"
    # The Hugging Face class its checkpoint's config.json names (`architectures`), which the
    # serving runtime dispatches on; "" for an inline architecture, known by its features alone.
    architecture_class: str = ""
    # Mixture of experts beyond Mixtral: shared experts every token passes through, each of the
    # expert FFN size; the expert FFN size where it differs from the dense one (0: the same);
    # dense layers before the first MoE layer, and MoE only on every n-th layer.
    num_shared_experts: int = 0
    expert_intermediate_size: int = 0
    dense_first_layers: int = 0
    moe_layer_interval: int = 1
    # Multi-head latent attention (0: grouped-query attention). head_dim is then the query/key
    # head dimension, qk_nope_head_dim + qk_rope_head_dim.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0  # 0: queries projected from the hidden state directly
    # Local attention (0: every layer attends to the whole context).
    local_attention_window_tokens: int = 0
    local_attention_kind: str = "sliding"
    full_attention_layer_interval: int = 0  # 0: no layer keeps full attention

    def __post_init__(self) -> None:
        positive = {
            "num_layers": self.num_layers, "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads, "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position_embeddings,
            "num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
            "moe_layer_interval": self.moe_layer_interval,
        }
        for field, value in positive.items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name}: {field} must be a positive integer, got {value!r}")
        optional = {
            "num_shared_experts": self.num_shared_experts, "expert_intermediate_size": self.expert_intermediate_size,
            "dense_first_layers": self.dense_first_layers, "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim, "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim, "q_lora_rank": self.q_lora_rank,
            "local_attention_window_tokens": self.local_attention_window_tokens,
            "full_attention_layer_interval": self.full_attention_layer_interval,
        }
        for field, value in optional.items():
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"model {self.name}: {field} must be 0 (unset) or a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name}: attention heads must be a multiple of KV heads")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"model {self.name}: experts_per_token exceeds num_experts")
        if self.num_experts == 1 and (self.num_shared_experts or self.expert_intermediate_size
                                      or self.dense_first_layers or self.moe_layer_interval != 1):
            raise ValueError(f"model {self.name}: num_shared_experts, expert_intermediate_size, dense_first_layers "
                             "and moe_layer_interval describe experts; set num_experts too, or drop them")
        if self.num_experts > 1 and self.num_moe_layers == 0:
            raise ValueError(f"model {self.name}: dense_first_layers and moe_layer_interval leave no MoE layer "
                             f"among {self.num_layers}; lower them")
        mla = (self.kv_lora_rank, self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim)
        if any(mla) and not all(mla):
            raise ValueError(f"model {self.name}: latent attention needs kv_lora_rank, qk_rope_head_dim, "
                             "qk_nope_head_dim and v_head_dim together")
        if self.q_lora_rank and not self.kv_lora_rank:
            raise ValueError(f"model {self.name}: q_lora_rank is a latent-attention number; set kv_lora_rank too")
        if self.kv_lora_rank:
            if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
                raise ValueError(f"model {self.name}: with latent attention head_dim is qk_nope_head_dim + "
                                 f"qk_rope_head_dim = {self.qk_nope_head_dim + self.qk_rope_head_dim}, "
                                 f"got {self.head_dim}")
            if self.num_kv_heads != self.num_attention_heads:
                raise ValueError(f"model {self.name}: with latent attention every head has its own key and "
                                 "value (num_kv_heads = num_attention_heads)")
        if self.local_attention_kind not in LOCAL_ATTENTION_KINDS:
            raise ValueError(f"model {self.name}: local_attention_kind must be one of {LOCAL_ATTENTION_KINDS}, "
                             f"got {self.local_attention_kind!r}")
        if self.full_attention_layer_interval == 1 or (self.full_attention_layer_interval
                                                       and not self.local_attention_window_tokens):
            raise ValueError(f"model {self.name}: full_attention_layer_interval (>= 2) places full layers among "
                             "local ones; set local_attention_window_tokens, or drop it")

    # --- layer kinds -------------------------------------------------------------------------
    # (The counts the planner's inner loops read are cached: a frozen instance never changes.)

    @property
    def architecture_features(self) -> tuple[str, ...]:
        """The attention kinds a serving release must implement beyond grouped-query attention over
        the whole context, as release records name them (support.architectures.features)."""
        features = []
        if self.is_latent_attention:
            features.append("latent_attention")
        if self.local_attention_window_tokens:
            features.append(LOCAL_ATTENTION_FEATURES[self.local_attention_kind])
        return tuple(features)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_latent_attention(self) -> bool:
        return self.kv_lora_rank > 0

    @functools.cached_property
    def num_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        # Layers i in [dense_first_layers, num_layers) with (i + 1) a multiple of the interval.
        return self.num_layers // self.moe_layer_interval - self.dense_first_layers // self.moe_layer_interval

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def num_full_attention_layers(self) -> int:
        if not self.local_attention_window_tokens:
            return self.num_layers
        if not self.full_attention_layer_interval:
            return 0
        return self.num_layers // self.full_attention_layer_interval

    @property
    def num_local_attention_layers(self) -> int:
        return self.num_layers - self.num_full_attention_layers

    def attended_tokens(self, context_tokens: float) -> float:
        """Context tokens summed over the layers (each local layer sees at most its window): what
        the KV cache holds for one sequence, in token-layers."""
        window = self.local_attention_window_tokens
        local = min(context_tokens, window) if window else 0.0
        return self.num_full_attention_layers * context_tokens + self.num_local_attention_layers * local

    def attended_pairs(self, prefix_tokens: float, new_tokens: float) -> float:
        """(query, key) pairs of causal attention for new_tokens after prefix_tokens, summed over the
        layers; tokens taken as continuous, so a full layer has ((a + n)^2 - a^2) / 2 pairs and a
        local layer counts at most its window per query."""
        start, end = prefix_tokens, prefix_tokens + new_tokens
        full = (end * end - start * start) / 2
        window = self.local_attention_window_tokens
        if not window:
            return self.num_layers * full
        # Integral of min(p, window) dp from start to end.
        below = max(0.0, min(end, window) - start)
        lower = min(start, window)
        local = (lower + below / 2) * below + window * (end - max(start, window) if end > window else 0.0)
        return self.num_full_attention_layers * full + self.num_local_attention_layers * local

    # --- parameters ---------------------------------------------------------------------------

    @property
    def expert_ffn_size(self) -> int:
        return self.expert_intermediate_size or self.intermediate_size

    @property
    def q_projection_params(self) -> int:
        """Latent attention: the down projection to q_lora_rank (replicated across TP) apart from
        the rest (split by heads); see attention_params_per_layer."""
        return self.hidden_size * self.q_lora_rank if self.q_lora_rank else 0

    @property
    def latent_down_projection_params(self) -> int:
        """Latent attention's projections into the latents (q_a and kv_a): every TP rank holds them
        whole, because each needs the latent for its own heads."""
        return self.q_projection_params + self.hidden_size * (self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def latent_head_projection_params(self) -> int:
        """Latent attention's per-head projections (q_b or q, kv_b, o), which TP splits by heads."""
        heads = self.num_attention_heads
        q_input = self.q_lora_rank or self.hidden_size
        q_up = q_input * heads * self.head_dim
        kv_up = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        out = heads * self.v_head_dim * self.hidden_size
        return q_up + kv_up + out

    @property
    def attention_params_per_layer(self) -> int:
        if self.is_latent_attention:
            return self.latent_down_projection_params + self.latent_head_projection_params
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def dense_mlp_params(self) -> int:
        # gate, up and down projections
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def mlp_params_per_expert(self) -> int:
        # gate, up and down projections of one expert (routed or shared)
        return 3 * self.hidden_size * self.expert_ffn_size

    @property
    def router_params_per_layer(self) -> int:
        """Router of one MoE layer."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @functools.cached_property
    def layer_params(self) -> int:
        """Linear-layer weights of all transformer layers (what quantisation shrinks)."""
        moe_layer = ((self.num_experts + self.num_shared_experts) * self.mlp_params_per_expert
                     + self.router_params_per_layer)
        return (self.num_layers * self.attention_params_per_layer + self.num_dense_layers * self.dense_mlp_params
                + self.num_moe_layers * moe_layer)

    @functools.cached_property
    def active_layer_params(self) -> int:
        """Linear-layer weights one token passes through (MoE: only its routed and the shared experts)."""
        moe_layer = ((self.experts_per_token + self.num_shared_experts) * self.mlp_params_per_expert
                     + self.router_params_per_layer)
        return (self.num_layers * self.attention_params_per_layer + self.num_dense_layers * self.dense_mlp_params
                + self.num_moe_layers * moe_layer)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        # Two RMSNorms per layer and the final one; latent attention adds one norm per latent.
        latent_norms = self.num_layers * (self.q_lora_rank + self.kv_lora_rank)
        return (2 * self.num_layers + 1) * self.hidden_size + latent_norms

    @property
    def total_params(self) -> int:
        return self.layer_params + self.embedding_params + self.lm_head_params + self.norm_params

    @property
    def active_params(self) -> int:
        return self.active_layer_params + self.embedding_params + self.lm_head_params + self.norm_params

    # --- attention arithmetic -------------------------------------------------------------------

    @property
    def decode_attention_dims(self) -> tuple[int, int]:
        """(query-key, value) dimensions one head's decode attention multiplies over. Latent
        attention decodes in the latent space (the up projections absorbed into the query and the
        output): keys are the latent plus the rope key, values the latent."""
        if self.is_latent_attention:
            return self.kv_lora_rank + self.qk_rope_head_dim, self.kv_lora_rank
        return self.head_dim, self.head_dim

    @property
    def prefill_attention_dims(self) -> tuple[int, int]:
        """(query-key, value) dimensions of one head in prefill, where latent attention expands the
        latent into per-head keys (nope + rope) and values."""
        if self.is_latent_attention:
            return self.head_dim, self.v_head_dim
        return self.head_dim, self.head_dim


def model_from_numbers(
    *,
    name: str,
    num_layers: int,
    hidden_size: int,
    num_attention_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    intermediate_size: int,
    vocab_size: int,
    max_position_embeddings: int = 131072,
    num_experts: int = 1,
    experts_per_token: int = 1,
    tie_word_embeddings: bool = False,
    source: str = "inline",
    architecture_class: str = "",
    **kinds: int | str,
) -> ModelArch:
    """An architecture given as plain numbers (an inline ``spec.model``).

    ``head_dim`` defaults to hidden_size / attention heads, as in Hugging Face configs. ``kinds``
    are ModelArch's MoE, latent-attention and local-attention fields, by name.
    """
    unknown = sorted(set(kinds) - ARCHITECTURE_KIND_FIELDS)
    if unknown:
        raise ValueError(f"model {name}: unknown fields {unknown}; known: {sorted(ARCHITECTURE_KIND_FIELDS)}")
    if head_dim is None:
        if hidden_size % num_attention_heads:
            raise ValueError(f"model {name}: head_dim missing and hidden_size not divisible by heads")
        head_dim = hidden_size // num_attention_heads
    return ModelArch(
        name=name, num_layers=num_layers, hidden_size=hidden_size,
        num_attention_heads=num_attention_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        intermediate_size=intermediate_size, vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings, num_experts=num_experts,
        experts_per_token=experts_per_token, tie_word_embeddings=tie_word_embeddings, source=source,
        architecture_class=architecture_class, **kinds,
    )


# ModelArch fields beyond the dense GQA ones (see its docstring), all optional.
ARCHITECTURE_KIND_FIELDS = frozenset({
    "num_shared_experts", "expert_intermediate_size", "dense_first_layers", "moe_layer_interval",
    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
    "local_attention_window_tokens", "local_attention_kind", "full_attention_layer_interval",
})
