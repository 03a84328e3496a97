"""The planner's throughput on public measurements of the 2025 MoE models (issue 28's benchmark).

Pure (no clock, no output): `benchmarks/bench_planner_accuracy_moe.py` is the command line over these
functions and `operator/tests/test_planner_accuracy_moe_data.py` checks the data files with them.
The rows live outside the catalog, in two sets: `benchmarks/data/planner_accuracy_moe.yaml`, spent as a
check on 2026-12-07 (read while the model changed; it may now be used to fit), and
`benchmarks/data/planner_accuracy_moe_check2.yaml`, the check, which no fit or tuning reads.

Each row is estimated on the path the calibration check uses (`max_throughput_tokens_per_sec`, the
saturation throughput of `estimate()`), with the row's own layout (TP x PP x EP, attention data
parallelism) and, where the source states them, its engine limits and KV-cache fraction. What the
source leaves unstated takes the calibration rows' assumptions (`KV_CACHE_FREE_GPU_MEM_FRACTION`,
the estimate's default max_batch_size and max_num_tokens), and a layout dimension it leaves unstated
is taken as the column label reads: EP 1 and no attention data parallelism (`layout`; with
`unstated_adp=True` the other reading, for the report's sensitivity line).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmfleet.catalog import Catalog
from llmfleet.planner.layout import Layout
from llmfleet.planner.search import max_throughput_tokens_per_sec

# The calibration rows' assumption where a page does not state the fraction.
KV_CACHE_FREE_GPU_MEM_FRACTION = 0.95
# max_throughput_tokens_per_sec's defaults, which the calibration rows are estimated with.
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
# Issue 28's goals: median |estimate/measured - 1| at most 15 %; no GPU x format group's median
# estimate/measured above 1.10 (optimistic by more than 10 %).
MEDIAN_ERROR_GOAL = 0.15
GROUP_OPTIMISM_LIMIT = 1.10


@dataclass(frozen=True)
class AccuracyRow:
    """One published throughput of a configuration (see the data file's header for each field)."""

    model: str
    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel_size: int | None  # None: not stated by the source
    attention_data_parallel: bool | None  # None: not stated by the source
    quantization: str
    kv_cache_dtype: str
    input_tokens: int
    output_tokens: int
    output_tokens_per_sec: float  # the whole replica's
    source: str
    output_tokens_per_sec_per_gpu: float | None = None  # as published, where the page is per GPU
    # TensorRT-LLM's engine limits as the source states them (per rank under attention DP), or None.
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    kv_cache_free_gpu_mem_fraction: float | None = None
    concurrency: int | None = None

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def layout_stated(self) -> bool:
        return self.expert_parallel_size is not None and self.attention_data_parallel is not None


@dataclass(frozen=True)
class SkippedColumn:
    """Published cells not estimated: a column of a table (or one run), with the reason."""

    model: str
    table: str
    column: str
    cells: int
    reason: str
    source: str


@dataclass(frozen=True)
class Outcome:
    row: AccuracyRow
    layout: Layout
    estimate: float | None  # None when the planner refuses the configuration
    refusal: str = ""

    @property
    def ratio(self) -> float:
        return self.estimate / self.row.output_tokens_per_sec


@dataclass(frozen=True)
class Summary:
    name: str
    rows: int
    median_ratio: float  # median estimate/measured (> 1: the planner is optimistic)
    median_abs_error: float
    p90_abs_error: float  # nearest rank
    worst_ratio: float  # furthest from 1 in log terms


def load(path: Path) -> tuple[tuple[AccuracyRow, ...], tuple[SkippedColumn, ...]]:
    data = yaml.safe_load(path.read_text())
    return (tuple(AccuracyRow(**row) for row in data["rows"]),
            tuple(SkippedColumn(**entry) for entry in data["skipped"]))


def problems(rows: Sequence[AccuracyRow], skipped: Sequence[SkippedColumn], catalog: Catalog) -> list[str]:
    """Why the data is not well formed (empty when it is): every row sourced, positive, naming the
    catalog's model, GPU, format and KV dtype, with a layout the planner can write down and per-GPU
    figures consistent with the replica's; every skipped column sourced, with a reason and cells."""
    found = []
    for index, row in enumerate(rows):
        where = f"row {index} ({row.model} {row.gpu} {row.input_tokens}/{row.output_tokens})"
        if not row.source.strip():
            found.append(f"{where}: no source")
        numbers = [row.tensor_parallel_size, row.pipeline_parallel_size, row.input_tokens, row.output_tokens,
                   row.output_tokens_per_sec, row.expert_parallel_size or 1, row.max_batch_size or 1,
                   row.max_num_tokens or 1, row.concurrency or 1, row.output_tokens_per_sec_per_gpu or 1]
        if any(not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0 for value in numbers):
            found.append(f"{where}: a value that is not positive")
        fraction = row.kv_cache_free_gpu_mem_fraction
        if fraction is not None and not 0 < fraction <= 1:
            found.append(f"{where}: kv_cache_free_gpu_mem_fraction {fraction} outside (0, 1]")
        for kind, names, name in (("model", catalog.models, row.model), ("GPU", catalog.gpus, row.gpu),
                                  ("format", catalog.quantizations, row.quantization),
                                  ("KV dtype", catalog.kv_cache_dtypes, row.kv_cache_dtype)):
            if name not in names:
                found.append(f"{where}: {kind} {name} is not in the catalog (skip the row with a reason)")
        per_gpu = row.output_tokens_per_sec_per_gpu
        if per_gpu is not None and not math.isclose(per_gpu * row.gpus, row.output_tokens_per_sec):
            found.append(f"{where}: {per_gpu} per GPU x {row.gpus} GPUs is not {row.output_tokens_per_sec}")
        try:
            layout(row)
        except ValueError as error:
            found.append(f"{where}: {error}")
    for index, entry in enumerate(skipped):
        if not entry.source.strip() or not entry.reason.strip():
            found.append(f"skipped entry {index} ({entry.table}, {entry.column}): no source or no reason")
        if not isinstance(entry.cells, int) or entry.cells < 1:
            found.append(f"skipped entry {index} ({entry.table}, {entry.column}): cells must be at least 1")
    return found


def layout(row: AccuracyRow, unstated_adp: bool = False) -> Layout:
    """The row's layout; a dimension the source leaves unstated as the column label reads (EP 1, no
    attention DP), or with `unstated_adp` attention DP with EP = TP (the planner's ADP layout)."""
    adp = unstated_adp if row.attention_data_parallel is None else row.attention_data_parallel
    ep = row.expert_parallel_size
    if ep is None:
        ep = row.tensor_parallel_size if adp else 1
    return Layout(row.tensor_parallel_size, row.pipeline_parallel_size, ep, adp)


def engine_limits(row: AccuracyRow, parallel: Layout) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) for the planner, whose limits are the replica's: a stated
    TensorRT-LLM limit is per rank under attention DP, so it is multiplied by the ranks holding
    different sequences; a stated concurrency caps the batch. Unstated: the estimate's defaults."""
    shards = parallel.sequence_shards
    batch = DEFAULT_MAX_BATCH_SIZE if row.max_batch_size is None else row.max_batch_size * shards
    tokens = DEFAULT_MAX_NUM_TOKENS if row.max_num_tokens is None else row.max_num_tokens * shards
    if row.concurrency is not None:
        batch = min(batch, row.concurrency)
    return batch, tokens


def estimate(row: AccuracyRow, catalog: Catalog, unstated_adp: bool = False) -> Outcome:
    parallel = layout(row, unstated_adp)
    max_batch_size, max_num_tokens = engine_limits(row, parallel)
    fraction = row.kv_cache_free_gpu_mem_fraction or KV_CACHE_FREE_GPU_MEM_FRACTION
    try:
        throughput = max_throughput_tokens_per_sec(
            row.model, row.gpu, parallel, row.quantization, row.kv_cache_dtype, row.input_tokens,
            row.output_tokens, catalog=catalog, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
            kv_cache_free_gpu_mem_fraction=fraction)
    except ValueError as error:
        return Outcome(row, parallel, None, str(error))
    if throughput <= 0:
        return Outcome(row, parallel, None, "the estimate has no room for one sequence")
    return Outcome(row, parallel, throughput)


def nearest_rank(values: Iterable[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summary(name: str, ratios: Sequence[float]) -> Summary:
    errors = [abs(ratio - 1) for ratio in ratios]
    return Summary(name=name, rows=len(ratios), median_ratio=statistics.median(ratios),
                   median_abs_error=statistics.median(errors), p90_abs_error=nearest_rank(errors, 0.9),
                   worst_ratio=max(ratios, key=lambda ratio: abs(math.log(ratio))))


def grouped(outcomes: Sequence[Outcome], key: Callable[[Outcome], str]) -> list[Summary]:
    """One summary per group of the estimated outcomes, by name."""
    groups: dict[str, list[float]] = {}
    for outcome in outcomes:
        if outcome.estimate is not None:
            groups.setdefault(key(outcome), []).append(outcome.ratio)
    return [summary(name, ratios) for name, ratios in sorted(groups.items())]


def gpu_format(outcome: Outcome) -> str:
    return f"{outcome.row.gpu} {outcome.row.quantization}"


def goals(overall: Summary, by_gpu_format: Sequence[Summary]) -> tuple[bool, bool]:
    """(median goal met, no GPU x format group optimistic by more than 10 %)."""
    return (overall.median_abs_error <= MEDIAN_ERROR_GOAL,
            all(group.median_ratio <= GROUP_OPTIMISM_LIMIT for group in by_gpu_format))
