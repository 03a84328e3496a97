import csv
import dataclasses
import re

import pytest

from llmfleet.api import CatalogModel
from llmfleet.catalog import KV_CACHE_DTYPES, QUANTIZATIONS, load_catalog, model_from_numbers

CSV_NAMES = {
    "Llama-3.1-8B": "llama-3.1-8b", "Llama-3.1-70B": "llama-3.1-70b", "Llama-3.1-405B": "llama-3.1-405b",
    "Mistral-7B-v0.1": "mistral-7b", "Mixtral-8x7B-v0.1": "mixtral-8x7b", "Qwen2.5-72B(-Instruct)": "qwen2.5-72b",
}


# The 2025 open models of issue 28, with their derived parameter counts (billions, total and
# active), as quoted in each catalog entry's source line.
ISSUE_28_MODELS = {
    "deepseek-v3": (671.03, 37.55), "deepseek-r1": (671.03, 37.55), "qwen3-235b-a22b": (235.09, 22.19),
    "qwen3-30b-a3b": (30.53, 3.35), "qwen3-32b": (32.76, 32.76), "llama-4-scout": (107.77, 17.17),
    "llama-4-maverick": (400.71, 17.18), "gpt-oss-20b": (20.91, 4.19), "gpt-oss-120b": (116.79, 5.71),
}


def test_catalog_has_the_issue_entries():
    catalog = load_catalog()
    assert set(catalog.gpus) == {"H100-SXM-80GB", "H200-SXM-141GB", "B200-180GB", "A100-SXM-80GB", "L40S-48GB"}
    assert set(catalog.models) == set(CSV_NAMES.values()) | set(ISSUE_28_MODELS)
    assert tuple(catalog.quantizations) == QUANTIZATIONS
    assert tuple(catalog.kv_cache_dtypes) == KV_CACHE_DTYPES


def test_every_entry_cites_a_source():
    catalog = load_catalog()
    entries = [*catalog.gpus.values(), *catalog.models.values(), *catalog.quantizations.values(),
               *catalog.kv_cache_dtypes.values(), catalog.calibration]
    assert all(len(entry.source.strip()) > 10 for entry in entries)


def test_trtllm_flag_values():
    catalog = load_catalog()
    assert {q.name: q.qformat for q in catalog.quantizations.values()} == {
        "BF16": "full_prec", "FP16": "full_prec", "FP8": "fp8", "INT8WeightOnly": "int8_wo",
        "INT4AWQ": "int4_awq", "INT8SmoothQuant": "int8_sq", "NVFP4": "nvfp4"}
    assert catalog.kv_cache_dtype("FP8").kv_cache_dtype_flag == "fp8"
    assert catalog.kv_cache_dtype("INT8").kv_cache_dtype_flag == "int8"


def test_gpu_limits_match_reference_numbers():
    h100 = load_catalog().gpu("H100-SXM-80GB")
    assert h100.memory_bytes == 80 * 2**30
    assert h100.memory_bandwidth_bytes_per_sec == 3.35e12
    assert h100.dense_tflops["bf16"] == 989 and h100.dense_tflops["fp8"] == 1978
    assert h100.gfd_product == "NVIDIA-H100-80GB-HBM3"
    assert "FP8" not in load_catalog().gpu("A100-SXM-80GB").supported_quantizations
    assert "NVFP4" in load_catalog().gpu("B200-180GB").supported_quantizations


def test_models_match_reference_table_and_its_parameter_counts(shared_reference):
    catalog = load_catalog()
    with (shared_reference / "model_arch.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(row["model"] for row in rows) == sorted(CSV_NAMES)
    for row in rows:
        model = catalog.model(CSV_NAMES[row["model"]])
        assert model.num_layers == int(row["num_hidden_layers"])
        assert model.hidden_size == int(row["hidden_size"])
        assert model.num_attention_heads == int(row["num_attention_heads"])
        assert model.num_kv_heads == int(row["num_key_value_heads"])
        assert model.head_dim == int(row["head_dim"])
        assert model.vocab_size == int(row["vocab_size"])
        # The table's parameter counts were derived independently: agree to its 2 decimals.
        assert model.total_params / 1e9 == pytest.approx(float(row["derived_total_params_B"]), abs=0.01)
        assert model.active_params / 1e9 == pytest.approx(float(row["derived_active_params_B"]), abs=0.01)


def test_inline_model_defaults_head_dim_and_validates():
    model = model_from_numbers(name="tiny", num_layers=2, hidden_size=256, num_attention_heads=4,
                               num_kv_heads=2, intermediate_size=512, vocab_size=1000)
    assert model.head_dim == 64
    with pytest.raises(ValueError, match="multiple of KV heads"):
        model_from_numbers(name="bad", num_layers=2, hidden_size=256, num_attention_heads=4,
                           num_kv_heads=3, intermediate_size=512, vocab_size=1000)
    with pytest.raises(ValueError, match="positive"):
        model_from_numbers(name="bad", num_layers=0, hidden_size=256, num_attention_heads=4,
                           num_kv_heads=2, intermediate_size=512, vocab_size=1000)


def test_catalog_is_immutable():
    gpu = load_catalog().gpu("H100-SXM-80GB")
    with pytest.raises(AttributeError):
        gpu.memory_bytes = 1
    with pytest.raises(KeyError, match="known"):
        load_catalog().gpu("H800")


@pytest.mark.parametrize("scales, problem", [({"tp1": 0.9}, "keys are 'tp<N>' with N >= 2"),
                                             ({"four": 0.9}, "keys are 'tp<N>' with N >= 2"),
                                             ({"tp4": 0}, "tensor_parallel_scales.tp4 must be a positive number")])
def test_tensor_parallel_scales_name_a_tp_size_and_a_positive_multiplier(scales, problem):
    calibration = load_catalog().calibration
    with pytest.raises(ValueError, match=re.escape(problem)):
        dataclasses.replace(calibration, tensor_parallel_scales=scales)
    fitted = dataclasses.replace(calibration, tensor_parallel_scales={"tp4": 0.9})
    assert (fitted.tensor_parallel_scale(4), fitted.tensor_parallel_scale(1), fitted.tensor_parallel_scale(16)) == (
        0.9, 1.0, 1.0)


def test_catalog_models_are_the_api_enum():
    assert set(load_catalog().models) == {model.value for model in CatalogModel}


@pytest.mark.parametrize("name", sorted(ISSUE_28_MODELS))
def test_new_models_reproduce_the_counts_quoted_in_their_source(name):
    model = load_catalog().model(name)
    total_billions, active_billions = ISSUE_28_MODELS[name]
    assert model.total_params / 1e9 == pytest.approx(total_billions, abs=0.005)
    assert model.active_params / 1e9 == pytest.approx(active_billions, abs=0.005)
    assert f"{total_billions:.2f} B" in " ".join(model.source.split())


def test_deepseek_v3_matches_its_published_totals():
    # deepseek-ai/DeepSeek-V3 README: 671 B total, 37 B activated per token (the MTP module apart).
    model = load_catalog().model("deepseek-v3")
    assert round(model.total_params / 1e9) == 671
    # "Activated" counts the weights a token multiplies by; the embedding table is a lookup.
    assert round((model.active_params - model.embedding_params) / 1e9) == 37
