"""Plan search: choices, infeasible cases, and properties."""


from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.catalog import load_catalog
from llmfleet.planner import (
    PlanRequest,
    SearchSpace,
    SloTargets,
    Workload,
    format_estimate_table,
    format_plan_table,
    estimate,
    plan,
)
from llmfleet.planner.memory import activation_bytes_per_gpu, weight_bytes_per_gpu

CATALOG = load_catalog()
ALL_GPUS = tuple(CATALOG.gpus)
ALL_QUANT = tuple(CATALOG.quantizations)
ALL_KV = tuple(CATALOG.kv_cache_dtypes)
CHAT = Workload(input_tokens_mean=1000, input_tokens_p99=4000, output_tokens_mean=200, output_tokens_p99=800,
                peak_requests_per_sec=5)


def request(model="llama-3.1-8b", workload=CHAT, ttft=1000, tpot=50, quality=None, **space):
    space.setdefault("gpu_types", ("H100-SXM-80GB",))
    return PlanRequest(CATALOG.model(model), workload, SloTargets(ttft, tpot, quality), SearchSpace(**space))


def test_plan_json_has_exactly_the_documented_keys():
    result = plan(request())
    body = result.to_json_dict()
    assert set(body) == {"feasible", "gpuType", "tensorParallelSize", "pipelineParallelSize", "quantization",
                         "kvCacheDtype", "replicas", "gpusTotal", "predicted", "rationale", "rejected"}
    assert set(body["predicted"]) == {"ttftP99Ms", "tpotP99Ms", "kvBytesPerToken", "kvCapacityTokens",
                                      "maxConcurrentRequests", "maxThroughputTokensPerSec"}
    assert all(set(r) == {"option", "reason"} for r in body["rejected"])
    assert body["pipelineParallelSize"] == 1 and body["gpusTotal"] == body["replicas"] * body["tensorParallelSize"]


def test_small_model_light_load_gets_one_gpu():
    result = plan(request())
    assert result.feasible
    assert (result.gpu_type, result.tensor_parallel_size, result.replicas) == ("H100-SXM-80GB", 1, 1)
    assert result.summary == f"H100x1 {result.quantization}"
    assert result.predicted.ttft_p99_ms <= 1000 and result.predicted.tpot_p99_ms <= 50
    assert "fewest GPUs" in " ".join(result.rationale)


def test_70b_bf16_on_h100_needs_tensor_parallelism():
    result = plan(request("llama-3.1-70b", quantizations=("BF16",), kv_cache_dtypes=("BF16",)))
    assert result.feasible and result.tensor_parallel_size >= 2
    memory = [r for r in result.rejected if r.option.startswith("H100-SXM-80GB TP1 ")]
    assert memory and "memory" in memory[0].reason


def test_quality_budget_excludes_lossy_formats():
    result = plan(request("llama-3.1-70b", quality=1.0, gpu_types=("A100-SXM-80GB",),
                          quantizations=("INT4AWQ", "BF16"), kv_cache_dtypes=("BF16",)))
    assert result.quantization == "BF16"
    assert any("quality" in r.reason for r in result.rejected)


def test_pins_are_respected():
    result = plan(request(gpu_types=ALL_GPUS, pinned_gpu_type="H200-SXM-141GB", pinned_tensor_parallel_size=2,
                          pinned_quantization="BF16", pinned_kv_cache_dtype="FP8", pinned_replicas=3))
    assert (result.gpu_type, result.tensor_parallel_size, result.quantization, result.kv_cache_dtype,
            result.replicas) == ("H200-SXM-141GB", 2, "BF16", "FP8", 3)


def test_too_tight_tpot_is_infeasible_with_reason_and_closest_option():
    result = plan(request(tpot=1, gpu_types=ALL_GPUS, quantizations=ALL_QUANT))
    assert not result.feasible
    assert result.gpu_type is not None and result.predicted is not None  # the closest option
    assert result.predicted.tpot_p99_ms > 1
    assert "TPOT" in " ".join(result.rationale)
    assert result.rejected


def test_model_too_large_for_budget_is_infeasible():
    result = plan(request("llama-3.1-405b", gpu_budget=4, quantizations=("BF16", "FP8"),
                          tensor_parallel_sizes=(1, 2, 4)))
    assert not result.feasible
    assert "memory" in " ".join(result.rationale)
    assert all("memory" in r.reason or "tensor-parallel" in r.reason for r in result.rejected)


def test_budget_limits_replicas():
    heavy = Workload(1000, 4000, 200, 800, peak_requests_per_sec=200)
    unlimited = plan(request(workload=heavy))
    assert unlimited.feasible and unlimited.gpus_total > 2
    limited = plan(request(workload=heavy, gpu_budget=2))
    assert not limited.feasible and limited.gpus_total <= 2
    assert any("budget" in r.reason for r in limited.rejected) or "budget" in " ".join(limited.rationale)


def test_context_beyond_the_model_window():
    long = Workload(20000, 30000, 500, 4000, 1)
    result = plan(request("mistral-7b", workload=long))
    assert not result.feasible and "context window" in result.rationale[0]


def test_rejected_list_is_bounded_per_reason():
    result = plan(request("llama-3.1-70b", gpu_types=ALL_GPUS, quantizations=ALL_QUANT, kv_cache_dtypes=ALL_KV))
    assert len(result.rejected) <= 24
    classes = [r.reason.split(":")[0] for r in result.rejected]
    assert all(classes.count(c) <= 3 for c in set(classes))


def test_tables_render():
    text = format_plan_table(plan(request()))
    assert "rationale:" in text and "H100x1" in text
    assert "TPOT" in format_estimate_table(estimate("llama-3.1-8b", "H100-SXM-80GB", 1, "FP8", "FP8", 100, 100))


workloads = st.builds(
    lambda isl, isl_tail, osl, osl_tail, rps, prefix: Workload(isl, isl * isl_tail, osl, osl * osl_tail, rps, prefix),
    st.integers(16, 4000), st.floats(1, 5), st.integers(8, 1000), st.floats(1, 5), st.floats(0.1, 50),
    st.sampled_from([0.0, 0.5]))
models = st.sampled_from(["llama-3.1-8b", "mistral-7b", "mixtral-8x7b", "llama-3.1-70b", "qwen2.5-72b"])
gpu_sets = st.sampled_from([("H100-SXM-80GB",), ("H200-SXM-141GB", "L40S-48GB"), ("A100-SXM-80GB", "B200-180GB")])


def _space(gpus):
    return dict(gpu_types=gpus, quantizations=("BF16", "FP8", "INT8WeightOnly"), kv_cache_dtypes=("BF16", "FP8", "INT8"))


@settings(max_examples=40, deadline=None)
@given(models, workloads, st.floats(100, 5000), st.floats(10, 200), st.floats(0.3, 0.95), gpu_sets)
def test_tighter_slo_never_needs_fewer_gpus(model, workload, ttft, tpot, tighten, gpus):
    loose = plan(request(model, workload, ttft, tpot, **_space(gpus)))
    tight = plan(request(model, workload, ttft * tighten, tpot * tighten, **_space(gpus)))
    if loose.feasible and tight.feasible:
        assert tight.gpus_total >= loose.gpus_total
    if not loose.feasible:
        assert not tight.feasible


@settings(max_examples=40, deadline=None)
@given(models, workloads, st.floats(1.1, 4), gpu_sets)
def test_more_load_never_needs_fewer_gpus(model, workload, factor, gpus):
    light = plan(request(model, workload, 2000, 60, **_space(gpus)))
    heavier = Workload(workload.input_tokens_mean, workload.input_tokens_p99, workload.output_tokens_mean,
                       workload.output_tokens_p99, workload.peak_requests_per_sec * factor,
                       workload.prefix_sharing_fraction)
    heavy = plan(request(model, heavier, 2000, 60, **_space(gpus)))
    if light.feasible and heavy.feasible:
        assert heavy.gpus_total >= light.gpus_total


@settings(max_examples=40, deadline=None)
@given(models, workloads, gpu_sets)
def test_chosen_plan_shards_heads_and_fits_in_memory(model_name, workload, gpus):
    result = plan(request(model_name, workload, 3000, 80, **_space(gpus)))
    if not result.feasible:
        return
    model = CATALOG.model(model_name)
    tp = result.tensor_parallel_size
    assert model.num_attention_heads % tp == 0
    gpu = CATALOG.gpu(result.gpu_type)
    used = (weight_bytes_per_gpu(model, CATALOG.quantization(result.quantization), tp)
            + activation_bytes_per_gpu(model, tp, 8192, 256) + CATALOG.calibration.runtime_reserve_bytes)
    assert used < gpu.memory_bytes
    context = workload.input_tokens_p99 + workload.output_tokens_p99
    assert result.predicted.kv_capacity_tokens >= context
    assert result.predicted.max_concurrent_requests >= 1
