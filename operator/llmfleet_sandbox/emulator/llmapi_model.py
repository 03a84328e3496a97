"""The sandbox image's LLM-API model (all_models/llmapi/tensorrt_llm/1/model.py): the emulated
engine behind the llmapi runtime's rendered `tensorrt_llm` config and model.yaml.

As the upstream model of the pinned release does, it reads model.yaml (LLM_CONFIG_PATH, default
model.yaml, next to model.py), takes `triton_config` for itself and the rest as the LLM's
arguments, and serves `text_input` -> `text_output`, streaming when asked (decoupled only), each
response carrying the text generated so far. The LLM arguments are held to the release record
(an unknown key fails the load, as the real LLM refuses unknown arguments); the checkpoint
directory and the node's GPU give the engine profile. Like the pinned 0.19 model, it does not
cancel a request whose client went away: the request runs to its end.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from llmfleet.catalog.release_record import RUNTIME_RELEASES, check_model_yaml, load_release_record
from llmfleet_sandbox.emulator.checkpoint import engine_config_from_checkpoint
from llmfleet_sandbox.emulator.engine_config import EngineConfigError
from llmfleet_sandbox.emulator.model import SenderSink, start_engine
from llmfleet.simulation.profile import ProfileError
from llmfleet_sandbox.emulator.profile import (
    GPU_PRODUCT_VARIABLE,
    gpu_for_product,
    profile_for_engine,
    ranks_per_node,
)
from llmfleet_sandbox.emulator.tokenizer import TokenizerError, WordTokenizer
from llmfleet_sandbox.emulator.triton_metrics import TritonMetrics, release_metrics, ttft_buckets_ms
from llmfleet_sandbox.trtllm_image import RELEASE_VARIABLE

CONFIG_PATH_VARIABLE = "LLM_CONFIG_PATH"
DEFAULT_CONFIG_FILE = "model.yaml"
BACKEND = "pytorch"


class _TextStream(SenderSink):
    """A `TokenSink` answering with the decoded text so far (one response per token when streaming)."""

    def __init__(self, sender, tokenizer: WordTokenizer, streaming: bool):
        super().__init__(sender)
        self._tokenizer, self._streaming = tokenizer, streaming
        self._token_ids: list[int] = []

    def send(self, token_id: int, final: bool) -> None:
        self._token_ids.append(token_id)
        if self._streaming or final:
            text = self._tokenizer.decode(self._token_ids).encode()
            self._sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", np.array([text], dtype=np.object_))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)

    def is_cancelled(self) -> bool:
        return False  # the pinned release's model never acts on a cancelled request


def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        try:
            self._load(json.loads(args["model_config"]), Path(args["model_repository"]) / args["model_version"])
            ttft_buckets = ttft_buckets_ms(Path(args["model_repository"]))
        except (ValueError, OSError) as error:  # EngineConfigError, ProfileError, TokenizerError are ValueErrors
            raise pb_utils.TritonModelException(f"emulated LLM-API model: {error}") from None
        self.engine = start_engine(self.profile, self.engine_config, TritonMetrics(
            args["model_name"], args["model_version"], release_metrics("llmapi"), ttft_buckets))
        pb_utils.Logger.log_info(f"emulated LLM started: {json.dumps(self.profile.to_json_dict())}")

    def _load(self, config: dict, model_dir: Path) -> None:
        path = model_dir / os.environ.get(CONFIG_PATH_VARIABLE, DEFAULT_CONFIG_FILE)
        arguments = yaml.safe_load(path.read_text())
        if not isinstance(arguments, dict) or "triton_config" not in arguments:
            raise ValueError(f"{path} must be a mapping with triton_config")
        record = load_release_record(os.environ.get(RELEASE_VARIABLE) or RUNTIME_RELEASES["llmapi"])
        problems = check_model_yaml(record, arguments)
        if problems:
            raise ValueError("; ".join(problems))
        triton_config = arguments.pop("triton_config")
        self.decoupled = bool(triton_config["decoupled"])
        if pb_utils.using_decoupled_model_transaction_policy(config) != self.decoupled:
            raise ValueError("config.pbtxt's model_transaction_policy and model.yaml's triton_config.decoupled "
                             "disagree (with auto-complete disabled both must say the same)")
        if arguments.get("backend") != BACKEND:
            raise ValueError(f"model.yaml backend must be {BACKEND!r} (the emulated LLM is the PyTorch backend)")
        checkpoint = Path(arguments["model"])
        try:
            self.engine_config = engine_config_from_checkpoint(checkpoint, arguments)
            gpu = gpu_for_product(os.environ.get(GPU_PRODUCT_VARIABLE))
            self.tokenizer = WordTokenizer.from_dir(checkpoint)
        except (EngineConfigError, ProfileError, TokenizerError) as error:
            raise ValueError(str(error)) from None
        kv_cache = arguments.get("kv_cache_config") or {}
        if "free_gpu_memory_fraction" not in kv_cache:
            raise ValueError("model.yaml kv_cache_config.free_gpu_memory_fraction is required by the emulated LLM "
                             "(it sizes the KV cache as the planner did)")
        self.profile = profile_for_engine(self.engine_config, gpu, float(kv_cache["free_gpu_memory_fraction"]),
                                          bool(kv_cache.get("enable_block_reuse", True)),
                                          ranks_per_node(dict(os.environ)))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt, max_tokens, streaming = self._request(request)
                self.engine.submit(prompt, max_tokens, _TextStream(sender, self.tokenizer, streaming))
            except ValueError as error:  # includes RequestNeverFits
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _request(self, request) -> tuple[list[int], int, bool]:
        text = _input(request, "text_input")
        if text is None or text.ndim != 1 or text.size != 1:
            raise ValueError("text_input must be a 1D tensor holding one prompt")
        prompt = text[0].decode() if isinstance(text[0], bytes) else str(text[0])
        max_tokens = _input(request, "sampling_param_max_tokens")
        if max_tokens is None:
            raise ValueError("the emulated LLM needs sampling_param_max_tokens (how many tokens to generate)")
        streaming = _input(request, "streaming")
        streaming = bool(streaming.reshape(-1)[0]) if streaming is not None else False
        if streaming and not self.decoupled:
            raise ValueError("Streaming is only supported in decoupled mode.")
        token_ids = self.tokenizer.encode(prompt)
        if len(token_ids) > self.engine_config.max_input_len:
            raise ValueError(f"prompt length ({len(token_ids)}) exceeds the model's context "
                             f"({self.engine_config.max_input_len})")
        return token_ids, min(int(max_tokens.reshape(-1)[0]), self.engine_config.max_seq_len - len(token_ids)), streaming

    def finalize(self):
        self.engine.stop()
        print(f"emulated LLM stopped: {self.engine.overhead.summary()}", file=sys.stderr, flush=True)
