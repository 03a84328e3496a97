"""Exact KV-cache arithmetic and the per-GPU memory budget of one engine."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfleet.catalog import Calibration, GpuType, KvCacheDtype, ModelArch, QuantizationFormat

# Embeddings, lm_head and norms stay in 16 bit in quantised TensorRT-LLM checkpoints.
UNQUANTIZED_BYTES_PER_PARAM = 2
# Logits are produced in fp32 for sampling.
LOGIT_BYTES = 4


def kv_bytes_per_token_per_layer(model: ModelArch, kv_dtype: KvCacheDtype, tensor_parallel_size: int = 1) -> int:
    """What one layer caches for one token on one TP rank. Grouped-query: 2 (K and V) x KV heads x
    head_dim; latent attention: one latent of kv_lora_rank plus a rope key of qk_rope_head_dim,
    shared by all heads, so every rank holds it whole (no factor 2, no split by TP)."""
    if model.is_latent_attention:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_dtype.bytes_per_element
    return 2 * kv_heads_per_gpu(model, tensor_parallel_size) * model.head_dim * kv_dtype.bytes_per_element


def kv_bytes_per_token(model: ModelArch, kv_dtype: KvCacheDtype) -> int:
    """layers x what each layer caches per token (whole model). With local attention this is what a
    token costs while the context fits the window; beyond it see kv_bytes_for_context."""
    return model.num_layers * kv_bytes_per_token_per_layer(model, kv_dtype)


def kv_heads_per_gpu(model: ModelArch, tensor_parallel_size: int) -> int:
    """KV heads are split across TP ranks; with more ranks than KV heads each rank keeps a copy of one."""
    return max(1, model.num_kv_heads // tensor_parallel_size)


def kv_bytes_per_token_per_gpu(model: ModelArch, kv_dtype: KvCacheDtype, tensor_parallel_size: int) -> int:
    return model.num_layers * kv_bytes_per_token_per_layer(model, kv_dtype, tensor_parallel_size)


def kv_bytes_for_context(model: ModelArch, kv_dtype: KvCacheDtype, context_tokens: int,
                         tensor_parallel_size: int = 1) -> int:
    """KV one sequence of context_tokens holds on one TP rank: full-attention layers keep every
    token, local (sliding-window or chunked) layers at most their window's."""
    return int(model.attended_tokens(context_tokens)) * kv_bytes_per_token_per_layer(
        model, kv_dtype, tensor_parallel_size)


def kv_cache_bytes(kv_bytes_per_token_value: int, tokens: int) -> int:
    return kv_bytes_per_token_value * tokens


def request_latency_ms(ttft_ms: float, output_tokens: int, tpot_ms: float) -> float:
    """End-to-end latency: the first token is inside TTFT, the other ones each cost a TPOT."""
    return ttft_ms + (output_tokens - 1) * tpot_ms


def decode_tokens_per_sec(active_requests: int, step_ms: float) -> float:
    """One token per active request per decode step."""
    return active_requests / (step_ms / 1000.0)


def tensor_parallel_problem(model: ModelArch, tensor_parallel_size: int) -> str | None:
    """Why this TP size cannot shard the model, or None when it can."""
    tp = tensor_parallel_size
    if model.num_attention_heads % tp:
        return f"TP{tp} does not divide {model.num_attention_heads} attention heads"
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return f"TP{tp} neither divides nor is a multiple of {model.num_kv_heads} KV heads"
    if model.num_dense_layers and model.intermediate_size % tp:
        return f"TP{tp} does not divide intermediate size {model.intermediate_size}"
    if model.num_moe_layers and model.expert_ffn_size % tp:
        return f"TP{tp} does not divide expert intermediate size {model.expert_ffn_size}"
    return None


def attention_params_per_gpu(model: ModelArch, tensor_parallel_size: int) -> int:
    """One layer's attention weights on one TP rank. Grouped-query: Q and O split by TP, K and V by
    KV head (replicated when TP > KV heads); latent: the down projections whole, the rest split."""
    tp = tensor_parallel_size
    if model.is_latent_attention:
        return model.latent_down_projection_params + model.latent_head_projection_params // tp
    q_and_o = 2 * model.hidden_size * model.num_attention_heads * model.head_dim // tp
    k_and_v = 2 * model.hidden_size * kv_heads_per_gpu(model, tp) * model.head_dim
    return q_and_o + k_and_v


def layer_params_per_gpu(model: ModelArch, tensor_parallel_size: int) -> int:
    """Linear-layer weights one TP rank holds: attention as above, every MLP and expert split by TP
    (expert parallelism is not planned yet), routers replicated."""
    tp = tensor_parallel_size
    moe = ((model.num_experts + model.num_shared_experts) * model.mlp_params_per_expert // tp
           + model.router_params_per_layer)
    return (model.num_layers * attention_params_per_gpu(model, tp)
            + model.num_dense_layers * (model.dense_mlp_params // tp) + model.num_moe_layers * moe)


def weight_bytes_per_gpu(model: ModelArch, quantization: QuantizationFormat, tensor_parallel_size: int) -> int:
    """Quantised layer weights / TP, lm_head split by TP, embedding table replicated
    (TensorRT-LLM's default use_parallel_embedding=False), norms replicated."""
    tp = tensor_parallel_size
    layers = layer_params_per_gpu(model, tp) * quantization.weight_bytes_per_param
    unquantized = model.lm_head_params // tp + model.embedding_params + model.norm_params
    return int(layers + unquantized * UNQUANTIZED_BYTES_PER_PARAM)


def activation_bytes_per_gpu(model: ModelArch, tensor_parallel_size: int, max_num_tokens: int,
                             max_batch_size: int) -> int:
    """Peak activation workspace of one forward step, an estimate: the widest intermediates
    (attention projections, gate+up of the widest MLP kind, residual) for max_num_tokens tokens in
    16 bit, plus fp32 logits for the batch."""
    tp = tensor_parallel_size
    if model.is_latent_attention:
        # queries, the latent and rope key, and the keys and values expanded from it for prefill
        attention_width = (model.num_attention_heads * (model.head_dim + model.qk_nope_head_dim + model.v_head_dim)
                           // tp + model.kv_lora_rank + model.qk_rope_head_dim)
    else:
        attention_width = (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    mlp_widths = []
    if model.num_dense_layers:
        mlp_widths.append(2 * model.intermediate_size // tp)
    if model.num_moe_layers:
        mlp_widths.append(2 * model.expert_ffn_size * (model.experts_per_token + model.num_shared_experts) // tp)
    per_token = (attention_width + max(mlp_widths) + 2 * model.hidden_size) * UNQUANTIZED_BYTES_PER_PARAM
    logits = max_batch_size * math.ceil(model.vocab_size / tp) * LOGIT_BYTES
    return max_num_tokens * per_token + logits


@dataclass(frozen=True)
class MemoryFit:
    weight_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    runtime_reserve_bytes: int
    kv_budget_bytes_per_gpu: int
    # What one token costs in every layer: the whole cost while the context fits any window.
    kv_bytes_per_token_per_gpu: int
    kv_capacity_tokens: int
    tokens_per_block: int
    model: ModelArch

    @property
    def weights_fit(self) -> bool:
        return self.kv_budget_bytes_per_gpu > 0

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.tokens_per_block

    @property
    def kv_bytes_per_layer_block(self) -> int:
        return self.kv_bytes_per_token_per_gpu // self.model.num_layers * self.tokens_per_block

    def kv_bytes_read_per_sequence(self, context_tokens: float) -> float:
        """KV bytes one decode step reads for a sequence of this context (local layers: their window)."""
        return self.model.attended_tokens(context_tokens) * (self.kv_bytes_per_token_per_gpu // self.model.num_layers)

    def max_sequences(self, context_tokens: float, max_batch_size: int) -> int:
        """Sequences of this context the paged cache holds at once (whole blocks per layer kind:
        full-attention layers for the context, local ones for at most their window)."""
        model = self.model
        blocks = max(1, math.ceil(context_tokens / self.tokens_per_block))
        window = model.local_attention_window_tokens
        local_blocks = min(blocks, math.ceil(window / self.tokens_per_block)) if window else 0
        layer_blocks = model.num_full_attention_layers * blocks + model.num_local_attention_layers * local_blocks
        sequences = max(0, self.kv_budget_bytes_per_gpu) // (layer_blocks * self.kv_bytes_per_layer_block)
        return min(max_batch_size, sequences)


def memory_fit(model: ModelArch, gpu: GpuType, quantization: QuantizationFormat, kv_dtype: KvCacheDtype,
               tensor_parallel_size: int, calibration: Calibration, *, max_num_tokens: int,
               max_batch_size: int, kv_cache_free_gpu_mem_fraction: float) -> MemoryFit:
    """Per-GPU budget with TensorRT-LLM semantics: the KV pool is a fraction of the memory still
    free after the engine's weights, activation workspace and runtime are resident."""
    weights = weight_bytes_per_gpu(model, quantization, tensor_parallel_size)
    activations = activation_bytes_per_gpu(model, tensor_parallel_size, max_num_tokens, max_batch_size)
    free = gpu.memory_bytes - weights - activations - calibration.runtime_reserve_bytes
    kv_budget = int(max(0, free) * kv_cache_free_gpu_mem_fraction) if free > 0 else free
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype, tensor_parallel_size)
    blocks = max(0, kv_budget) // (per_token * calibration.tokens_per_block)
    return MemoryFit(
        weight_bytes_per_gpu=weights,
        activation_bytes_per_gpu=activations,
        runtime_reserve_bytes=calibration.runtime_reserve_bytes,
        kv_budget_bytes_per_gpu=kv_budget,
        kv_bytes_per_token_per_gpu=per_token,
        kv_capacity_tokens=blocks * calibration.tokens_per_block,
        tokens_per_block=calibration.tokens_per_block,
        model=model,
    )
