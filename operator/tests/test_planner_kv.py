"""The four worked examples of domain.md and the exact memory arithmetic."""

import pytest

from llmfleet.catalog import load_catalog, model_from_numbers
from llmfleet.planner import (
    decode_tokens_per_sec,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_cache_bytes,
    request_latency_ms,
    tensor_parallel_problem,
    weight_bytes_per_gpu,
)

KIB, MIB, GIB = 2**10, 2**20, 2**30


def _model(kv_heads):
    return model_from_numbers(name="example", num_layers=32, hidden_size=4096, num_attention_heads=32,
                              num_kv_heads=kv_heads, head_dim=128, intermediate_size=14336, vocab_size=32000)


def test_example_1_kv_bytes_per_token_mha_and_gqa():
    fp16 = load_catalog().kv_cache_dtype("FP16")
    assert kv_bytes_per_token(_model(32), fp16) == 524_288 == 512 * KIB
    assert kv_bytes_per_token(_model(8), fp16) == 128 * KIB


def test_example_2_kv_for_contexts_and_requests():
    per_token = kv_bytes_per_token(_model(8), load_catalog().kv_cache_dtype("FP16"))
    one_context = kv_cache_bytes(per_token, 4096)
    assert one_context == 512 * MIB
    assert kv_cache_bytes(per_token, 16 * 4096) == 8 * GIB


def test_example_3_request_latency():
    assert request_latency_ms(ttft_ms=120, output_tokens=100, tpot_ms=20) == 2100


def test_example_4_decode_throughput():
    assert decode_tokens_per_sec(active_requests=32, step_ms=12) == pytest.approx(2666.667, abs=1e-3)
    assert round(decode_tokens_per_sec(32, 12)) == 2667


@pytest.mark.parametrize(("model", "kv", "expected"), [
    ("llama-3.1-8b", "BF16", 131072), ("llama-3.1-8b", "FP8", 65536),
    ("llama-3.1-70b", "BF16", 327680), ("llama-3.1-405b", "BF16", 516096),
    ("llama-3.1-405b", "FP8", 258048), ("qwen2.5-72b", "INT8", 163840),
])
def test_kv_bytes_per_token_of_catalog_models(model, kv, expected):
    # Expected values are the reference table's derived column (and its FP8 half).
    catalog = load_catalog()
    assert kv_bytes_per_token(catalog.model(model), catalog.kv_cache_dtype(kv)) == expected


def test_kv_heads_are_split_then_replicated_across_tp():
    catalog = load_catalog()
    model, fp8 = catalog.model("llama-3.1-405b"), catalog.kv_cache_dtype("FP8")
    assert kv_bytes_per_token_per_gpu(model, fp8, 1) == 126 * 2 * 8 * 128
    assert kv_bytes_per_token_per_gpu(model, fp8, 4) == 126 * 2 * 2 * 128
    assert kv_bytes_per_token_per_gpu(model, fp8, 8) == 126 * 2 * 1 * 128
    assert kv_bytes_per_token_per_gpu(model, fp8, 16) == 126 * 2 * 1 * 128  # replicated, not halved


@pytest.mark.parametrize(("quantization", "tp", "expected_bytes"), [
    # Hand-computed for Llama-3.1-8B: 6,979,321,856 layer weights; embedding and lm_head
    # 525,336,576 each and 266,240 norm weights, all kept in 16 bit; embedding replicated.
    ("BF16", 1, 16_060_522_496),
    ("FP8", 1, 6_979_321_856 + 2 * (2 * 525_336_576 + 266_240)),
    # TP2: layer weights and lm_head halve (8 KV heads split 4 + 4); embedding and norms do not.
    ("FP8", 2, 6_979_321_856 // 2 + 2 * (525_336_576 // 2 + 525_336_576 + 266_240)),
])
def test_weight_bytes_per_gpu(quantization, tp, expected_bytes):
    catalog = load_catalog()
    got = weight_bytes_per_gpu(catalog.model("llama-3.1-8b"), catalog.quantization(quantization), tp)
    assert got == expected_bytes


@pytest.mark.parametrize(("model", "tp", "valid"), [
    ("llama-3.1-8b", 1, True), ("llama-3.1-8b", 2, True), ("llama-3.1-8b", 8, True),
    ("llama-3.1-8b", 3, False), ("llama-3.1-8b", 16, True), ("llama-3.1-405b", 8, True),
    ("llama-3.1-70b", 6, False), ("mixtral-8x7b", 4, True),
])
def test_tensor_parallel_rules(model, tp, valid):
    assert (tensor_parallel_problem(load_catalog().model(model), tp) is None) is valid
