"""The release-record checks (llmfleet_dev.release_checks) on small synthetic records and configs.

Each test removes or breaks one thing a check exists for, so deleting that check fails a test. The checker
is deliberately not run on today's render output here (it reports known defects fixed in a later change).
"""

import re
from dataclasses import replace

import pytest

from llmfleet.catalog import load_catalog
from llmfleet.catalog.release_record import (
    CITATION, RUNTIME_RELEASES, ReleaseError, load_release_record, parse_record, release_for, release_requirement)
from llmfleet.render.pbtxt import Symbol, string_parameters, to_pbtxt
from llmfleet_dev.release_checks import (
    check_build_command, check_image_paths, check_metric, check_model_repository,
    check_quantize_command, check_tritonserver_command, read_pbtxt)

INT32, STRING = Symbol("TYPE_INT32"), Symbol("TYPE_STRING")

RAW = {
    "release": "test-1",
    "runtime": "engine",
    "image": {"name": "registry/triton:1-trtllm", "source": "test"},
    "image_paths": [
        {"path": "/app/models", "present": False, "source": "issue 1"},
        {"path": "/opt/tritonserver/bin/tritonserver", "present": True},
    ],
    "tritonserver": {"flags": ["--model-repository", "--http-port"]},
    "launcher": {"flags": ["--world_size"]},
    "models": {
        "tok": {
            "backend": "python",
            "parameters": [
                {"key": "tokenizer_dir", "read": "required", "type": "string"},
                {"key": "add_special_tokens", "read": "optional", "type": "bool_py"},
                {"key": "old_knob", "read": "refused", "type": "string", "note": "removed"},
            ],
            "inputs": [
                {"name": "QUERY", "data_type": "TYPE_STRING", "dims": [1], "optional": False, "required": True},
                {"name": "BIAS", "data_type": "TYPE_STRING", "dims": [-1], "optional": True, "required": True},
                {"name": "EXTRA", "data_type": "TYPE_INT32", "dims": [1], "optional": True},
            ],
            "outputs": [{"name": "IDS", "data_type": "TYPE_INT32", "dims": [-1], "required": True}],
        },
        "llm": {
            "backend": "tensorrtllm",
            "parameters": [
                {"key": "gpt_model_type", "read": "required", "type": "enum",
                 "choices": ["v1", "inflight_fused_batching"]},
                {"key": "enable_kv_cache_reuse", "read": "optional", "type": "bool_cpp"},
                {"key": "max_beam_width", "read": "optional", "type": "int"},
                {"key": "kv_cache_free_gpu_mem_fraction", "read": "optional", "type": "float"},
            ],
            "inputs": [{"name": "input_ids", "data_type": "TYPE_INT32", "dims": [-1], "optional": True}],
            "outputs": [{"name": "output_ids", "data_type": "TYPE_INT32", "dims": [-1, -1], "required": True}],
        },
        "ens": {"platform": "ensemble", "inputs": [
            {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
            "outputs": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}]},
    },
    "trtllm_build": {"flags": [{"name": "--checkpoint_dir"}, {"name": "--max_seq_len",
                                                              "aliases": ["--max_decoder_seq_len"]}],
                     "plugin_flags_established": True},
    "quantize": {"flags_established": True, "flags": ["--model_dir", "--qformat"],
                 "qformat_values": ["fp8", "full_prec"]},
    "metrics": {
        "common_labels": ["model", "version"],
        "families": [{"name": "nv_requests", "label": "request_type", "values": ["active", "max"]}],
        "triton_core": [{"name": "nv_ttft_ms", "labels": ["model", "version"]}],
    },
}


@pytest.fixture
def record():
    return parse_record(RAW)


def tok(**overrides):
    config = {
        "name": "tok",
        "backend": "python",
        "input": [
            {"name": "QUERY", "data_type": STRING, "dims": [1]},
            {"name": "BIAS", "data_type": STRING, "dims": [-1], "optional": True},
        ],
        "output": [{"name": "IDS", "data_type": INT32, "dims": [-1]}],
        "parameters": string_parameters({"tokenizer_dir": "/t", "add_special_tokens": "true"}),
    }
    config.update(overrides)
    return config


def llm(params=None, **overrides):
    config = {
        "name": "llm",
        "backend": "tensorrtllm",
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "input_ids", "data_type": INT32, "dims": [-1], "allow_ragged_batch": True}],
        "output": [{"name": "output_ids", "data_type": INT32, "dims": [-1, -1]}],
        "parameters": string_parameters(params if params is not None else {
            "gpt_model_type": "inflight_fused_batching", "enable_kv_cache_reuse": "true",
            "max_beam_width": "1", "kv_cache_free_gpu_mem_fraction": "0.9"}),
    }
    config.update(overrides)
    return config


def check(record, *configs):
    return check_model_repository(record, {f"{c['name']}/config.pbtxt": to_pbtxt(c) for c in configs})


def test_matching_repository_has_no_mismatch(record):
    assert check(record, tok(), llm()) == []


def test_pbtxt_reader_reads_what_the_writer_writes():
    config = llm()
    config["model_metrics"] = {"metric_control": [{"metric_identifier": {"family": "f"},
                                                   "histogram_options": {"buckets": [1.0, 2.5]}}]}
    parsed = read_pbtxt(to_pbtxt(config))
    assert parsed["name"] == "llm" and parsed["model_transaction_policy"] == [{"decoupled": True}]
    assert parsed["input"][0] == {"name": "input_ids", "data_type": "TYPE_INT32", "dims": [-1],
                                  "allow_ragged_batch": True}
    assert parsed["parameters"][0] == {"key": "gpt_model_type",
                                       "value": [{"string_value": "inflight_fused_batching"}]}
    assert parsed["model_metrics"][0]["metric_control"][0]["histogram_options"][0]["buckets"] == [1.0, 2.5]
    single = read_pbtxt(to_pbtxt({"name": "x", "input": [{"name": "a", "data_type": INT32, "dims": [1]}]}))
    assert single["input"] == [{"name": "a", "data_type": "TYPE_INT32", "dims": [1]}]


def test_required_parameter_missing(record):
    problems = check(record, tok(), llm({"max_beam_width": "1"}))
    assert any("required parameter 'gpt_model_type' missing" in p for p in problems)
    problems = check(record, tok(parameters=string_parameters({"add_special_tokens": "true"})))
    assert any("required parameter 'tokenizer_dir' missing" in p for p in problems)


def test_unknown_and_refused_parameters(record):
    params = {"tokenizer_dir": "/t", "tokeniser_dir": "/t", "old_knob": "x"}
    problems = check(record, tok(parameters=string_parameters(params)))
    assert any("unknown parameter 'tokeniser_dir'" in p for p in problems)
    assert any("parameter 'old_knob' is refused" in p for p in problems)


@pytest.mark.parametrize("key, value", [
    ("gpt_model_type", "inflight"),          # enum
    ("enable_kv_cache_reuse", "yes"),        # C++ bool accepts True/true/TRUE/1 and the false forms only
    ("max_beam_width", "1.5"),               # int
    ("kv_cache_free_gpu_mem_fraction", "most"),  # float
])
def test_wrong_parameter_type(record, key, value):
    params = {"gpt_model_type": "inflight_fused_batching", key: value}
    problems = check(record, llm(params))
    assert any(f"parameter {key!r} has the wrong type" in p for p in problems), problems


def test_python_bool_words_differ_from_cpp(record):
    assert check(record, tok(parameters=string_parameters({"tokenizer_dir": "/t",
                                                           "add_special_tokens": "yes"}))) == []
    problems = check(record, tok(parameters=string_parameters({"tokenizer_dir": "/t",
                                                               "add_special_tokens": "sure"})))
    assert any("'add_special_tokens' has the wrong type" in p for p in problems)


def test_tensor_missing_unknown_and_wrong_type(record):
    config = tok(input=[{"name": "QUERY", "data_type": INT32, "dims": [1]},
                        {"name": "SURPRISE", "data_type": STRING, "dims": [1]}], output=[])
    problems = check(record, config)
    assert any("input 'QUERY' has data_type TYPE_INT32, upstream TYPE_STRING" in p for p in problems)
    assert any("unknown input tensor 'SURPRISE'" in p for p in problems)
    assert any("input tensor 'BIAS' missing" in p for p in problems)
    assert any("output tensor 'IDS' missing" in p for p in problems)


def test_tensor_dims_and_optionality(record):
    config = tok(input=[{"name": "QUERY", "data_type": STRING, "dims": [-1], "optional": True},
                        {"name": "BIAS", "data_type": STRING, "dims": [-1], "optional": True}])
    problems = check(record, config)
    assert any("input 'QUERY' has dims [-1], upstream [1]" in p for p in problems)
    assert any("input 'QUERY' is optional here but the model needs it" in p for p in problems)
    # An optional upstream input may be left out.
    assert not any("EXTRA" in p for p in problems)


def test_backend_and_unknown_model(record):
    problems = check(record, tok(backend="tensorrtllm"), {"name": "mystery", "backend": "python"})
    assert any("tok: backend 'tensorrtllm', upstream 'python'" in p for p in problems)
    assert any("mystery: no such model" in p for p in problems)


def test_ensemble_steps_map_existing_tensors(record):
    ensemble = {"name": "ens", "platform": "ensemble",
                "input": [{"name": "text_input", "data_type": STRING, "dims": [1]}],
                "output": [{"name": "text_output", "data_type": STRING, "dims": [-1]}],
                "ensemble_scheduling": {"step": [{
                    "model_name": "tok", "model_version": -1,
                    "input_map": [{"key": "QUERY", "value": "text_input"}, {"key": "NOPE", "value": "x"}],
                    "output_map": [{"key": "IDS", "value": "_ids"}, {"key": "GONE", "value": "y"}]},
                    {"model_name": "absent", "model_version": -1, "input_map": [], "output_map": []}]}}
    problems = check(record, tok(), ensemble)
    assert any("maps unknown input 'NOPE'" in p for p in problems)
    assert any("maps unknown output 'GONE'" in p for p in problems)
    assert any("step model 'absent' is not in the repository" in p for p in problems)
    assert not any("QUERY" in p or "'IDS'" in p for p in problems)


def test_image_paths(record):
    problems = check_image_paths(record, ["/app/models/tok/1/model.py", "/opt/tritonserver/bin/tritonserver",
                                          "/usr/bin/other"])
    assert any("/app/models/tok/1/model.py does not exist" in p for p in problems)
    assert any("/usr/bin/other is not in the record" in p for p in problems)
    assert not any("tritonserver" in p for p in problems)


def test_build_flags(record):
    assert check_build_command(record, ["--checkpoint_dir", "/c", "--max_decoder_seq_len=8"]) == []
    problems = check_build_command(record, ["--checkpoint_dir", "/c", "--use_magic", "on"])
    assert problems == ["trtllm-build: unknown flag --use_magic"]
    incomplete = parse_record({**RAW, "trtllm_build": {**RAW["trtllm_build"], "plugin_flags_established": False}})
    assert "incomplete" in check_build_command(incomplete, ["--use_magic"])[0]


def test_quantize_and_tritonserver_flags(record):
    assert check_quantize_command(record, ["--model_dir", "--qformat"], qformat="fp8") == []
    assert check_quantize_command(record, ["--modeldir"]) == ["quantize.py: unknown flag --modeldir"]
    assert "not one of" in check_quantize_command(record, ["--qformat"], qformat="nvfp4")[0]
    unknown = parse_record({**RAW, "quantize": {"flags_established": False}})
    assert "not established" in check_quantize_command(unknown, ["--model_dir"])[0]
    assert check_tritonserver_command(record, ["--model-repository=/m", "--http-port=1"]) == []
    assert check_tritonserver_command(record, ["--grpc-port=2"]) == ["tritonserver: unknown flag --grpc-port"]


def test_metric_names_and_label_values(record):
    assert check_metric(record, "nv_requests", {"request_type": "active", "model": "llm"}) == []
    assert check_metric(record, "nv_ttft_ms_bucket", {"le": "100"}) == []
    assert "not exported" in check_metric(record, "nv_missing")[0]
    problems = check_metric(record, "nv_requests", {"request_type": "waiting"})
    assert problems and "request_type='waiting'" in problems[0]
    assert "no label" in check_metric(record, "nv_requests", {"phase": "x"})[0]


def test_packaged_record_loads_with_its_sources():
    record = load_release_record("engine-24.12")
    assert record.image == "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"
    assert set(record.models) == {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"}
    assert record.models["tensorrt_llm"].parameters["gpt_model_type"].read == "required"
    assert "waiting" not in record.metrics["nv_trt_llm_request_metrics"].labels["request_type"]
    for model in record.models.values():
        for parameter in model.parameters.values():
            assert parameter.source, (model.name, parameter.key)
    for path in record.image_paths:
        assert path.source, path.path


def test_the_engine_record_says_which_builds_calibrate_and_on_what():
    record = load_release_record("engine-24.12")
    calibration = record.calibration
    assert calibration.flag in record.quantize_flags
    # The default is the Hub's cnn_dailymail; a local directory is read as its train split's text column.
    assert (calibration.default, calibration.hub_dataset_marker) == ("cnn_dailymail", "cnn_dailymail")
    assert (calibration.local_split, calibration.local_text_column) == ("train", "text")
    for qformat in ("fp8", "int8_sq", "int4_awq", "w4a8_awq"):
        assert record.calibrates(qformat, None), qformat
    for qformat in ("full_prec", "int8_wo", "int4_wo"):
        assert not record.calibrates(qformat, None), qformat
        assert record.calibrates(qformat, "fp8") and record.calibrates(qformat, "int8"), qformat
    # The LLM-API runtime runs no quantize.py: nothing calibrates.
    assert load_release_record("llmapi-25.05").calibration is None
    assert not load_release_record("llmapi-25.05").calibrates("fp8", "fp8")


def test_a_calibration_fact_without_its_source_is_refused():
    raw = {**RAW, "quantize": {**RAW["quantize"], "calibration": {
        "flag": "--calib_dataset", "default": "cnn_dailymail", "hub_dataset_marker": "cnn_dailymail",
        "local_directory": {"split": "train", "text_column": "text"}, "uncalibrated_qformats": ["full_prec"],
        "default_source": "a@b:c", "loader_source": "a@b:c"}}}
    with pytest.raises(ValueError, match="quantize.calibration has no calibrates_source"):
        parse_record(raw)
    raw["quantize"]["calibration"]["calibrates_source"] = "a@b:c"
    assert parse_record(raw).calibrates("fp8", None) and not parse_record(raw).calibrates("full_prec", None)


def test_release_is_found_by_image_tag_whatever_the_registry():
    assert release_for("engine", None).release == "engine-24.12"
    assert release_for("llmapi", None).release == "llmapi-25.05"
    mirrored = release_for("engine", "registry.internal:5000/nvidia/tritonserver:24.12-trtllm-python-py3")
    assert mirrored.release == "engine-24.12"


@pytest.mark.parametrize("runtime, image, message", [
    ("engine", "nvcr.io/nvidia/tritonserver:23.10-trtllm-python-py3",
     "image tag '23.10-trtllm-python-py3' is not a pinned release: 24.12-trtllm-python-py3 (engine)"),
    ("llmapi", "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3",
     "image tag '24.12-trtllm-python-py3' has no llmapi runtime"),
    ("engine", "tritonserver", "image tag '(none)' is not a pinned release"),
])
def test_an_image_that_is_no_pinned_release_of_the_runtime_is_refused(runtime, image, message):
    with pytest.raises(ReleaseError, match=re.escape(message)):
        release_for(runtime, image)


def test_release_support_refuses_what_the_release_cannot_build():
    support = load_release_record("engine-24.12").support
    assert support.problem("H100-SXM-80GB", "FP8", "FP8", "r") is None
    assert support.problem("H100-SXM-80GB", "BF16", "BF16", "r") is None
    assert "does not support B200-180GB" in support.problem("B200-180GB", "FP8", "FP8", "r")
    assert "cannot serve NVFP4" in support.problem("H100-SXM-80GB", "NVFP4", "FP8", "r")
    assert support.problem("H100-SXM-80GB", "BF16", "FP8", "r") == "r builds a FP8 KV cache only with FP8 weights"
    assert support.problem("A100-SXM-80GB", "INT8WeightOnly", "INT8", "r") == (
        "r builds a INT8 KV cache only with no quantisation at all")


@pytest.mark.parametrize("release", sorted(RUNTIME_RELEASES.values()))
def test_the_quality_gate_requests_use_inputs_the_release_declares(release):
    from llmfleet.inference.golden import GREEDY_INPUTS, TEXT_OUTPUT
    from llmfleet.render.layout import REQUEST_MODEL

    record = load_release_record(release)
    model = record.models[REQUEST_MODEL[record.runtime]]
    assert set(GREEDY_INPUTS[model.name]) <= set(model.inputs)
    assert TEXT_OUTPUT in model.outputs


# --- which model architectures each pinned release runs (support.architectures) ----------------

CATALOG_MODELS = load_catalog().models


@pytest.mark.parametrize("release", sorted(RUNTIME_RELEASES.values()))
def test_every_architecture_entry_cites_its_source_at_a_tag_or_says_how_it_was_established(release):
    support = load_release_record(release).support
    entries = [*support.architecture_classes.values(), *support.architecture_features.values()]
    assert entries and support.tensorrt_llm_version
    for entry in entries:
        citations = list(CITATION.finditer(entry.source))
        assert citations, (release, entry.name, entry.source)
        for citation in citations:
            ref = citation.group("ref")
            # A ref is a release tag or a whole commit; a commit is a stored snapshot, not the tag.
            assert ref is None or re.fullmatch(r"v\d+\.\d+\.\d+|r\d+\.\d+|[0-9a-f]{40}", ref), (entry.name, ref)
            if ref is not None and re.fullmatch("[0-9a-f]{40}", ref):
                assert entry.established, (release, entry.name)
        if entry.served:
            assert entry.first_served_by is None
        else:
            assert tuple(map(int, entry.first_served_by.split("."))) > tuple(
                map(int, support.tensorrt_llm_version.split("."))), (release, entry.name)


@pytest.mark.parametrize("release", sorted(RUNTIME_RELEASES.values()))
def test_every_catalog_model_class_is_recorded_for_every_release(release):
    classes = load_release_record(release).support.architecture_classes
    assert {model.architecture_class for model in CATALOG_MODELS.values()} <= set(classes)


@pytest.mark.parametrize("release, model, context, needed", [
    ("llmapi-25.05", "llama-3.1-70b", 4096, None),
    ("llmapi-25.05", "deepseek-r1", 4096, None),
    ("llmapi-25.05", "llama-4-scout", 8192, None),  # within one chunk
    ("llmapi-25.05", "llama-4-scout", 8193, ("chunked_attention", "0.21.0")),
    ("llmapi-25.05", "qwen3-235b-a22b", 4096, ("Qwen3MoeForCausalLM", "0.20.0")),
    ("llmapi-25.05", "qwen3-32b", 4096, ("Qwen3ForCausalLM", "0.20.0")),
    ("llmapi-25.05", "gpt-oss-120b", 4096, ("GptOssForCausalLM", "1.1.0")),
    ("engine-24.12", "mixtral-8x7b", 4096, None),
    ("engine-24.12", "deepseek-r1", 4096, ("DeepseekV3ForCausalLM", "0.19.0")),
    ("engine-24.12", "llama-4-maverick", 4096, ("Llama4ForConditionalGeneration", "0.19.0")),
    # Both missing: the entry needing the newer release speaks.
    ("engine-24.12", "llama-4-maverick", 65536, ("chunked_attention", "0.21.0")),
    ("engine-24.12", "gpt-oss-20b", 4096, ("GptOssForCausalLM", "1.1.0")),
])
def test_which_release_runs_which_catalog_model(release, model, context, needed):
    record = load_release_record(release)
    requirement = release_requirement(release, record.support, CATALOG_MODELS[model], context)
    if needed is None:
        assert requirement is None
    else:
        assert (requirement.architecture, requirement.first_served_by) == needed
        assert requirement.message.startswith(f"{model} needs ")
        assert f"the pinned release {release} (TensorRT-LLM {record.support.tensorrt_llm_version}) cannot run it" in (
            requirement.message)


def test_an_inline_architecture_is_judged_by_its_attention_kinds():
    latent = replace(CATALOG_MODELS["deepseek-r1"], name="inline architecture", architecture_class="")
    sliding = replace(CATALOG_MODELS["gpt-oss-20b"], name="inline architecture", architecture_class="")
    llmapi = load_release_record("llmapi-25.05").support
    assert llmapi.unserved_architecture(latent, 4096) is None
    assert llmapi.unserved_architecture(sliding, 4096).name == "sliding_window_attention"
    assert load_release_record("engine-24.12").support.unserved_architecture(latent, 4096).name == "latent_attention"


def test_the_requirement_names_a_pinned_release_that_runs_the_model_or_the_release_to_pin():
    engine = load_release_record("engine-24.12")
    deepseek = release_requirement(engine.release, engine.support, CATALOG_MODELS["deepseek-r1"], 4096)
    assert deepseek.alternatives == (("llmapi-25.05", "0.19.0", "llmapi"),)
    assert "set spec.engine.runtime to llmapi (its pinned release llmapi-25.05, TensorRT-LLM 0.19.0, runs it" in (
        deepseek.message)
    llmapi = load_release_record("llmapi-25.05")
    gpt_oss = release_requirement(llmapi.release, llmapi.support, CATALOG_MODELS["gpt-oss-120b"], 4096)
    assert gpt_oss.alternatives == ()
    assert gpt_oss.message == (
        "gpt-oss-120b needs sliding-window attention with attention sinks on alternate layers and MXFP4 experts "
        "(GptOssForCausalLM), first served by TensorRT-LLM 1.1.0 (NVIDIA/TensorRT-LLM@"
        "001eaecea63dd6bdbfd02aed1bf8dc7fad567bd0:docs/source/release-notes.md); the pinned release llmapi-25.05 "
        "(TensorRT-LLM 0.19.0) cannot run it: pin a release with TensorRT-LLM 1.1.0 or newer in spec.engine.image "
        "once one is recorded; none pinned here runs it")


def _with_architecture_entry(**entry):
    raw = {**RAW, "versions": {"tensorrt_llm": {"value": "0.16.0"}},
           "support": {"architectures": {"classes": [{"class": "LlamaForCausalLM", "served": True, "needs": "Llama",
                                                      **entry}]}}}
    return parse_record(raw)


@pytest.mark.parametrize("entry, message", [
    ({"source": "read it somewhere"}, "source cites no"),
    ({"source": "NVIDIA/TensorRT-LLM@548b5b73106aaf7374955e1c37aad677678ebc7b:tensorrt_llm/models/__init__.py"},
     "say how it was established"),
    ({"source": "NVIDIA/TensorRT-LLM@v0.16.0:x.py", "served": False, "first_served_by": "0.15.0"},
     "first_served_by 0.15.0 is not newer than this release's 0.16.0"),
    ({"source": "NVIDIA/TensorRT-LLM@v0.16.0:x.py", "first_served_by": "0.19.0"}, "served here, so no first_served_by"),
])
def test_an_architecture_entry_without_a_well_formed_source_or_release_is_refused(entry, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _with_architecture_entry(**entry)
    assert _with_architecture_entry(source="NVIDIA/TensorRT-LLM@v0.16.0:tensorrt_llm/models/__init__.py"
                                    ).support.architecture_classes["LlamaForCausalLM"].served
