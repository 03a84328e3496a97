"""Triton python-backend glue: the emulated engine served as the `tensorrt_llm` model.

config.pbtxt: backend "python", decoupled transaction policy, inputs `text_input` (string),
`max_tokens` (int32), optional `stream` (bool, default false as in TensorRT-LLM), output
`text_output` (string), and the parameter `engine_profile_json`. Streaming requests get one
response per token; others get one response with the whole text. Metrics use the names and
labels of the real TensorRT-LLM backend, plus Triton's TTFT histogram (which Triton 2.51 does
not emit itself) and the emulator's own overhead.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from llmfleet_sandbox.emulator.engine import EmulatedEngine, OverheadStats
from llmfleet_sandbox.emulator.profile import EngineProfile
from llmfleet_sandbox.emulator.scheduler import SchedulerStats
from llmfleet.render.layout import TTFT_HISTOGRAM_BUCKETS_MS

PROFILE_PARAMETER = "engine_profile_json"
# TTFT buckets come from render's layout: one set for every revision, so canary and stable compare.
TOKEN_LENGTH_BUCKETS = [10, 50, 100, 500, 1000]  # the TensorRT-LLM backend's buckets


class _TritonStream:
    """A `TokenSink` over one request's response sender."""

    def __init__(self, sender, streaming: bool, batched_shape: bool):
        self._sender = sender
        self._streaming = streaming
        self._shape = (1, 1) if batched_shape else (1,)
        self._words: list[str] = []

    def send(self, token_text: str, final: bool) -> None:
        piece = token_text if not self._words else " " + token_text
        self._words.append(token_text)
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        if self._streaming:
            self._sender.send(self._response(piece), flags=flags)
        elif final:
            self._sender.send(self._response(" ".join(self._words)), flags=flags)

    def abort(self, message: str) -> None:
        self._sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                          flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def close(self) -> None:
        self._sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def is_cancelled(self) -> bool:
        return self._sender.is_cancelled()

    def _response(self, text: str):
        output = np.array([text.encode()], dtype=np.object_).reshape(self._shape)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", output)])


class _TritonMetrics:
    """An `EngineObserver` writing Triton custom metrics with the TensorRT-LLM backend's names."""

    def __init__(self, model: str, version: str):
        labels = {"model": model, "version": version}
        gauge, histogram = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        # The families must outlive their metrics: keep them all on self.
        self._families = {
            "request": pb_utils.MetricFamily("nv_trt_llm_request_metrics", "TRT LLM request metrics", gauge),
            "kv": pb_utils.MetricFamily("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics",
                                        gauge),
            "batcher": pb_utils.MetricFamily("nv_trt_llm_inflight_batcher_metrics",
                                             "TRT LLM inflight_batcher-specific metrics", gauge),
            "general": pb_utils.MetricFamily("nv_trt_llm_general_metrics", "General TRT LLM metrics", gauge),
            "input": pb_utils.MetricFamily("nv_llm_input_token_len", "TRT LLM response metrics", histogram),
            "output": pb_utils.MetricFamily("nv_llm_output_token_len", "TRT LLM response metrics", histogram),
            "ttft": pb_utils.MetricFamily("nv_inference_first_response_histogram_ms",
                                          "Duration from request to first response in milliseconds", histogram),
            "overhead": pb_utils.MetricFamily(
                "llmfleet_emulator_step_overhead_ms",
                "Emulator lateness of token delivery against the modelled step end (mean, max since start), "
                "and host work per step (mean)", gauge),
        }

        def gauges(family: str, label: str, values: list[str]):
            return {value: self._families[family].Metric(labels={**labels, label: value}) for value in values}

        self._request = gauges("request", "request_type", ["active", "max", "scheduled", "context", "waiting"])
        self._kv = gauges("kv", "kv_cache_block_type", ["max", "free", "used", "tokens_per", "reused", "fraction"])
        self._batcher = gauges("batcher", "inflight_batcher_specific_metric",
                               ["total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"])
        self._general = gauges("general", "general_type", ["iteration_counter", "timestamp"])
        self._overhead = gauges("overhead", "stat", ["mean", "max", "host_work_mean"])
        self._input_tokens = self._families["input"].Metric(
            labels={**labels, "response_metric_type": "total_input_tokens"}, buckets=TOKEN_LENGTH_BUCKETS)
        self._output_tokens = self._families["output"].Metric(
            labels={**labels, "response_metric_type": "total_output_tokens"}, buckets=TOKEN_LENGTH_BUCKETS)
        self._ttft = self._families["ttft"].Metric(labels=labels, buckets=list(TTFT_HISTOGRAM_BUCKETS_MS))

    def first_token(self, ttft_ms: float) -> None:
        self._ttft.observe(ttft_ms)

    def request_finished(self, input_tokens: int, output_tokens: int) -> None:
        self._input_tokens.observe(input_tokens)
        self._output_tokens.observe(output_tokens)

    def iteration_stats(self, stats: SchedulerStats, overhead: OverheadStats) -> None:
        values = [
            (self._request["active"], stats.active_requests),
            (self._request["max"], stats.max_batch_size),
            (self._request["scheduled"], stats.scheduled_requests),
            (self._request["context"], stats.context_requests),
            (self._request["waiting"], stats.waiting_requests),
            (self._kv["max"], stats.kv_blocks_max),
            (self._kv["free"], stats.kv_blocks_free),
            (self._kv["used"], stats.kv_blocks_used),
            (self._kv["tokens_per"], stats.kv_tokens_per_block),
            (self._kv["reused"], stats.kv_blocks_reused_total),
            (self._kv["fraction"], stats.kv_blocks_used / stats.kv_blocks_max),
            (self._batcher["total_context_tokens"], stats.total_context_tokens),
            (self._batcher["generation_requests"], stats.generation_requests),
            (self._batcher["micro_batch_id"], 0),
            (self._batcher["paused_requests"], 0),  # guaranteed_no_evict never pauses
            (self._general["iteration_counter"], overhead.steps),
            (self._general["timestamp"], int(time.time() * 1e6)),
            (self._overhead["mean"], overhead.overhead_ms_mean),
            (self._overhead["max"], overhead.overhead_ms_max),
            (self._overhead["host_work_mean"], overhead.host_work_ms_mean),
        ]
        for metric, value in values:
            metric.set(value)


def _scalar(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                "the emulated tensorrt_llm model streams tokens: set model_transaction_policy { decoupled: true }")
        try:
            profile_json = config["parameters"][PROFILE_PARAMETER]["string_value"]
        except KeyError:
            raise pb_utils.TritonModelException(f"config.pbtxt has no parameter {PROFILE_PARAMETER!r}") from None
        try:
            self.profile = EngineProfile.from_json(profile_json)
        except ValueError as error:
            raise pb_utils.TritonModelException(str(error)) from None
        self._batched_shape = config.get("max_batch_size", 0) > 0
        self.engine = EmulatedEngine(self.profile, _TritonMetrics(args["model_name"], args["model_version"]))
        self.engine.start()
        pb_utils.Logger.log_info(f"emulated engine started: {json.dumps(self.profile.to_json_dict())}")

    def execute(self, requests):
        for request in requests:
            sink = _TritonStream(request.get_response_sender(), streaming=bool(_scalar(request, "stream")),
                                 batched_shape=self._batched_shape)
            try:
                text = _scalar(request, "text_input")
                max_tokens = _scalar(request, "max_tokens")
                if text is None or max_tokens is None:
                    raise ValueError("inputs text_input and max_tokens are required")
                prompt = text.decode() if isinstance(text, bytes) else str(text)
                self.engine.submit(prompt, int(max_tokens), sink)
            except ValueError as error:  # includes RequestNeverFits
                sink.abort(str(error))
        return None

    def finalize(self):
        self.engine.stop()
        # Triton's log pipe is already closing during finalize: write to the stub's own stderr.
        print(f"emulated engine stopped: {self.engine.overhead.summary()}", file=sys.stderr, flush=True)
