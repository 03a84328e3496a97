"""Latency model tables: hand formulas for simple cases, orderings, and calibration accuracy."""

import math

import pytest

from llmfleet.catalog import load_catalog
from llmfleet.planner import estimate
from llmfleet.planner.latency import (build_engine, predict_at_load, prefill_attention_flops, prompt_occupancy_seconds,
                                     saturation_throughput_tokens_per_sec, step_seconds, steady_step_seconds)

CAL = load_catalog().calibration
H100 = load_catalog().gpu("H100-SXM-80GB")


def _engine(model: str, gpu: str, quantization: str, kv_dtype: str, tp: int, *, max_batch_size: int,
            max_num_tokens: int):
    catalog = load_catalog()
    return build_engine(catalog.model(model), catalog.gpu(gpu), catalog.quantization(quantization),
                        catalog.kv_cache_dtype(kv_dtype), tp, CAL, max_batch_size=max_batch_size,
                        max_num_tokens=max_num_tokens, kv_cache_free_gpu_mem_fraction=0.9)


def test_single_request_decode_is_weight_bandwidth_bound():
    # Llama-3.1-8B FP8, TP1, batch 1: the step streams layer weights (1 byte) and lm_head (2 bytes);
    # the embedding table is only looked up. A 1-token context makes the KV read negligible.
    streamed = 6_979_321_856 + 2 * 525_336_576
    expected_ms = streamed / (H100.memory_bandwidth_bytes_per_sec * CAL.memory_bandwidth_efficiency) * 1000 \
        + CAL.step_overhead_ms
    got = estimate("llama-3.1-8b", "H100-SXM-80GB", 1, "FP8", "FP8", isl=1, osl=2).tpot_ms
    assert got == pytest.approx(expected_ms, rel=0.01)


def test_long_prompt_prefill_is_compute_bound():
    # 8192-token prompt, Llama-3.1-8B FP8 on H100: GEMM FLOPs 2 x active layer params per token at FP8,
    # causal attention 2 x layers x heads x head_dim x n^2 at BF16, one lm_head for the last token.
    n = 8192
    gemm = 2 * 6_979_321_856 * n + 2 * 128256 * 4096
    attention = 2 * 32 * 32 * 128 * n * n
    expected_ms = (gemm / (1978e12 * CAL.prefill_compute_efficiency)
                   + attention / (989e12 * CAL.prefill_compute_efficiency)) * 1000 + CAL.step_overhead_ms
    got = estimate("llama-3.1-8b", "H100-SXM-80GB", 1, "FP8", "FP8", isl=n, osl=2).ttft_ms
    assert got == pytest.approx(expected_ms, rel=0.01)


def test_kv_reads_add_to_a_compute_bound_step():
    # The attention kernel runs after the GEMMs, not alongside them: a batch large enough to make
    # the GEMMs compute-bound still pays its KV reads in full (one roofline over the whole step
    # would hide them under the GEMMs' compute). Llama-3.1-8B FP8 on H100, 1024 sequences.
    engine = _engine("llama-3.1-8b", "H100-SXM-80GB", "FP8", "FP8", 1, max_batch_size=2048, max_num_tokens=8192)
    batch, context = 1024, 1000
    gemm_s = batch * 2 * (6_979_321_856 + 128256 * 4096) / engine.decode_gemm_flops_per_sec
    weights_s = (6_979_321_856 + 2 * 525_336_576) / engine.effective_bandwidth_bytes_per_sec
    kv_read_s = batch * context * 32 * 2 * 8 * 128 / engine.effective_bandwidth_bytes_per_sec
    assert gemm_s > weights_s + kv_read_s / 2  # compute-bound by a margin the KV read would hide in
    added_s = step_seconds(engine, batch, context) - step_seconds(engine, batch, 0)
    assert added_s == pytest.approx(kv_read_s, rel=1e-6)


@pytest.mark.parametrize("model, gpu, tp, rate", [("llama-3.1-8b", "H100-SXM-80GB", 1, 2.0),
                                                  ("llama-3.1-8b", "H100-SXM-80GB", 1, 15.0),
                                                  ("llama-3.1-70b", "H200-SXM-141GB", 4, 5.0),
                                                  ("llama-3.1-70b", "L40S-48GB", 8, 0.5)])
def test_the_steady_step_is_the_step_of_the_batch_it_implies(model, gpu, tp, rate):
    # steady_step_seconds solves, for the decode batch B and the prompt tokens per step P that tau
    # implies by Little's law, tau x (1 - rate x a prompt's occupancy at B and P) = the decode step
    # at B; check the solution.
    engine = _engine(model, gpu, "FP8", "FP8", tp, max_batch_size=256, max_num_tokens=8192)
    isl, osl, context = 1000, 200, 1100
    tau = steady_step_seconds(engine, rate, isl, 0, osl, context)
    batch = rate * osl * tau
    occupancy = prompt_occupancy_seconds(engine, isl, 0, batch, context, rate * tau * isl)
    assert tau * (1 - rate * occupancy) == pytest.approx(step_seconds(engine, batch, context), rel=1e-6)


def test_a_prompt_chunk_costs_its_compute_in_a_memory_bound_step():
    # 8B BF16 on the A100, 16 sequences decoding, 512-token steps: 496 tokens are left beside the
    # decode batch, so a 1024-token prompt is computed in three chunks of 341, each making its step
    # compute-bound. Its occupancy is what those steps take beyond the decode step, far more than
    # the same tokens spread thin over memory-bound steps would cost (the weights streamed hide them).
    engine = _engine("llama-3.1-8b", "A100-SXM-80GB", "BF16", "BF16", 1, max_batch_size=16, max_num_tokens=512)
    batch, context = 16, 1152
    decode_s = step_seconds(engine, batch, context)
    chunk = 1024 / 3
    chunks = [step_seconds(engine, batch, context, chunk, prefill_attention_flops(engine.model, chunk, index * chunk),
                           prefill_sequences=1.0 if index == 2 else 0.0) for index in range(3)]
    occupancy = prompt_occupancy_seconds(engine, 1024, 0, batch, context)
    assert occupancy == pytest.approx(sum(chunks) - 3 * decode_s, rel=1e-9)
    spread = step_seconds(engine, batch, context, 64, prefill_attention_flops(engine.model, 64, 0), 1 / 16) - decode_s
    assert occupancy > 16 * spread * 3


def test_kv_capacity_follows_the_free_memory_rule():
    est = estimate("llama-3.1-8b", "H100-SXM-80GB", 1, "FP8", "FP8", isl=1000, osl=1000)
    weights = 6_979_321_856 + 2 * (2 * 525_336_576 + 266_240)
    free = H100.memory_bytes - weights - CAL.runtime_reserve_bytes
    upper_bound_tokens = 0.9 * free / 65536
    assert est.kv_bytes_per_token == 65536
    # Activation workspace comes off the free memory too, so capacity sits a little below.
    assert 0.95 * upper_bound_tokens < est.kv_capacity_tokens < upper_bound_tokens
    assert est.kv_capacity_tokens % CAL.tokens_per_block == 0
    assert est.max_concurrent_requests == min(2048, est.kv_capacity_tokens // 64 // math.ceil(2000 / 64))


@pytest.mark.parametrize(("quantization", "kv"), [("BF16", "BF16"), ("FP8", "FP8"), ("INT4AWQ", "INT8")])
def test_more_concurrency_means_slower_tokens_but_more_throughput(quantization, kv):
    one = estimate("llama-3.1-8b", "H100-SXM-80GB", 1, quantization, kv, 1000, 200, concurrency=1)
    many = estimate("llama-3.1-8b", "H100-SXM-80GB", 1, quantization, kv, 1000, 200, concurrency=64)
    assert many.tpot_ms > one.tpot_ms
    assert many.ttft_ms > one.ttft_ms
    assert 64 / many.tpot_ms > 1 / one.tpot_ms


def test_orderings_across_hardware_and_formats():
    def tpot(gpu, tp, quant):
        return estimate("llama-3.1-70b", gpu, tp, quant, "FP8" if gpu != "A100-SXM-80GB" else "INT8",
                        2000, 200).tpot_ms
    assert tpot("H200-SXM-141GB", 1, "FP8") < tpot("H100-SXM-80GB", 1, "FP8")  # more bandwidth
    assert tpot("H100-SXM-80GB", 2, "FP8") < tpot("H100-SXM-80GB", 1, "FP8")  # TP splits weights
    assert tpot("H100-SXM-80GB", 2, "FP8") < tpot("H100-SXM-80GB", 2, "BF16")  # fewer weight bytes
    assert tpot("A100-SXM-80GB", 2, "BF16") > tpot("H100-SXM-80GB", 2, "BF16")


def test_tp_over_pcie_costs_more_than_over_nvlink():
    # Same bandwidth-per-GPU ratio aside, L40S TP all-reduces go over PCIe.
    l40s = estimate("llama-3.1-8b", "L40S-48GB", 2, "FP8", "FP8", 4000, 100)
    l40s_1 = estimate("llama-3.1-8b", "L40S-48GB", 1, "FP8", "FP8", 4000, 100)
    h100 = estimate("llama-3.1-8b", "H100-SXM-80GB", 2, "FP8", "FP8", 4000, 100)
    h100_1 = estimate("llama-3.1-8b", "H100-SXM-80GB", 1, "FP8", "FP8", 4000, 100)
    assert l40s.ttft_ms / l40s_1.ttft_ms > h100.ttft_ms / h100_1.ttft_ms


def test_invalid_configurations_raise():
    with pytest.raises(ValueError, match="does not run FP8"):
        estimate("llama-3.1-8b", "A100-SXM-80GB", 1, "FP8", "INT8", 100, 100)
    with pytest.raises(ValueError, match="does not run NVFP4"):
        estimate("llama-3.1-8b", "H100-SXM-80GB", 1, "NVFP4", "FP8", 100, 100)
    with pytest.raises(ValueError, match="do not fit"):
        estimate("llama-3.1-405b", "H100-SXM-80GB", 1, "FP8", "FP8", 100, 100)
    with pytest.raises(ValueError, match="attention heads"):
        estimate("llama-3.1-8b", "H100-SXM-80GB", 3, "FP8", "FP8", 100, 100)


def test_estimate_json_keys():
    keys = set(estimate("mixtral-8x7b", "H100-SXM-80GB", 2, "FP8", "FP8", 512, 256).to_json_dict())
    assert keys == {"kvBytesPerToken", "kvCapacityTokens", "maxConcurrentRequests",
                    "maxThroughputTokensPerSec", "ttftMs", "tpotMs"}


def test_moe_decode_reads_fewer_weights_than_a_dense_model_of_equal_size():
    moe = estimate("mixtral-8x7b", "H100-SXM-80GB", 1, "FP8", "FP8", 100, 100).tpot_ms
    dense_70b = estimate("llama-3.1-70b", "H100-SXM-80GB", 1, "FP8", "FP8", 100, 100).tpot_ms
    assert moe < dense_70b / 2


def test_calibration_rows_stay_within_a_factor_of_1_6():
    """Regression guard on the public measurements the efficiency factors were fitted to."""
    catalog = load_catalog()
    ratios, v014_ratios = [], []
    for m in catalog.calibration_measurements:
        est = estimate(m.model, m.gpu, m.tensor_parallel_size, m.quantization, m.kv_cache_dtype,
                       m.input_tokens, m.output_tokens, kv_cache_free_gpu_mem_fraction=0.95)
        ratio = est.max_throughput_tokens_per_sec / m.output_tokens_per_sec
        (v014_ratios if "(v0.14.0 data)" in m.source else ratios).append(ratio)
    # 60 Hopper FP8 and 20 B200 NVFP4 rows (v1.0); 214 rows of the v0.17 page: A100 FP16, L40S FP8,
    # Mistral 7B and Mixtral 8x7B on H100/H200 FP8; 490 rows of the v0.14 page.
    assert (len(ratios), len(v014_ratios)) == (294, 490)
    assert all(1 / 1.6 < r < 1.6 for r in ratios)
    # v0.14's 70B rows that barely fit (FP16 at TP2, FP8 at TP1 on 80 GB) are estimated up to 2.26x.
    assert all(1 / 2.3 < r < 2.3 for r in v014_ratios)
    every = ratios + v014_ratios
    assert math.exp(sum(abs(math.log(r)) for r in every) / len(every)) < 1.2


def test_prompts_sharing_a_step_take_their_share_of_its_compute():
    # 8B FP8 on H100 with 50 sequences decoding: one 128-token prompt fits under the weight
    # streaming of the memory-bound decode step, almost free; at a load where a step carries 1000
    # prompt tokens the step is compute-bound, and each prompt's share of it is its 128 tokens'
    # GEMM time.
    engine = _engine("llama-3.1-8b", "H100-SXM-80GB", "FP8", "FP8", 1, max_batch_size=64, max_num_tokens=4096)
    alone = prompt_occupancy_seconds(engine, 128, 0, 50, 144)
    shared = prompt_occupancy_seconds(engine, 128, 0, 50, 144, other_prompt_tokens=1000)
    gemm_s = 128 * 2 * 6_979_321_856 / engine.prefill_gemm_flops_per_sec
    assert alone < gemm_s / 10
    assert shared == pytest.approx(gemm_s, rel=0.25)


def test_a_prompt_served_wholly_from_the_prefix_cache_costs_its_lm_head():
    # prefixSharingFraction may be 1: nothing of the prompt is computed but its LM head.
    engine = _engine("llama-3.1-8b", "H100-SXM-80GB", "FP8", "FP8", 1, max_batch_size=64, max_num_tokens=4096)
    lm_head_s = 2 * 128256 * 4096 / engine.prefill_gemm_flops_per_sec
    occupancy = prompt_occupancy_seconds(engine, 0, 1000, 50, 1100, other_prompt_tokens=500)
    assert 0 <= occupancy <= lm_head_s * 1.01
    prediction = predict_at_load(engine, 20.0, 1000, 2000, 200, 400, prefix_sharing_fraction=1.0)
    assert prediction.problem is None and math.isfinite(prediction.ttft_p99_ms)
    assert saturation_throughput_tokens_per_sec(engine, 1000, 200, prefix_tokens=1000) > 0
