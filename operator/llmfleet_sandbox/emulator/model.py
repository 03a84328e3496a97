"""The sandbox image's `tensorrtllm` backend: the emulated engine behind the real `tensorrt_llm` config.

Triton loads it as a python-based backend (/opt/tritonserver/backends/tensorrtllm/model.py
imports this class), so the model repository is the one rendered for real GPUs, unchanged:
token ids in (`input_ids`, `input_lengths`, `request_output_len`, optional `streaming` and the
sampling inputs, which are accepted and ignored), `output_ids` [beam, tokens] and
`sequence_length` out, decoupled. At load it reads the engine's config.json from
`gpt_model_path`, the serving parameters, and the node's GPU product from
LLMFLEET_SANDBOX_GPU_PRODUCT, and derives the engine profile from them (`profile_for_engine`).

Metrics are exactly the pinned release's TensorRT-LLM backend families and label values, read
from its reference record (the image names its release in LLMFLEET_SANDBOX_RELEASE), so a
series the real server lacks is absent here too; plus Triton's TTFT histogram (which Triton
2.51 does not emit itself) and the emulator's own overhead under an `llmfleet_emulator_` name.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from llmfleet_sandbox.emulator.engine import EmulatedEngine, EngineObserver
from llmfleet_sandbox.emulator.outputs import output_model_for_engine
from llmfleet_sandbox.emulator.triton_metrics import TritonMetrics, release_metrics, ttft_buckets_ms
from llmfleet_sandbox.emulator.engine_config import EngineConfig, EngineConfigError, read_engine_config
from llmfleet.simulation.profile import EngineProfile, ProfileError
from llmfleet_sandbox.emulator.profile import (
    GPU_PRODUCT_VARIABLE,
    gpu_for_product,
    profile_for_engine,
    ranks_per_node,
)

TOKEN_LENGTH_BUCKETS = [10, 50, 100, 500, 1000]  # the TensorRT-LLM backend's buckets
# What the emulator implements; other values would silently behave differently, so they fail the load.
SUPPORTED_PARAMETERS = {"max_beam_width": "1", "batch_scheduler_policy": "guaranteed_no_evict",
                        "enable_chunked_context": "true"}


class SenderSink:
    """The part of a `TokenSink` every Triton model shares: ending a stream over its sender."""

    def __init__(self, sender):
        self._sender = sender

    def abort(self, message: str) -> None:
        self._sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                          flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def close(self) -> None:
        self._sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled()


class _TritonStream(SenderSink):
    """A `TokenSink` over one request's response sender."""

    def __init__(self, sender, streaming: bool, batched_shape: bool, prefix_ids: list[int]):
        super().__init__(sender)
        self._streaming = streaming
        self._batched_shape = batched_shape
        # Non-streaming responses repeat the prompt first unless exclude_input_in_output.
        self._token_ids = list(prefix_ids)

    def send(self, token_id: int, final: bool) -> None:
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if self._streaming:
            self._sender.send(self._response([token_id]), flags=flags)
            return
        self._token_ids.append(token_id)
        if final:
            self._sender.send(self._response(self._token_ids), flags=flags)

    def _response(self, token_ids: list[int]):
        output_ids = np.array([token_ids], dtype=np.int32)  # [beam 1, tokens]
        sequence_length = np.array([len(token_ids)], dtype=np.int32)  # per beam
        if self._batched_shape:
            output_ids, sequence_length = output_ids[np.newaxis], sequence_length[np.newaxis]
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("output_ids", output_ids),
                                                          pb_utils.Tensor("sequence_length", sequence_length)])


def _parameter(config: dict, name: str) -> str:
    try:
        return config["parameters"][name]["string_value"]
    except KeyError:
        raise ValueError(f"config.pbtxt of the tensorrt_llm model has no parameter {name!r}") from None


def _flag(config: dict, name: str) -> bool:
    value = _parameter(config, name).strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"parameter {name} must be true or false, got {value!r}")
    return value == "true"


def _input(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request, name: str):
    values = _input(request, name)
    return None if values is None else values.reshape(-1)[0]


def start_engine(profile: EngineProfile, config: EngineConfig, observer: EngineObserver) -> EmulatedEngine:
    """The running engine for `config`, with the faults the sandbox injected into this container
    (a slowdown and an error rate as they change while it runs)."""
    from llmfleet_sandbox.faults import LiveFault

    fault = LiveFault(dict(os.environ))
    if fault().fail_load:
        raise pb_utils.TritonModelException(
            "emulated engine: failed to load: out of GPU memory (fault injected by the sandbox)")
    engine = EmulatedEngine(profile, observer, output_model_for_engine(config, os.environ), fault)
    engine.start()
    return engine


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        try:
            self._load(config)
            ttft_buckets = ttft_buckets_ms(Path(args["model_repository"]))
        except (ValueError, OSError) as error:  # EngineConfigError and ProfileError are ValueErrors
            raise pb_utils.TritonModelException(f"emulated tensorrtllm backend: {error}") from None
        self.engine = start_engine(self.profile, self.engine_config, TritonMetrics(
            args["model_name"], args["model_version"], release_metrics("engine"), ttft_buckets))
        pb_utils.Logger.log_info(f"emulated engine started: {json.dumps(self.profile.to_json_dict())}")

    def _load(self, config: dict) -> None:
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("the tensorrt_llm model streams tokens: set model_transaction_policy { decoupled: true }")
        for name, supported in SUPPORTED_PARAMETERS.items():
            if _parameter(config, name).strip().lower() != supported:
                raise ValueError(f"parameter {name} is {_parameter(config, name)!r}; the emulated engine "
                                 f"implements only {supported!r}")
        engine_dir = Path(_parameter(config, "gpt_model_path"))
        try:
            self.engine_config: EngineConfig = read_engine_config(engine_dir)
            gpu = gpu_for_product(os.environ.get(GPU_PRODUCT_VARIABLE))
        except (EngineConfigError, ProfileError) as error:
            raise ValueError(str(error)) from None
        try:
            fraction = float(_parameter(config, "kv_cache_free_gpu_mem_fraction"))
        except ValueError:
            raise ValueError("parameter kv_cache_free_gpu_mem_fraction must be a number, got "
                             f"{_parameter(config, 'kv_cache_free_gpu_mem_fraction')!r}") from None
        if not 0 < fraction <= 1:
            raise ValueError(f"parameter kv_cache_free_gpu_mem_fraction must be within (0, 1], got {fraction}")
        self.profile = profile_for_engine(self.engine_config, gpu, fraction, _flag(config, "enable_kv_cache_reuse"),
                                          ranks_per_node(dict(os.environ)))
        self._exclude_input_in_output = _flag(config, "exclude_input_in_output")
        self._batched_shape = config.get("max_batch_size", 0) > 0

    def execute(self, requests):
        for request in requests:
            streaming = _scalar(request, "streaming")
            sender = request.get_response_sender()
            try:
                prompt, output_len = self._request_tokens(request)
                sink = _TritonStream(sender, streaming=bool(streaming), batched_shape=self._batched_shape,
                                     prefix_ids=[] if streaming or self._exclude_input_in_output else prompt)
                self.engine.submit(prompt, output_len, sink)
            except ValueError as error:  # includes RequestNeverFits
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _request_tokens(self, request) -> tuple[list[int], int]:
        """(prompt token ids, output tokens to generate), checked as the real executor does."""
        input_ids, output_len = _input(request, "input_ids"), _scalar(request, "request_output_len")
        if input_ids is None or output_len is None:
            raise ValueError("inputs input_ids and request_output_len are required")
        rows = input_ids.reshape(-1, input_ids.shape[-1]) if input_ids.ndim > 1 else input_ids[np.newaxis]
        if rows.shape[0] != 1:
            raise ValueError(f"the emulated engine takes one sequence per request, got {rows.shape[0]}")
        length = _scalar(request, "input_lengths")
        prompt = rows[0][:int(length) if length is not None else rows.shape[1]].tolist()
        limits = self.engine_config
        if len(prompt) > limits.max_input_len:
            raise ValueError(f"Prompt length ({len(prompt)}) exceeds maximum input length ({limits.max_input_len})")
        # Like the executor, a request longer than the engine's sequence limit is shortened, not refused.
        return prompt, min(int(output_len), limits.max_seq_len - len(prompt))

    def finalize(self):
        self.engine.stop()
        # Triton's log pipe is already closing during finalize: write to the stub's own stderr.
        print(f"emulated engine stopped: {self.engine.overhead.summary()}", file=sys.stderr, flush=True)
