"""Fixed names, ports and paths shared by the rendered objects."""

from __future__ import annotations

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002

MODEL_REPOSITORY_PATH = "/models"
ENGINE_CACHE_PATH = "/engines"
SCRATCH_PATH = "/scratch"
TMP_PATH = "/tmp"
SHM_PATH = "/dev/shm"
MODEL_TOKEN_PATH = "/var/run/secrets/llmfleet/model-token"
MODEL_TOKEN_FILE = "token"
# The file name an s3:// source's credentials Secret key is mounted as (an AWS credentials file).
OBJECT_STORE_CREDENTIALS_FILE = "credentials"

# Layout of one engine cache entry, <cache>/<engine cache key>/: the build writes `engine/`,
# `tokenizer/` and the marker into a work directory and publishes it with one rename, so an
# entry with the marker is a complete engine that never changes.
ENGINE_SUBDIR = "engine"
TOKENIZER_SUBDIR = "tokenizer"
# The LLM-API runtime's entry holds the Hugging Face checkpoint (weights, config, tokenizer).
CHECKPOINT_SUBDIR = "checkpoint"
BUILD_COMPLETE_MARKER = "BUILD_COMPLETE"

TENSORRT_LLM_MODEL = "tensorrt_llm"
ENSEMBLE_MODEL = "ensemble"
# The model clients send text to, per runtime: the engine runtime tokenizes around the engine in
# an ensemble; the LLM-API model takes text itself.
REQUEST_MODEL = {"engine": ENSEMBLE_MODEL, "llmapi": TENSORRT_LLM_MODEL}
# Series the serving pods export (checked against each release's record): the TTFT histogram,
# the TensorRT-LLM backend's queue and KV-cache gauges and token-length histograms, and Triton's
# per-model request counters.
TTFT_HISTOGRAM = "nv_inference_first_response_histogram_ms"
REQUEST_GAUGE = "nv_trt_llm_request_metrics"
# The request gauge's label and its value for the requests the engine holds (the preStop drain
# waits for none).
REQUEST_TYPE_LABEL = "request_type"
ACTIVE_REQUESTS = "active"
KV_CACHE_GAUGE = "nv_trt_llm_kv_cache_block_metrics"
INPUT_LENGTH_HISTOGRAM = "nv_llm_input_token_len"
OUTPUT_LENGTH_HISTOGRAM = "nv_llm_output_token_len"
SUCCESS_COUNTER = "nv_inference_request_success"
FAILURE_COUNTER = "nv_inference_request_failure"
# The TTFT histogram's buckets are each deployment's own: render/ttft_buckets.py.


def engine_dir(engine_cache_key: str) -> str:
    return f"{ENGINE_CACHE_PATH}/{engine_cache_key}/{ENGINE_SUBDIR}"


def checkpoint_dir(engine_cache_key: str) -> str:
    return f"{ENGINE_CACHE_PATH}/{engine_cache_key}/{CHECKPOINT_SUBDIR}"


def tokenizer_dir(engine_cache_key: str) -> str:
    return f"{ENGINE_CACHE_PATH}/{engine_cache_key}/{TOKENIZER_SUBDIR}"
