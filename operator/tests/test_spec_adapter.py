"""spec -> PlanRequest and Plan -> status.plan: every API field reaches the planner, results fit the API."""

import ast
import copy
from pathlib import Path

import pytest
import yaml
from llmfleet.api import (
    MAX_RATIONALE_LINES,
    MAX_REJECTED_OPTIONS,
    InvalidSpecError,
    LLMDeployment,
    LLMDeploymentStatus,
    ModelArchitecture,
)
from llmfleet.catalog import load_catalog
from llmfleet.planner import Plan, RejectedOption, plan, spec_adapter
from llmfleet.planner.spec_adapter import (
    model_arch_from_architecture,
    plan_request_from_spec,
    plan_status_from_plan,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-8b.yaml"
CATALOG = load_catalog()
ALL_QUANTIZATIONS = ("BF16", "FP16", "FP8", "INT8WeightOnly", "INT4AWQ", "INT8SmoothQuant", "NVFP4")
LLAMA_8B_ARCHITECTURE = {
    "numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 8, "headDim": 128,
    "vocabSize": 128256, "intermediateSize": 14336, "parameterCountBillions": 8.03,
}


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def minimal() -> dict:
    manifest = example()
    spec = manifest["spec"]
    for optional in ("engine", "resources", "autoscaling", "rollout"):
        spec.pop(optional)
    spec["model"] = {"name": "llama-3.1-8b"}
    spec["slo"].pop("quality")
    spec["workload"].pop("prefixSharingFraction")
    return manifest


def on_engine_runtime(manifest: dict) -> dict:
    """The manifest served by the engine runtime, whose release builds every catalog format."""
    return with_changes(manifest, engine={"runtime": "engine"})


def spec_of(manifest: dict):
    return LLMDeployment.from_manifest(manifest).spec


def with_changes(manifest: dict, **sections) -> dict:
    changed = copy.deepcopy(manifest)
    changed["spec"].update(sections)
    return changed


def test_example_maps_every_field():
    request = plan_request_from_spec(spec_of(example()))
    assert request.model == CATALOG.model("llama-3.1-8b")
    w = request.workload
    assert (w.input_tokens_mean, w.input_tokens_p99, w.output_tokens_mean, w.output_tokens_p99) == (1024, 3072, 256, 1024)
    assert (w.peak_requests_per_sec, w.prefix_sharing_fraction) == (4, 0.2)
    assert (request.slo.ttft_p99_ms, request.slo.tpot_p99_ms, request.slo.max_quality_loss_percent) == (500, 50, 1.0)
    space = request.space
    assert space.gpu_types == ("H100-SXM-80GB", "H200-SXM-141GB", "A100-SXM-80GB", "L40S-48GB")
    assert space.tensor_parallel_sizes == (1, 2, 4)
    assert space.gpu_budget == 8
    assert (space.max_batch_size, space.max_num_tokens) == (256, 8192)  # engine defaults


def test_omitted_limits_allow_every_catalog_value_but_lossy_formats():
    space = plan_request_from_spec(spec_of(minimal())).space
    assert space.gpu_types == tuple(CATALOG.gpus)
    assert space.tensor_parallel_sizes == (1, 2, 4, 8)
    # No quality budget: only the formats the catalog calls near-lossless.
    assert space.quantizations == ("BF16", "FP16", "FP8")
    assert space.kv_cache_dtypes == ("BF16", "FP16", "FP8", "INT8")
    assert space.gpu_budget is None
    assert (space.pinned_gpu_type, space.pinned_tensor_parallel_size, space.pinned_quantization,
            space.pinned_kv_cache_dtype, space.pinned_replicas) == (None,) * 5


def test_engine_build_limits_bound_the_engine():
    manifest = with_changes(minimal(), engine={"maxBatchSize": 64, "maxNumTokens": 4096})
    space = plan_request_from_spec(spec_of(manifest)).space
    assert (space.max_batch_size, space.max_num_tokens) == (64, 4096)
    assert plan(plan_request_from_spec(spec_of(manifest))).predicted.max_concurrent_requests <= 64


def test_quality_budget_intersects_the_allowed_quantizations():
    manifest = on_engine_runtime(minimal())
    manifest["spec"]["resources"] = {"allowedQuantizations": ["BF16", "FP8", "INT4AWQ"]}
    manifest["spec"]["slo"]["quality"] = {"allowedQuantizations": ["NVFP4", "INT4AWQ", "FP8"]}
    request = plan_request_from_spec(spec_of(manifest))
    assert request.space.quantizations == ("FP8", "INT4AWQ")
    result = plan(request)
    assert result.feasible and result.quantization in ("FP8", "INT4AWQ")
    considered = {r.option.split()[2] for r in result.rejected}
    assert considered <= {"FP8", "INT4AWQ"}


def test_quality_loss_budget_excludes_lossy_formats():
    manifest = on_engine_runtime(minimal())
    manifest["spec"]["slo"]["quality"] = {"maxQualityLossPercent": 0.0}
    request = plan_request_from_spec(spec_of(manifest))
    assert request.slo.max_quality_loss_percent == 0.0
    result = plan(request)
    assert result.feasible and result.quantization in ("BF16", "FP16") and result.kv_cache_dtype in ("BF16", "FP16")
    assert any(r.reason.startswith("quality:") for r in result.rejected)


def test_a_quality_budget_opens_the_lossy_formats_and_a_pin_is_the_users_choice():
    manifest = minimal()
    manifest["spec"]["slo"]["quality"] = {"maxQualityLossPercent": 10}
    assert plan_request_from_spec(spec_of(manifest)).space.quantizations == ALL_QUANTIZATIONS
    pinned = on_engine_runtime(minimal())
    pinned["spec"]["plan"] = {"quantization": "INT4AWQ"}
    assert "INT4AWQ" in plan_request_from_spec(spec_of(pinned)).space.quantizations


def test_only_lossy_formats_allowed_without_a_budget_names_the_fix():
    manifest = minimal()
    manifest["spec"]["resources"] = {"allowedQuantizations": ["INT4AWQ", "NVFP4"]}
    with pytest.raises(InvalidSpecError) as error:
        plan_request_from_spec(spec_of(manifest))
    ((field, message),) = error.value.problems
    assert field == "spec.resources.allowedQuantizations"
    assert "INT4AWQ, NVFP4" in message and "BF16, FP16, FP8" in message and "maxQualityLossPercent" in message


def test_no_quantization_in_both_lists_names_the_field():
    manifest = minimal()
    manifest["spec"]["resources"] = {"allowedQuantizations": ["BF16"]}
    manifest["spec"]["slo"]["quality"] = {"allowedQuantizations": ["FP8"]}
    with pytest.raises(InvalidSpecError) as raised:
        plan_request_from_spec(spec_of(manifest))
    [(path, message)] = raised.value.problems
    assert path == "spec.slo.quality.allowedQuantizations"
    assert "spec.resources.allowedQuantizations" in message and "allow at least one" in message


def test_the_serving_release_limits_the_search():
    assert plan_request_from_spec(spec_of(minimal())).space.release == "llmapi-25.05"
    engine = plan_request_from_spec(spec_of(on_engine_runtime(minimal())))
    assert engine.space.release == "engine-24.12"
    result = plan(engine)
    assert result.feasible and result.gpu_type != "B200-180GB"


def test_an_image_that_is_no_pinned_release_names_the_field():
    manifest = with_changes(minimal(), engine={"image": "nvcr.io/nvidia/tritonserver:23.10-trtllm-python-py3"})
    with pytest.raises(InvalidSpecError) as raised:
        plan_request_from_spec(spec_of(manifest))
    [(path, message)] = raised.value.problems
    assert path == "spec.engine.image" and "not a pinned release" in message


def test_pins_are_honoured():
    pins = {"gpuType": "H100-SXM-80GB", "tensorParallelSize": 2, "quantization": "FP8", "kvCacheDtype": "FP8",
            "replicas": 3}
    request = plan_request_from_spec(spec_of(with_changes(on_engine_runtime(minimal()), plan=pins)))
    space = request.space
    assert (space.pinned_gpu_type, space.pinned_tensor_parallel_size, space.pinned_quantization,
            space.pinned_kv_cache_dtype, space.pinned_replicas) == ("H100-SXM-80GB", 2, "FP8", "FP8", 3)
    result = plan(request)
    assert (result.gpu_type, result.tensor_parallel_size, result.quantization, result.kv_cache_dtype,
            result.replicas) == ("H100-SXM-80GB", 2, "FP8", "FP8", 3)


def test_zero_replicas_still_plans_the_configuration():
    request = plan_request_from_spec(spec_of(with_changes(minimal(), plan={"replicas": 0})))
    assert request.space.pinned_replicas is None
    assert plan(request).feasible


def test_full_prefix_sharing_still_prefills_the_last_prompt_token():
    manifest = minimal()
    manifest["spec"]["workload"]["prefixSharingFraction"] = 1.0
    workload = plan_request_from_spec(spec_of(manifest)).workload
    assert workload.prefix_sharing_fraction == pytest.approx(1 - 1 / 1024)


def test_inline_architecture_is_the_catalog_model_when_the_numbers_match():
    manifest = with_changes(minimal(), model={"architecture": LLAMA_8B_ARCHITECTURE})
    manifest["spec"]["engine"] = {"maxSeqLen": 16384, "maxInputLen": 8192}
    model = plan_request_from_spec(spec_of(manifest)).model
    catalog_model = CATALOG.model("llama-3.1-8b")
    assert model.total_params == catalog_model.total_params
    assert (model.num_experts, model.experts_per_token, model.tie_word_embeddings) == (1, 1, False)
    # The API has no context-window field: the engine's maxSeqLen is the window planned for.
    assert model.max_position_embeddings == 16384


def test_inline_parameter_count_decides_whether_embeddings_are_tied():
    manifest = with_changes(minimal(), model={"architecture": LLAMA_8B_ARCHITECTURE})
    untied = spec_of(manifest).model.architecture
    tied_count = (CATALOG.model("llama-3.1-8b").total_params - 128256 * 4096) / 1e9
    tied = untied.model_copy(update={"parameter_count_billions": tied_count})
    assert model_arch_from_architecture(tied).tie_word_embeddings
    assert not model_arch_from_architecture(untied).tie_word_embeddings


def test_inline_mixture_of_experts_keeps_its_routing():
    mixtral = CATALOG.model("mixtral-8x7b")
    architecture = {
        "numLayers": mixtral.num_layers, "hiddenSize": mixtral.hidden_size,
        "numAttentionHeads": mixtral.num_attention_heads, "numKvHeads": mixtral.num_kv_heads,
        "headDim": mixtral.head_dim, "vocabSize": mixtral.vocab_size, "intermediateSize": mixtral.intermediate_size,
        "parameterCountBillions": mixtral.total_params / 1e9, "numExperts": 8, "expertsPerToken": 2,
    }
    model = plan_request_from_spec(spec_of(with_changes(minimal(), model={"architecture": architecture}))).model
    assert (model.num_experts, model.experts_per_token) == (8, 2)
    assert model.total_params == mixtral.total_params and model.active_params == mixtral.active_params


def test_feasible_plan_becomes_status_plan():
    result = plan(plan_request_from_spec(spec_of(example())))
    status = plan_status_from_plan(result)
    assert result.feasible
    assert (status.gpu_type.value, status.tensor_parallel_size, status.pipeline_parallel_size,
            status.quantization.value, status.kv_cache_dtype.value, status.replicas, status.gpus_total) == (
        result.gpu_type, result.tensor_parallel_size, 1, result.quantization, result.kv_cache_dtype,
        result.replicas, result.gpus_total)
    assert status.summary == result.summary
    assert status.summary.split()[1] == result.quantization and "x" in status.summary.split()[0]
    assert status.predicted.kv_bytes_per_token == result.predicted.kv_bytes_per_token
    assert status.predicted.ttft_p99_ms == result.predicted.ttft_p99_ms <= 500
    assert status.rationale == list(result.rationale)
    assert [(r.option, r.reason) for r in status.rejected] == [(r.option, r.reason) for r in result.rejected]
    # It is a valid part of the status object the operator patches.
    body = LLMDeploymentStatus(plan=status).model_dump(mode="json", exclude_none=True)
    assert body["plan"]["summary"] == result.summary and body["plan"]["predicted"]["kvBytesPerToken"] == 65536


def test_infeasible_plan_lists_the_closest_option_first_and_serves_nothing():
    manifest = with_changes(minimal(), model={"name": "llama-3.1-405b"}, resources={"gpuBudget": 1})
    result = plan(plan_request_from_spec(spec_of(manifest)))
    status = plan_status_from_plan(result)
    assert not result.feasible
    assert (status.gpu_type, status.replicas, status.summary, status.predicted) == (None, None, None, None)
    closest = status.rejected[0]
    assert closest.option.startswith(f"{result.gpu_type} TP{result.tensor_parallel_size} {result.quantization}")
    assert closest.reason in result.rationale
    assert [r.option for r in status.rejected].count(closest.option) == 1
    assert status.rationale == list(result.rationale)


def test_slo_miss_names_the_closest_option_and_its_shortfall():
    manifest = with_changes(minimal(), resources={"gpuBudget": 1})
    manifest["spec"]["slo"].update(ttftP99Ms=1, tpotP99Ms=1)
    result = plan(plan_request_from_spec(spec_of(manifest)))
    closest = plan_status_from_plan(result).rejected[0]
    assert not result.feasible and closest.option.endswith("x1 replicas")
    assert "infeasible; closest option" in closest.reason and "p99 TTFT" in closest.reason


def test_status_plan_stays_within_the_api_limits():
    long_line = "x" * 5000
    oversized = Plan(
        feasible=True, gpu_type="H100-SXM-80GB", tensor_parallel_size=1, quantization="FP8", kv_cache_dtype="FP8",
        replicas=1, predicted=plan(plan_request_from_spec(spec_of(minimal()))).predicted,
        rationale=tuple(f"{i} {long_line}" for i in range(MAX_RATIONALE_LINES + 10)),
        rejected=tuple(RejectedOption(option=f"{i} {long_line}", reason=long_line)
                       for i in range(MAX_REJECTED_OPTIONS + 10)),
    )
    status = plan_status_from_plan(oversized)
    assert len(status.rationale) == MAX_RATIONALE_LINES and status.rationale[0].startswith("0 ")
    assert max(len(line) for line in status.rationale) == 1024 and status.rationale[0].endswith("...")
    assert len(status.rejected) == MAX_REJECTED_OPTIONS
    assert max(len(r.option) for r in status.rejected) == 256 and max(len(r.reason) for r in status.rejected) == 1024


def test_adapter_imports_only_pure_modules():
    allowed = ("__future__", "collections.abc", "llmfleet.api", "llmfleet.catalog", "llmfleet.planner")
    for node in ast.walk(ast.parse(Path(spec_adapter.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.module.startswith(allowed), node.module
        assert not isinstance(node, ast.Import), ast.unparse(node)


def test_inline_architecture_kinds_reach_the_planner_as_the_catalog_spells_them():
    maverick = ModelArchitecture.model_validate({
        "numLayers": 48, "hiddenSize": 5120, "numAttentionHeads": 40, "numKvHeads": 8, "headDim": 128,
        "vocabSize": 202048, "intermediateSize": 16384, "parameterCountBillions": 400.71, "numExperts": 128,
        "expertsPerToken": 1, "numSharedExperts": 1, "expertIntermediateSize": 8192, "moeLayerInterval": 2,
        "localAttention": {"kind": "Chunked", "windowTokens": 8192, "fullAttentionLayerInterval": 4},
    })
    inline = model_arch_from_architecture(maverick)
    catalog = CATALOG.model("llama-4-maverick")
    assert (inline.local_attention_kind, inline.local_attention_window_tokens) == ("chunked", 8192)
    assert inline.total_params == catalog.total_params and inline.active_params == catalog.active_params
