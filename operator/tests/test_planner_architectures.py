"""Worked examples of docs/planner.md, Architectures: KV bytes, weights, activations and FLOPs per
token for each attention and MoE kind. Every expected number was computed by hand from the
published config.json (tests/data/hf_configs and the catalog's sources), as the docs show, not
read back from the code."""

import pytest

from llmfleet.catalog import load_catalog, model_from_numbers
from llmfleet.planner.latency import decode_attention_flops, gemm_flops_per_token, prefill_attention_flops
from llmfleet.planner.memory import (
    activation_bytes_per_gpu,
    kv_bytes_for_context,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    layer_params_per_gpu,
    tensor_parallel_problem,
    weight_bytes_per_gpu,
)

CATALOG = load_catalog()
BF16_KV, FP8_KV = CATALOG.kv_cache_dtype("BF16"), CATALOG.kv_cache_dtype("FP8")


# --- multi-head latent attention: DeepSeek-V3 ---------------------------------------------------

def test_latent_attention_kv_is_latent_plus_rope_key_without_factor_two():
    deepseek = CATALOG.model("deepseek-v3")
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes
    assert kv_bytes_per_token(deepseek, BF16_KV) == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(deepseek, FP8_KV) == 35_136
    # Shared by all heads: every TP rank holds the whole latent.
    assert kv_bytes_per_token_per_gpu(deepseek, BF16_KV, 8) == 70_272
    # A 128K context: 70,272 x 131,072 B = 8.58 GiB
    assert kv_bytes_for_context(deepseek, BF16_KV, 131_072) == 9_210_691_584


def test_latent_attention_weights():
    deepseek = CATALOG.model("deepseek-v3")
    # q_a 7168x1536 + kv_a 7168x576 (down, replicated) + q_b 1536x128x192 + kv_b 512x128x256 + o 128x128x7168
    assert deepseek.latent_down_projection_params == 11_010_048 + 4_128_768
    assert deepseek.latent_head_projection_params == 37_748_736 + 16_777_216 + 117_440_512
    assert deepseek.attention_params_per_layer == 187_105_280


def test_deepseek_moe_with_shared_expert_and_dense_first_layers():
    deepseek = CATALOG.model("deepseek-v3")
    assert (deepseek.num_dense_layers, deepseek.num_moe_layers) == (3, 58)
    # dense MLP 3x7168x18432; expert 3x7168x2048; MoE layer (256 routed + 1 shared) experts + router 7168x256
    assert deepseek.dense_mlp_params == 396_361_728
    assert deepseek.mlp_params_per_expert == 44_040_192
    moe_layer = 257 * 44_040_192 + 1_835_008
    assert deepseek.layer_params == 61 * 187_105_280 + 3 * 396_361_728 + 58 * moe_layer == 669_172_039_680
    # + embedding and lm_head 129280x7168 each + norms (2x61+1)x7168 + latent norms 61x(1536+512)
    assert deepseek.total_params == 669_172_039_680 + 2 * 926_679_040 + 881_664 + 124_928 == 671_026_404_352
    # a token: 8 routed + 1 shared expert
    active = 61 * 187_105_280 + 3 * 396_361_728 + 58 * (9 * 44_040_192 + 1_835_008)
    assert deepseek.active_layer_params == active == 35_697_917_952
    assert gemm_flops_per_token(deepseek) == 2 * 35_697_917_952


def test_deepseek_fp8_weights_on_one_h100_node_do_not_fit():
    deepseek = CATALOG.model("deepseek-v3")
    # TP8: latent down projections whole, the rest / 8; every MLP and expert / 8; routers whole.
    per_layer_attention = 15_138_816 + 171_966_464 // 8
    moe_layer = 257 * 44_040_192 // 8 + 1_835_008
    layers = 61 * per_layer_attention + 3 * (396_361_728 // 8) + 58 * moe_layer
    assert layer_params_per_gpu(deepseek, 8) == layers == 84_547_665_920
    # FP8 1 byte per layer weight; lm_head / 8, embedding and norms whole, 2 bytes each
    expected = layers + 2 * (926_679_040 // 8 + 926_679_040 + 1_006_592)
    assert weight_bytes_per_gpu(deepseek, CATALOG.quantization("FP8"), 8) == expected == 86_634_706_944
    assert expected > CATALOG.gpu("H100-SXM-80GB").memory_bytes  # 80.7 GiB: one node of H100 is too small


def test_latent_attention_activations():
    deepseek = CATALOG.model("deepseek-v3")
    # TP8, per token: heads x (q 192 + expanded k nope 128 + v 128) / 8 + latent 512 + rope 64 = 7,744;
    # widest MLP 2x18432/8 = 2x2048x9/8 = 4,608; residual 2x7168; all x 2 bytes = 53,376 B.
    # 8,192 tokens, plus fp32 logits for 256 sequences of ceil(129280/8) = 16,160.
    assert activation_bytes_per_gpu(deepseek, 8, 8192, 256) == 8192 * 53_376 + 256 * 16_160 * 4 == 453_804_032


def test_latent_attention_flops():
    deepseek = CATALOG.model("deepseek-v3")
    # Decode in the latent space: 2 x 128 heads x (576 + 512) x 61 layers x 4,096 context tokens.
    assert decode_attention_flops(deepseek, 4096) == 2 * 128 * 1088 * 61 * 4096 == 69_591_891_968
    # Prefill with expanded heads: 2 x 128 x (192 + 128) x 61 x 4096^2 / 2 causal pairs.
    assert prefill_attention_flops(deepseek, 4096, 0) == 2 * 128 * 320 * 61 * 4096 ** 2 / 2 == 41_918_880_808_960


# --- sliding window: gpt-oss-120b; chunked: Llama 4 ------------------------------------------------

def test_sliding_window_kv_pays_the_context_only_on_full_layers():
    gpt_oss = CATALOG.model("gpt-oss-120b")
    assert (gpt_oss.num_full_attention_layers, gpt_oss.num_local_attention_layers) == (18, 18)
    # per layer and token 2 x 8 KV heads x 64 x 2 bytes = 2,048 B; 36 layers while context <= 128
    assert kv_bytes_per_token(gpt_oss, BF16_KV) == 36 * 2048 == 73_728
    assert kv_bytes_for_context(gpt_oss, BF16_KV, 100) == 36 * 100 * 2048
    # 32,768 tokens: 18 full layers x 32,768 + 18 sliding layers x 128 = 592,128 token-layers
    assert kv_bytes_for_context(gpt_oss, BF16_KV, 32_768) == (18 * 32_768 + 18 * 128) * 2048 == 1_212_678_144


def test_sliding_window_attention_flops():
    gpt_oss = CATALOG.model("gpt-oss-120b")
    # decode at 32,768: 2 x 64 heads x (64 + 64) x 592,128 token-layers
    assert decode_attention_flops(gpt_oss, 32_768) == 2 * 64 * 128 * 592_128 == 9_701_425_152
    # prefill 4,096: full layers 4096^2/2 pairs; sliding layers 128^2/2 + 128 x (4096 - 128)
    pairs = 18 * 4096 ** 2 / 2 + 18 * (128 ** 2 / 2 + 128 * 3968)
    assert pairs == 160_284_672
    assert prefill_attention_flops(gpt_oss, 4096, 0) == 2 * 64 * 128 * pairs
    # A chunk after a long prefix: sliding layers see exactly the window per query.
    assert gpt_oss.attended_pairs(10_000, 100) == 18 * (10_100 ** 2 - 10_000 ** 2) / 2 + 18 * 128 * 100


def test_chunked_attention_kv_llama4_scout():
    scout = CATALOG.model("llama-4-scout")
    # every 4th of 48 layers full (12), 36 chunked to 8,192; per layer 2 x 8 x 128 x 2 = 4,096 B
    assert (scout.num_full_attention_layers, scout.num_local_attention_layers) == (12, 36)
    assert kv_bytes_for_context(scout, BF16_KV, 131_072) == (12 * 131_072 + 36 * 8192) * 4096 == 7_650_410_496


# --- MoE on every n-th layer with a shared expert: Llama 4 Maverick ---------------------------------

def test_maverick_interleaved_moe_layers():
    maverick = CATALOG.model("llama-4-maverick")
    assert (maverick.num_moe_layers, maverick.num_dense_layers) == (24, 24)
    attention = 2 * 5120 * 40 * 128 + 2 * 5120 * 8 * 128  # 62,914,560
    dense = 3 * 5120 * 16384  # intermediate_size_mlp
    expert = 3 * 5120 * 8192  # intermediate_size (routed and shared)
    router = 5120 * 128
    assert maverick.layer_params == 48 * attention + 24 * dense + 24 * (129 * expert + router) == 398_642_380_800
    assert maverick.active_layer_params == 48 * attention + 24 * dense + 24 * (2 * expert + router) == 15_115_223_040


def test_tp_must_divide_the_expert_ffn_where_experts_exist():
    qwen = CATALOG.model("qwen3-30b-a3b")  # experts 768 wide, no dense layer
    assert tensor_parallel_problem(qwen, 8) is None
    odd = model_from_numbers(name="odd", num_layers=4, hidden_size=256, num_attention_heads=8, num_kv_heads=8,
                             intermediate_size=1024, vocab_size=1000, num_experts=4, experts_per_token=2,
                             expert_intermediate_size=100)
    assert tensor_parallel_problem(odd, 8) == "TP8 does not divide expert intermediate size 100"


@pytest.mark.parametrize(("fields", "message"), [
    ({"kv_lora_rank": 512}, "latent attention needs"),
    ({"full_attention_layer_interval": 2}, "set local_attention_window_tokens"),
    ({"num_shared_experts": 1}, "set num_experts too"),
    ({"local_attention_window_tokens": 128, "local_attention_kind": "global"}, "local_attention_kind"),
])
def test_inconsistent_kinds_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        model_from_numbers(name="bad", num_layers=4, hidden_size=256, num_attention_heads=4, num_kv_heads=4,
                           intermediate_size=512, vocab_size=1000, **fields)
