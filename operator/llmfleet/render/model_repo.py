"""The Triton model repository, rendered as one ConfigMap plus the volume items that lay it out.

ConfigMap keys cannot contain '/', so each file has a flat key (`tensorrt_llm.config.pbtxt`)
and the volume's `items` map keys back to paths (`tensorrt_llm/config.pbtxt`).

The inflight_batcher_llm layout (ensemble -> preprocessing -> tensorrt_llm -> postprocessing).
The pre/postprocessing `model.py` files ship in the Triton TensorRT-LLM image, not here: the pod
copies them in (see serving.py).
"""

from __future__ import annotations

from typing import Any

from llmfleet.api import LLMDeploymentSpec
from llmfleet.planner.types import SearchSpace
from llmfleet.render import layout
from llmfleet.render.identity import prefix_reuse_enabled
from llmfleet.render.pbtxt import Symbol, string_parameters, to_pbtxt
from llmfleet.render.ttft_buckets import deployment_ttft_bounds_ms

PREPROCESSING_MODEL = "preprocessing"
POSTPROCESSING_MODEL = "postprocessing"
VERSION = "1"
# Tokenisation runs per request on CPU; a few instances keep it off the TTFT path.
TOKENIZER_INSTANCE_COUNT = 4
# Every model needs a version directory; models without files in it get this placeholder.
VERSION_PLACEHOLDER = ".version"
# The planner sized the KV pool with this fraction; config.pbtxt tells the backend the same.
KV_CACHE_FREE_GPU_MEM_FRACTION = SearchSpace.kv_cache_free_gpu_mem_fraction
# The engine guarantees each admitted request its whole KV (as the planner assumes).
BATCH_SCHEDULER_POLICY = "guaranteed_no_evict"

INT32, BOOL, FP32, STRING, UINT64, INT64, FP16 = (Symbol(t) for t in (
    "TYPE_INT32", "TYPE_BOOL", "TYPE_FP32", "TYPE_STRING", "TYPE_UINT64", "TYPE_INT64", "TYPE_FP16"))
# The image's preprocessing model.py reads this in initialize() without a default; empty means
# a text-only model (catalog/releases/engine-24.12.yaml).
TEXT_ONLY_VISUAL_MODEL_PATH = ""


def tensor(name: str, data_type: Symbol, dims: list[int], *, optional: bool = False,
            **extra: Any) -> dict[str, Any]:
    tensor = {"name": name, "data_type": data_type, "dims": dims, **extra}
    if optional:
        tensor["optional"] = True
    return tensor


def _scalar_input(name: str, data_type: Symbol, *, optional: bool = False) -> dict[str, Any]:
    return tensor(name, data_type, [1], optional=optional)


def cpu_instances(count: int) -> list[dict[str, Any]]:
    return [{"count": count, "kind": Symbol("KIND_CPU")}]


def ttft_histogram(spec: LLMDeploymentSpec) -> dict[str, Any]:
    """The TTFT histogram's buckets, the deployment's own (render.ttft_buckets)."""
    return {"metric_control": [{
        "metric_identifier": {"family": layout.TTFT_HISTOGRAM},
        "histogram_options": {"buckets": [float(b) for b in deployment_ttft_bounds_ms(spec)]},
    }]}


# Client-facing tensors of the ensemble.
CLIENT_INPUTS = (
    _scalar_input("text_input", STRING),
    _scalar_input("max_tokens", INT32),
    _scalar_input("stream", BOOL, optional=True),
)
CLIENT_OUTPUT = tensor("text_output", STRING, [-1])


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> dict[str, Any]:
    return {
        "model_name": model,
        "model_version": -1,
        "input_map": [{"key": key, "value": value} for key, value in inputs.items()],
        "output_map": [{"key": key, "value": value} for key, value in outputs.items()],
    }


def _ensemble(max_batch_size: int, extra_inputs: tuple[dict[str, Any], ...],
              steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": layout.ENSEMBLE_MODEL,
        "platform": "ensemble",
        "max_batch_size": max_batch_size,
        "input": [*CLIENT_INPUTS, *extra_inputs],
        "output": [CLIENT_OUTPUT],
        "ensemble_scheduling": {"step": steps},
    }


def _models(spec: LLMDeploymentSpec, engine_cache_key: str) -> dict[str, dict[str, Any]]:
    max_batch_size = spec.engine.max_batch_size
    tokenizer_dir = layout.tokenizer_dir(engine_cache_key)
    sampling_inputs = (
        _scalar_input("end_id", INT32, optional=True),
        _scalar_input("pad_id", INT32, optional=True),
        tensor("bad_words", STRING, [-1], optional=True),
        tensor("stop_words", STRING, [-1], optional=True),
        _scalar_input("temperature", FP32, optional=True),
        _scalar_input("top_k", INT32, optional=True),
        _scalar_input("top_p", FP32, optional=True),
    )
    ensemble = _ensemble(max_batch_size, sampling_inputs, [
        _step(PREPROCESSING_MODEL,
              {"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "BAD_WORDS_DICT": "bad_words",
               "STOP_WORDS_DICT": "stop_words", "END_ID": "end_id", "PAD_ID": "pad_id"},
              {"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
               "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
               "STOP_WORDS_IDS": "_STOP_WORDS_IDS", "OUT_END_ID": "_END_ID", "OUT_PAD_ID": "_PAD_ID"}),
        _step(layout.TENSORRT_LLM_MODEL,
              {"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
               "request_output_len": "_REQUEST_OUTPUT_LEN", "end_id": "_END_ID", "pad_id": "_PAD_ID",
               "bad_words_list": "_BAD_WORDS_IDS", "stop_words_list": "_STOP_WORDS_IDS",
               "temperature": "temperature", "runtime_top_k": "top_k", "runtime_top_p": "top_p",
               "streaming": "stream"},
              {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}),
        _step(POSTPROCESSING_MODEL,
              {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
              {"OUTPUT": "text_output"}),
    ])
    preprocessing = {
        "name": PREPROCESSING_MODEL,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": [
            _scalar_input("QUERY", STRING),
            _scalar_input("REQUEST_OUTPUT_LEN", INT32),
            tensor("BAD_WORDS_DICT", STRING, [-1], optional=True),
            tensor("STOP_WORDS_DICT", STRING, [-1], optional=True),
            tensor("EMBEDDING_BIAS_WORDS", STRING, [-1], optional=True),
            tensor("EMBEDDING_BIAS_WEIGHTS", FP32, [-1], optional=True),
            _scalar_input("END_ID", INT32, optional=True),
            _scalar_input("PAD_ID", INT32, optional=True),
        ],
        # Every tensor the image's preprocessing model.py reads the config of, used or not.
        "output": [
            tensor("INPUT_ID", INT32, [-1]),
            tensor("REQUEST_INPUT_LEN", INT32, [1]),
            tensor("DECODER_INPUT_ID", INT32, [-1]),
            tensor("REQUEST_DECODER_INPUT_LEN", INT32, [1]),
            tensor("BAD_WORDS_IDS", INT32, [2, -1]),
            tensor("STOP_WORDS_IDS", INT32, [2, -1]),
            tensor("EMBEDDING_BIAS", FP32, [-1]),
            tensor("REQUEST_OUTPUT_LEN", INT32, [-1]),
            tensor("OUT_END_ID", INT32, [1]),
            tensor("OUT_PAD_ID", INT32, [1]),
            # Multimodal outputs: unused for text, but initialize() reads their configs.
            tensor("OUT_PROMPT_TABLE_EXTRA_IDS", UINT64, [-1]),
            tensor("PIXEL_VALUES", FP16, [-1, -1, -1, -1]),
            tensor("IMAGE_SIZES", INT64, [2]),
        ],
        "parameters": string_parameters({"tokenizer_dir": tokenizer_dir, "add_special_tokens": "true",
                                         "visual_model_path": TEXT_ONLY_VISUAL_MODEL_PATH}),
        "instance_group": cpu_instances(TOKENIZER_INSTANCE_COUNT),
    }
    scalar_reshape = {"reshape": {"shape": []}}
    tensorrt_llm = {
        "name": layout.TENSORRT_LLM_MODEL,
        "backend": "tensorrtllm",
        "max_batch_size": max_batch_size,
        "model_transaction_policy": {"decoupled": True},
        "dynamic_batching": {"preferred_batch_size": [max_batch_size], "max_queue_delay_microseconds": 0},
        "input": [
            tensor("input_ids", INT32, [-1], allow_ragged_batch=True),
            tensor("input_lengths", INT32, [1], **scalar_reshape),
            tensor("request_output_len", INT32, [1]),
            tensor("end_id", INT32, [1], optional=True, **scalar_reshape),
            tensor("pad_id", INT32, [1], optional=True, **scalar_reshape),
            tensor("bad_words_list", INT32, [2, -1], optional=True, allow_ragged_batch=True),
            tensor("stop_words_list", INT32, [2, -1], optional=True, allow_ragged_batch=True),
            tensor("temperature", FP32, [1], optional=True, **scalar_reshape),
            tensor("runtime_top_k", INT32, [1], optional=True, **scalar_reshape),
            tensor("runtime_top_p", FP32, [1], optional=True, **scalar_reshape),
            tensor("streaming", BOOL, [1], optional=True),
        ],
        "output": [tensor("output_ids", INT32, [-1, -1]), tensor("sequence_length", INT32, [-1])],
        "instance_group": cpu_instances(1),
        "parameters": string_parameters({
            "gpt_model_type": "inflight_fused_batching",
            "gpt_model_path": layout.engine_dir(engine_cache_key),
            "max_beam_width": "1",
            "batch_scheduler_policy": BATCH_SCHEDULER_POLICY,
            "kv_cache_free_gpu_mem_fraction": str(KV_CACHE_FREE_GPU_MEM_FRACTION),
            "enable_kv_cache_reuse": str(prefix_reuse_enabled(spec)).lower(),
            # The planner's prefill model chunks long prompts by max_num_tokens.
            "enable_chunked_context": "true",
            "exclude_input_in_output": "true",
        }),
        "model_metrics": ttft_histogram(spec),
    }
    postprocessing = {
        "name": POSTPROCESSING_MODEL,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": [tensor("TOKENS_BATCH", INT32, [-1, -1]), tensor("SEQUENCE_LENGTH", INT32, [-1])],
        "output": [tensor("OUTPUT", STRING, [-1])],
        "parameters": string_parameters({"tokenizer_dir": tokenizer_dir, "skip_special_tokens": "true"}),
        "instance_group": cpu_instances(TOKENIZER_INSTANCE_COUNT),
    }
    return {layout.ENSEMBLE_MODEL: ensemble, PREPROCESSING_MODEL: preprocessing,
            layout.TENSORRT_LLM_MODEL: tensorrt_llm, POSTPROCESSING_MODEL: postprocessing}


def model_repository_files(spec: LLMDeploymentSpec, engine_cache_key: str) -> dict[str, str]:
    """Repository-relative path -> file content, in a fixed order."""
    files = {}
    for name, config in _models(spec, engine_cache_key).items():
        files[f"{name}/config.pbtxt"] = to_pbtxt(config)
        files[f"{name}/{VERSION}/{VERSION_PLACEHOLDER}"] = f"version {VERSION} of {name}\n"
    return files


def config_map_key(path: str) -> str:
    return path.replace("/", ".")


def volume_items(files: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": config_map_key(path), "path": path} for path in files]
