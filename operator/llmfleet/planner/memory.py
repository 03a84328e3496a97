"""Exact KV-cache arithmetic and the per-GPU memory budget of one engine."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from llmfleet.catalog import Calibration, GpuType, KvCacheDtype, ModelArch, QuantizationFormat
from llmfleet.planner.layout import Layout, stage_layer_ranges

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


def stage_layers(model: ModelArch, parallel: Layout | int) -> int:
    """Layers of the largest pipeline stage (all of them without PP)."""
    return max(layers for layers, _ in _stage_layer_kinds(model, Layout.of(parallel).pipeline_parallel_size))


def kv_bytes_per_token_per_gpu(model: ModelArch, kv_dtype: KvCacheDtype, parallel: Layout | int) -> int:
    """What one token of a sequence this GPU holds costs it: the largest stage's layers, each split
    by attention TP (whole per rank under ADP, where the ranks hold different sequences)."""
    layout = Layout.of(parallel)
    return stage_layers(model, layout) * kv_bytes_per_token_per_layer(model, kv_dtype,
                                                                      layout.attention_tensor_parallel_size)


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


def _attention_and_dense_problem(model: ModelArch, tp: int) -> str | None:
    """Why TP cannot split the attention heads or the dense MLPs, or None."""
    if model.num_attention_heads % tp:
        return f"TP{tp} does not divide {model.num_attention_heads} attention heads"
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return f"TP{tp} neither divides nor is a multiple of {model.num_kv_heads} KV heads"
    if model.num_dense_layers and model.intermediate_size % tp:
        return f"TP{tp} does not divide intermediate size {model.intermediate_size}"
    return None


def tensor_parallel_problem(model: ModelArch, tensor_parallel_size: int) -> str | None:
    """Why this TP size cannot shard the model, or None when it can."""
    tp = tensor_parallel_size
    problem = _attention_and_dense_problem(model, tp)
    if problem:
        return problem
    if model.num_moe_layers and model.expert_ffn_size % tp:
        return f"TP{tp} does not divide expert intermediate size {model.expert_ffn_size}"
    return None


def layout_problem(model: ModelArch, layout: Layout) -> str | None:
    """Why this layout cannot shard the model, or None when it can."""
    if layout.is_tensor_parallel_only:
        return tensor_parallel_problem(model, layout.tensor_parallel_size)
    tp, ep = layout.tensor_parallel_size, layout.expert_parallel_size
    if layout.pipeline_parallel_size > model.num_layers:
        return f"PP{layout.pipeline_parallel_size} exceeds {model.num_layers} layers"
    if (ep > 1 or layout.attention_data_parallel) and not model.is_moe:
        return "expert parallelism and attention data parallelism need experts; the model is dense"
    if not layout.attention_data_parallel:
        problem = _attention_and_dense_problem(model, tp)
        if problem:
            return problem
        if model.num_shared_experts and model.expert_ffn_size % tp:
            return f"TP{tp} does not divide the shared experts' intermediate size {model.expert_ffn_size}"
    if model.num_experts % ep:
        return f"EP{ep} does not divide {model.num_experts} experts"
    if model.num_moe_layers and model.expert_ffn_size % layout.expert_tensor_parallel_size:
        return (f"expert TP{layout.expert_tensor_parallel_size} does not divide expert intermediate size "
                f"{model.expert_ffn_size}")
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


@functools.lru_cache(maxsize=1024)
def _stage_layer_kinds(model: ModelArch, pipeline_parallel_size: int) -> tuple[tuple[int, int], ...]:
    """(layers, MoE layers) per stage; cached, as the planner asks for every step it models."""
    def is_moe(index: int) -> bool:
        return model.is_moe and index >= model.dense_first_layers and (index + 1) % model.moe_layer_interval == 0
    return tuple((len(stage), sum(1 for i in stage if is_moe(i)))
                 for stage in stage_layer_ranges(model.num_layers, pipeline_parallel_size))


def layer_params_per_gpu(model: ModelArch, parallel: Layout | int) -> int:
    """Linear-layer weights one GPU holds, in the largest pipeline stage: attention split by its
    TP (whole under ADP); dense MLPs and shared experts split by TP (whole under ADP, where the
    ranks' tokens do not meet before the experts); routed experts over EP x expert-TP = TP ranks,
    so TP's share of them whatever EP is; routers replicated."""
    layout = Layout.of(parallel)
    tp = layout.tensor_parallel_size
    attention = attention_params_per_gpu(model, layout.attention_tensor_parallel_size)
    if layout.attention_data_parallel:
        dense = model.dense_mlp_params
        moe = (model.num_experts * model.mlp_params_per_expert // tp
               + model.num_shared_experts * model.mlp_params_per_expert + model.router_params_per_layer)
    else:
        dense = model.dense_mlp_params // tp
        moe = ((model.num_experts + model.num_shared_experts) * model.mlp_params_per_expert // tp
               + model.router_params_per_layer)
    return max(layers * attention + (layers - moe_layers) * dense + moe_layers * moe
               for layers, moe_layers in _stage_layer_kinds(model, layout.pipeline_parallel_size))


def weight_bytes_per_gpu(model: ModelArch, quantization: QuantizationFormat, parallel: Layout | int) -> int:
    """Quantised layer weights of the largest stage, lm_head split by TP, embedding table
    replicated (TensorRT-LLM's default use_parallel_embedding=False), norms replicated. With PP the
    first stage holds the embedding and the last the lm_head: the larger of the two is counted
    (with the largest stage's layers, which may be neither: an upper bound). Under ADP the lm_head
    is taken whole (not read upstream; the conservative reading)."""
    layout = Layout.of(parallel)
    lm_head = model.lm_head_params // layout.attention_tensor_parallel_size
    ends = max(lm_head, model.embedding_params) if layout.pipeline_parallel_size > 1 else lm_head + model.embedding_params
    layers = layer_params_per_gpu(model, layout) * quantization.weight_bytes_per_param
    return int(layers + (ends + model.norm_params) * UNQUANTIZED_BYTES_PER_PARAM)


def activation_bytes_per_gpu(model: ModelArch, parallel: Layout | int, max_num_tokens: int,
                             max_batch_size: int) -> int:
    """Peak activation workspace of one forward step, an estimate: the widest intermediates
    (attention projections, gate+up of the widest MLP kind, residual) for max_num_tokens tokens in
    16 bit, plus fp32 logits for the batch. Under ADP a rank's attention, dense MLP and logits are
    whole (its own tokens, up to max_num_tokens)."""
    layout = Layout.of(parallel)
    tp = layout.attention_tensor_parallel_size
    expert_tp = layout.tensor_parallel_size
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
        mlp_widths.append(2 * model.expert_ffn_size * (model.experts_per_token + model.num_shared_experts) // expert_tp)
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
    kv_capacity_tokens: int  # the replica's: every sequence shard's
    tokens_per_block: int
    model: ModelArch
    # The largest pipeline stage's layers, and the ranks holding different sequences (ADP).
    stage_layers: int
    sequence_shards: int = 1

    @property
    def weights_fit(self) -> bool:
        return self.kv_budget_bytes_per_gpu > 0

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.tokens_per_block

    @property
    def kv_bytes_per_layer_block(self) -> int:
        return self.kv_bytes_per_token_per_gpu // self.stage_layers * self.tokens_per_block

    def kv_bytes_read_per_sequence(self, context_tokens: float) -> float:
        """KV bytes one decode step reads on one GPU for a sequence of this context (local layers:
        their window), on average: with PP its stage's layers, under ADP a 1/TP share of the
        sequences."""
        per_layer = self.kv_bytes_per_token_per_gpu // self.stage_layers
        stage_share = self.stage_layers / self.model.num_layers
        return self.model.attended_tokens(context_tokens) * per_layer * stage_share / self.sequence_shards

    def max_sequences(self, context_tokens: float, max_batch_size: int) -> int:
        """Sequences of this context the paged cache holds at once (whole blocks per layer kind:
        full-attention layers for the context, local ones for at most their window)."""
        model = self.model
        blocks = max(1, math.ceil(context_tokens / self.tokens_per_block))
        window = model.local_attention_window_tokens
        local_blocks = min(blocks, math.ceil(window / self.tokens_per_block)) if window else 0
        layer_blocks = model.num_full_attention_layers * blocks + model.num_local_attention_layers * local_blocks
        # A stage holds its share of the layers (kinds in proportion); ADP's ranks hold different sequences.
        stage_blocks = math.ceil(layer_blocks * self.stage_layers / model.num_layers)
        sequences = max(0, self.kv_budget_bytes_per_gpu) // (stage_blocks * self.kv_bytes_per_layer_block)
        return min(max_batch_size, sequences * self.sequence_shards)


def memory_fit(model: ModelArch, gpu: GpuType, quantization: QuantizationFormat, kv_dtype: KvCacheDtype,
               parallel: Layout | int, calibration: Calibration, *, max_num_tokens: int,
               max_batch_size: int, kv_cache_free_gpu_mem_fraction: float) -> MemoryFit:
    """Per-GPU budget with TensorRT-LLM semantics: the KV pool is a fraction of the memory still
    free after the engine's weights, activation workspace and runtime are resident."""
    layout = Layout.of(parallel)
    weights = weight_bytes_per_gpu(model, quantization, layout)
    activations = activation_bytes_per_gpu(model, layout, max_num_tokens, max_batch_size)
    free = gpu.memory_bytes - weights - activations - calibration.runtime_reserve_bytes
    kv_budget = int(max(0, free) * kv_cache_free_gpu_mem_fraction) if free > 0 else free
    per_token = kv_bytes_per_token_per_gpu(model, kv_dtype, layout)
    blocks = max(0, kv_budget) // (per_token * calibration.tokens_per_block) * layout.sequence_shards
    return MemoryFit(
        weight_bytes_per_gpu=weights,
        activation_bytes_per_gpu=activations,
        runtime_reserve_bytes=calibration.runtime_reserve_bytes,
        kv_budget_bytes_per_gpu=kv_budget,
        kv_bytes_per_token_per_gpu=per_token,
        kv_capacity_tokens=blocks * calibration.tokens_per_block,
        tokens_per_block=calibration.tokens_per_block,
        model=model,
        stage_layers=stage_layers(model, layout),
        sequence_shards=layout.sequence_shards,
    )
