"""Triton metrics of the emulated engine: the pinned release's families, nothing else.

An `EngineObserver` (see emulator.engine) writing Triton custom metrics with the names and label
values the release's reference record lists (the image names its release in
LLMFLEET_SANDBOX_RELEASE), so a series the real server lacks is absent here too. Triton's TTFT
histogram is written here because Triton 2.51 does not emit it itself; the emulator's own
overhead goes under an `llmfleet_emulator_` name no release has.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Mapping

import triton_python_backend_utils as pb_utils

from llmfleet.catalog.release_record import RUNTIME_RELEASES, MetricFamily, load_release_record
from llmfleet.render.layout import (
    ACTIVE_REQUESTS,
    INPUT_LENGTH_HISTOGRAM,
    KV_CACHE_GAUGE,
    OUTPUT_LENGTH_HISTOGRAM,
    REQUEST_GAUGE,
    REQUEST_TYPE_LABEL,
    TTFT_HISTOGRAM,
)
from llmfleet_sandbox.emulator.engine import OverheadStats
from llmfleet.simulation.scheduler import SchedulerStats
from llmfleet_sandbox.image.tritonserver import RENDERED_CONFIG
from llmfleet_sandbox.trtllm_image import RELEASE_VARIABLE

TOKEN_LENGTH_BUCKETS = [10, 50, 100, 500, 1000]  # the TensorRT-LLM backend's buckets
EMULATOR_METRIC_PREFIX = "llmfleet_emulator_"

# key -> (name, help, histogram?)
METRIC_FAMILIES = {
    "request": (REQUEST_GAUGE, "TRT LLM request metrics", False),
    "kv": (KV_CACHE_GAUGE, "TRT LLM KV cache block metrics", False),
    "batcher": ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics", False),
    "general": ("nv_trt_llm_general_metrics", "General TRT LLM metrics", False),
    "input": (INPUT_LENGTH_HISTOGRAM, "TRT LLM response metrics", True),
    "output": (OUTPUT_LENGTH_HISTOGRAM, "TRT LLM response metrics", True),
    "ttft": (TTFT_HISTOGRAM, "Duration from request to first response in milliseconds", True),
    "overhead": ("llmfleet_emulator_step_overhead_ms",
                 "Emulator lateness of token delivery against the modelled step end (mean, max since start), "
                 "and host work per step (mean)", False),
}


_TTFT_BUCKETS = re.compile(rf'family:\s*"{TTFT_HISTOGRAM}"\s*}}\s*histogram_options\s*{{\s*buckets:\s*\[([^\]]*)\]')


def ttft_buckets_ms(model_dir: Path) -> list[float]:
    """The TTFT histogram's buckets the rendered config gives the model (its `model_metrics`,
    which the server wrapper kept beside the served config)."""
    path = model_dir / RENDERED_CONFIG
    match = _TTFT_BUCKETS.search(path.read_text())
    if match is None:
        raise ValueError(f"{path} has no histogram_options buckets for {TTFT_HISTOGRAM} in model_metrics")
    return [float(bucket) for bucket in match.group(1).split(",")]


def release_metrics(default_runtime: str) -> Mapping[str, MetricFamily]:
    """The metric families of the image's release (of `default_runtime`'s pinned one outside an image)."""
    return load_release_record(os.environ.get(RELEASE_VARIABLE) or RUNTIME_RELEASES[default_runtime]).metrics


class TritonMetrics:
    """An `EngineObserver` writing Triton custom metrics with the TensorRT-LLM backend's names,
    only those the release exports."""

    def __init__(self, model: str, version: str, exported: Mapping[str, MetricFamily], ttft_buckets: list[float]):
        labels = {"model": model, "version": version}
        gauge, histogram = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        # The families must outlive their metrics: keep them all on self.
        self._families = {key: pb_utils.MetricFamily(name, description, histogram if is_histogram else gauge)
                          for key, (name, description, is_histogram) in METRIC_FAMILIES.items()}

        def gauges(family: str, label: str, values: list[str]):
            name = METRIC_FAMILIES[family][0]
            if not name.startswith(EMULATOR_METRIC_PREFIX):
                record = exported.get(name)
                values = [value for value in values if record is not None and value in (record.labels.get(label) or ())]
            return {value: self._families[family].Metric(labels={**labels, label: value}) for value in values}

        def histogram(family: str, buckets: list, **extra_labels: str):
            if METRIC_FAMILIES[family][0] not in exported:
                return None
            return self._families[family].Metric(labels={**labels, **extra_labels}, buckets=buckets)

        self._request = gauges("request", REQUEST_TYPE_LABEL, [ACTIVE_REQUESTS, "max", "scheduled", "context", "waiting"])
        self._kv = gauges("kv", "kv_cache_block_type", ["max", "free", "used", "tokens_per", "reused", "fraction"])
        self._batcher = gauges("batcher", "inflight_batcher_specific_metric",
                               ["total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"])
        self._general = gauges("general", "general_type", ["iteration_counter", "timestamp"])
        self._overhead = gauges("overhead", "stat", ["mean", "max", "host_work_mean"])
        self._input_tokens = histogram("input", TOKEN_LENGTH_BUCKETS, response_metric_type="total_input_tokens")
        self._output_tokens = histogram("output", TOKEN_LENGTH_BUCKETS, response_metric_type="total_output_tokens")
        self._ttft = histogram("ttft", ttft_buckets)

    def first_token(self, ttft_ms: float) -> None:
        if self._ttft is not None:
            self._ttft.observe(ttft_ms)

    def request_finished(self, input_tokens: int, output_tokens: int) -> None:
        for histogram, value in ((self._input_tokens, input_tokens), (self._output_tokens, output_tokens)):
            if histogram is not None:
                histogram.observe(value)

    def iteration_stats(self, stats: SchedulerStats, overhead: OverheadStats) -> None:
        values = [
            (self._request, ACTIVE_REQUESTS, stats.active_requests),
            (self._request, "max", stats.max_batch_size),
            (self._request, "scheduled", stats.scheduled_requests),
            (self._request, "context", stats.context_requests),
            (self._request, "waiting", stats.waiting_requests),
            (self._kv, "max", stats.kv_blocks_max),
            (self._kv, "free", stats.kv_blocks_free),
            (self._kv, "used", stats.kv_blocks_used),
            (self._kv, "tokens_per", stats.kv_tokens_per_block),
            (self._kv, "reused", stats.kv_blocks_reused_total),
            (self._kv, "fraction", stats.kv_blocks_used / stats.kv_blocks_max),
            (self._batcher, "total_context_tokens", stats.total_context_tokens),
            (self._batcher, "generation_requests", stats.generation_requests),
            (self._batcher, "micro_batch_id", 0),
            (self._batcher, "paused_requests", 0),  # guaranteed_no_evict never pauses
            (self._general, "iteration_counter", overhead.steps),
            (self._general, "timestamp", int(time.time() * 1e6)),
            (self._overhead, "mean", overhead.overhead_ms_mean),
            (self._overhead, "max", overhead.overhead_ms_max),
            (self._overhead, "host_work_mean", overhead.host_work_ms_mean),
        ]
        for gauges, label_value, value in values:
            if label_value in gauges:
                gauges[label_value].set(value)
