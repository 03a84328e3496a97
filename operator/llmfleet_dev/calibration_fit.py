"""Fitting the latency model's efficiency factors to the catalog's declared measurements.

Pure (no I/O, no clock): `benchmarks/fit_calibration.py` is the command line over these
functions and `operator/tests/test_calibration_fit.py` checks the repository's calibration with
them. It evaluates the planner's `estimate()` but lives in the development package, out of the
operator image, because only that command and that test run it; the catalog stays data only.

What is fitted, in two stages:
1. the shared factors (`SHARED_GRIDS`) to the base rows (`base_rows`: dense models on Hopper, at
   any TP), all own factors at 1.0;
2. the own factors (`OWN_FACTORS`: an efficiency scale per GPU generation in `GENERATION_FACTORS`,
   Ampere, Ada and Blackwell; an interconnect scale for Ada, `INTERCONNECT_FACTORS`;
   `MOE_FACTOR` for models with experts; and a scale per TP size, `TENSOR_PARALLEL_FACTORS`)
   together to all rows, the shared factors
   fixed: a coordinate search over the own factors whose rows are present, and only when base rows
   exist too (otherwise they would only trade places with the shared factors).
If there are no base rows (a leave-one-group-out fold without the dense Hopper rows), stage 1 fits
the shared factors to all rows with the own factors at 1.0 and stage 2 is skipped.
A factor named in `held` keeps its held value and is not searched.

Objective: the RMS of log(estimate / measured) of `estimate()`'s saturation throughput at
kv_cache_free_gpu_mem_fraction 0.95. Constraint (conservative: an optimistic planner
under-provisions): in every group of the rows (by GPU, by model, by quantisation format) the median
estimate/measured is at most `MEDIAN_RATIO_LIMIT`. Candidates are ranked by (excess of the worst
group median over the limit, RMS log error), so a feasible point always beats an infeasible one.
Search: coordinate search on the grids from `START` (each round tries every grid value of one
factor with the others fixed and keeps the best; rounds repeat until none moves), deterministic.

The held-out rows (`catalog.calibration_holdout`) never enter the fit: `holdout_errors` measures
the written factors on them against the targets `HOLDOUT_MEDIAN_TARGET` and `HOLDOUT_P90_TARGET`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from llmfleet.catalog import SCALE_MAPPINGS, Calibration, CalibrationMeasurement, Catalog
from llmfleet.planner.search import max_throughput_tokens_per_sec

KV_CACHE_FREE_GPU_MEM_FRACTION = 0.95
MEDIAN_RATIO_LIMIT = 1.10
GROUP_KINDS = ("gpu", "model", "quantization")
MAX_ROUNDS = 100


def _steps(low: float, high: float, step: float) -> tuple[float, ...]:
    count = round((high - low) / step)
    return tuple(round(low + index * step, 6) for index in range(count + 1))


# Factor -> the values the search may take (the grid step is the fit's resolution).
SHARED_GRIDS: Mapping[str, tuple[float, ...]] = {
    "prefill_compute_efficiency": _steps(0.05, 1.0, 0.05),
    "decode_compute_efficiency": _steps(0.05, 1.0, 0.05),
    "memory_bandwidth_efficiency": _steps(0.3, 1.0, 0.05),
    "step_overhead_ms": _steps(0.0, 20.0, 0.5),
    "allreduce_latency_us": _steps(0.0, 100.0, 5.0),
}
# GPU generation -> its own factor, a multiplier on the shared efficiencies (latency.py), stored in
# calibration.yaml's generation_efficiency_scales. Hopper is the reference (no factor: the shared
# factors are fitted to its rows); a generation not listed here is uncalibrated (1.0).
GENERATION_FACTORS: Mapping[str, str] = {
    generation: f"generation_efficiency_scales.{generation}" for generation in ("ampere", "ada", "blackwell")}
# GPU generation -> its own multiplier on interconnect_efficiency (calibration.yaml's
# generation_interconnect_scales), fitted to its TP > 1 rows. Only Ada (L40S, the one GPU whose TP
# all-reduce runs over PCIe): the only generation whose rows, with the efficiency scale alone, drift
# with TP (docs/planner.md, Calibration).
INTERCONNECT_FACTORS: Mapping[str, str] = {"ada": "generation_interconnect_scales.ada"}
# The multiplier on the shared efficiencies for models with experts (latency.moe_efficiency_scale).
MOE_FACTOR = "moe_efficiency_scale"
# TP size -> its own multiplier on the shared efficiencies (calibration.yaml's
# tensor_parallel_scales, latency.tensor_parallel_scale), fitted to the rows with that TP on every
# GPU: the fitted rows' error grew with TP under the other factors alone (docs/planner.md).
TENSOR_PARALLEL_FACTORS: Mapping[int, str] = {tp: f"tensor_parallel_scales.tp{tp}" for tp in (2, 4, 8)}
OWN_FACTORS = (*GENERATION_FACTORS.values(), *INTERCONNECT_FACTORS.values(), MOE_FACTOR,
               *TENSOR_PARALLEL_FACTORS.values())
GENERATION_GRID = _steps(0.3, 1.5, 0.05)  # the grid of every own factor
FITTED_FACTORS = (*SHARED_GRIDS, *OWN_FACTORS)
# Where every search starts: round mid-range values, not the catalog's (so the fit does not
# depend on the numbers it is meant to reproduce).
START: Mapping[str, float] = {
    "prefill_compute_efficiency": 0.5, "decode_compute_efficiency": 0.5, "memory_bandwidth_efficiency": 0.7,
    "step_overhead_ms": 5.0, "allreduce_latency_us": 20.0,
}
# The two latency constants are held: the rows are saturation throughputs, in which a per-step
# cost trades against the efficiencies along a flat ridge (the free fit and its leave-one-group-out
# folds put the step overhead anywhere from 3 to 6 ms and the all-reduce latency from 60 to
# 100 µs), while small-batch TTFT and TPOT depend on them directly. The
# efficiencies the rows do identify are fitted. A free fit is reported beside the written one
# (docs/benchmarks/calibration.md); to adopt it, empty this mapping and run
# `benchmarks/fit_calibration.py --write`.
HELD: Mapping[str, float] = {"step_overhead_ms": 4.0, "allreduce_latency_us": 20.0}
FREE: Mapping[str, float] = {}
# The targets for public measurements outside the fitted rows (|estimate/measured - 1|).
HOLDOUT_MEDIAN_TARGET = 0.12
HOLDOUT_P90_TARGET = 0.30


@dataclass(frozen=True)
class GroupError:
    """How far estimate() is from the measurements of one group of rows."""

    kind: str  # "all", or one of GROUP_KINDS
    name: str
    rows: int
    median_ratio: float  # median estimate/measured (> 1: the planner is optimistic)
    median_abs_error: float  # median |estimate/measured - 1|
    p90_abs_error: float  # nearest-rank 90th percentile of |estimate/measured - 1|
    worst_ratio: float  # the row furthest from 1 in log terms


@dataclass(frozen=True)
class Score:
    rms_log_error: float
    worst_group: str
    worst_group_median: float

    @property
    def excess(self) -> float:
        return max(0.0, self.worst_group_median - MEDIAN_RATIO_LIMIT)

    @property
    def feasible(self) -> bool:
        return self.excess == 0.0

    def key(self) -> tuple[float, float]:
        # Rounded so that float noise cannot make the search order platform dependent.
        return round(self.excess, 9), round(self.rms_log_error, 12)


@dataclass(frozen=True)
class Fold:
    """One leave-one-group-out fold: the factors fitted without the group, and the group's error."""

    kind: str
    name: str
    calibration: Calibration
    error: GroupError


def group_name(row: CalibrationMeasurement, kind: str) -> str:
    return {"gpu": row.gpu, "model": row.model, "quantization": row.quantization}[kind]


def factor_values(calibration: Calibration) -> dict[str, float]:
    """Every fitted factor's value, own factors by their dotted names (1.0 where unset)."""
    values = {name: getattr(calibration, name) for name in SHARED_GRIDS}
    values.update({factor: calibration.generation_efficiency_scale(generation)
                   for generation, factor in GENERATION_FACTORS.items()})
    values.update({factor: calibration.generation_interconnect_scale(generation)
                   for generation, factor in INTERCONNECT_FACTORS.items()})
    values[MOE_FACTOR] = calibration.moe_efficiency_scale
    values.update({factor: calibration.tensor_parallel_scale(tp) for tp, factor in TENSOR_PARALLEL_FACTORS.items()})
    return values


def with_factors(calibration: Calibration, values: Mapping[str, float]) -> Calibration:
    """`calibration` with the named fitted factors set (dotted names for generation scales)."""
    unknown = set(values) - set(FITTED_FACTORS)
    if unknown:
        raise ValueError(f"{sorted(unknown)} are not fitted factors")
    mappings = {name: dict(getattr(calibration, name)) for name in SCALE_MAPPINGS}
    plain = {}
    for name, value in values.items():
        parent, _, key = name.partition(".")
        if key:
            mappings[parent][key] = value
        else:
            plain[name] = value
    return dataclasses.replace(calibration, **mappings, **plain)


def own_factors(row: CalibrationMeasurement, catalog: Catalog) -> tuple[str, ...]:
    """The own factors that apply to a row: its GPU generation's (efficiency; interconnect when
    TP > 1), the MoE factor for a model with experts, and its TP size's."""
    factors = []
    generation = catalog.gpu(row.gpu).generation
    if generation in GENERATION_FACTORS:
        factors.append(GENERATION_FACTORS[generation])
    if generation in INTERCONNECT_FACTORS and row.tensor_parallel_size > 1:
        factors.append(INTERCONNECT_FACTORS[generation])
    if catalog.model(row.model).num_experts > 1:
        factors.append(MOE_FACTOR)
    if row.tensor_parallel_size in TENSOR_PARALLEL_FACTORS:
        factors.append(TENSOR_PARALLEL_FACTORS[row.tensor_parallel_size])
    return tuple(factors)


def base_rows(rows: Sequence[CalibrationMeasurement], catalog: Catalog) -> list[CalibrationMeasurement]:
    """The rows the shared factors are fitted to: dense models on Hopper, at any TP. The TP factors
    are fitted after them, as the others are. Fitted to the TP1 rows alone the shared factors were
    unstable (a fold without the H200 rows ran them to the grid's edges and predicted H200 57 %
    low at the median)."""
    tensor_parallel = set(TENSOR_PARALLEL_FACTORS.values())
    return [row for row in rows if set(own_factors(row, catalog)) <= tensor_parallel]


def estimate_ratios(rows: Sequence[CalibrationMeasurement], calibration: Calibration,
                    catalog: Catalog) -> tuple[float, ...]:
    """estimate()'s saturation throughput over the measured one, per row."""
    with_calibration = dataclasses.replace(catalog, calibration=calibration)
    ratios = []
    for row in rows:
        try:
            throughput = max_throughput_tokens_per_sec(
                row.model, row.gpu, row.tensor_parallel_size, row.quantization, row.kv_cache_dtype,
                row.input_tokens, row.output_tokens, catalog=with_calibration,
                kv_cache_free_gpu_mem_fraction=KV_CACHE_FREE_GPU_MEM_FRACTION)
        except ValueError as error:
            raise ValueError(f"calibration row {row} cannot be estimated: {error}") from None
        ratios.append(throughput / row.output_tokens_per_sec)
    return tuple(ratios)


def nearest_rank(values: Iterable[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def error_summary(kind: str, name: str, ratios: Sequence[float]) -> GroupError:
    errors = [abs(ratio - 1) for ratio in ratios]
    return GroupError(kind=kind, name=name, rows=len(ratios), median_ratio=statistics.median(ratios),
                      median_abs_error=statistics.median(errors), p90_abs_error=nearest_rank(errors, 0.9),
                      worst_ratio=max(ratios, key=lambda ratio: abs(math.log(ratio))))


def _group_indices(rows: Sequence[CalibrationMeasurement]) -> dict[tuple[str, str], list[int]]:
    """(kind, name) -> the indices of the group's rows, groups in order of kind, then name."""
    groups: dict[tuple[str, str], list[int]] = {}
    for kind in GROUP_KINDS:
        for index in sorted(range(len(rows)), key=lambda index: group_name(rows[index], kind)):
            groups.setdefault((kind, group_name(rows[index], kind)), []).append(index)
    return groups


def _grouped(rows: Sequence[CalibrationMeasurement], ratios: Sequence[float]) -> dict[tuple[str, str], list[float]]:
    return {group: [ratios[index] for index in indices] for group, indices in _group_indices(rows).items()}


def group_errors(rows: Sequence[CalibrationMeasurement], ratios: Sequence[float]) -> list[GroupError]:
    """The error of all rows, then of each group, by kind and name."""
    return [error_summary("all", "all rows", ratios),
            *(error_summary(kind, name, values) for (kind, name), values in _grouped(rows, ratios).items())]


def score(rows: Sequence[CalibrationMeasurement], ratios: Sequence[float]) -> Score:
    return _scorer(rows)(ratios)


def _scorer(rows: Sequence[CalibrationMeasurement]) -> Callable[[Sequence[float]], Score]:
    """score() for these rows, their groups found once (the search scores them thousands of times)."""
    groups = _group_indices(rows)

    def score_ratios(ratios: Sequence[float]) -> Score:
        rms = math.sqrt(sum(math.log(ratio) ** 2 for ratio in ratios) / len(ratios))
        medians = {f"{kind} {name}": statistics.median([ratios[index] for index in indices])
                   for (kind, name), indices in groups.items()}
        worst = max(medians, key=lambda group: medians[group])
        return Score(rms_log_error=rms, worst_group=worst, worst_group_median=medians[worst])

    return score_ratios


def _coordinate_search(key: Callable[[dict[str, float]], tuple[float, float]], start: Mapping[str, float],
                       grids: Mapping[str, tuple[float, ...]]) -> dict[str, float]:
    point = dict(start)
    cache: dict[tuple[float, ...], tuple[float, float]] = {}

    def cached(candidate: dict[str, float]) -> tuple[float, float]:
        index = tuple(candidate[name] for name in grids)
        if index not in cache:
            cache[index] = key(candidate)
        return cache[index]

    for _ in range(MAX_ROUNDS):
        moved = False
        for name, grid in grids.items():
            best_value, best_key = point[name], cached(point)
            for value in grid:
                trial_key = cached({**point, name: value})
                if trial_key < best_key:
                    best_value, best_key = value, trial_key
            if best_value != point[name]:
                point[name] = best_value
                moved = True
        if not moved:
            return point
    raise RuntimeError(f"coordinate search did not settle in {MAX_ROUNDS} rounds")


def fit(rows: Sequence[CalibrationMeasurement], catalog: Catalog,
        held: Mapping[str, float] = HELD) -> Calibration:
    """The fitted calibration (factors not in FITTED_FACTORS come from catalog.calibration)."""
    if not rows:
        raise ValueError("no rows to fit")
    unknown = set(held) - set(FITTED_FACTORS)
    if unknown:
        raise ValueError(f"held factors {sorted(unknown)} are not fitted factors")
    own_defaults = {factor: held.get(factor, 1.0) for factor in OWN_FACTORS}
    calibration = with_factors(catalog.calibration, {**START, **own_defaults, **held})

    def key_for(subset: Sequence[CalibrationMeasurement]) -> Callable[[dict[str, float]], tuple[float, float]]:
        scorer = _scorer(subset)
        return lambda point: scorer(estimate_ratios(subset, with_factors(calibration, point), catalog)).key()

    base = base_rows(rows, catalog)
    shared = {name: grid for name, grid in SHARED_GRIDS.items() if name not in held}
    if shared:
        point = _coordinate_search(key_for(base or rows), {name: START[name] for name in shared}, shared)
        calibration = with_factors(calibration, point)
    if base:
        present = {factor for row in rows for factor in own_factors(row, catalog)}
        free = {factor: GENERATION_GRID for factor in OWN_FACTORS if factor in present and factor not in held}
        if free:
            point = _coordinate_search(_own_factor_key(rows, calibration, catalog, free),
                                       {factor: 1.0 for factor in free}, free)
            calibration = with_factors(calibration, point)
    return calibration


def _own_factor_key(rows: Sequence[CalibrationMeasurement], calibration: Calibration, catalog: Catalog,
                    free: Mapping[str, tuple[float, ...]]) -> Callable[[dict[str, float]], tuple[float, float]]:
    """The search key over the own factors in `free`, the rest of `calibration` fixed. A row's ratio
    depends only on the own factors that apply to it, so it is estimated once per value of those."""
    applying = [tuple(factor for factor in own_factors(row, catalog) if factor in free) for row in rows]
    cache: dict[tuple[int, tuple[float, ...]], float] = {}
    scorer = _scorer(rows)

    def key(point: dict[str, float]) -> tuple[float, float]:
        keys = [(index, tuple(point[factor] for factor in factors)) for index, factors in enumerate(applying)]
        missing = [index for index, row_key in enumerate(keys) if row_key not in cache]
        if missing:
            ratios = estimate_ratios([rows[index] for index in missing], with_factors(calibration, point), catalog)
            cache.update((keys[index], ratio) for index, ratio in zip(missing, ratios))
        return scorer([cache[row_key] for row_key in keys]).key()

    return key


def leave_one_group_out(rows: Sequence[CalibrationMeasurement], catalog: Catalog,
                        held: Mapping[str, float] = FREE) -> list[Fold]:
    """For every group of every kind: fit without its rows, then measure the error on them.

    By default nothing is held, so every fold refits every factor: the error of the fitting
    procedure on data it has not seen, which is what a new GPU, model or format would meet."""
    folds = []
    for kind in GROUP_KINDS:
        for name in sorted({group_name(row, kind) for row in rows}):
            left_out = [row for row in rows if group_name(row, kind) == name]
            kept = [row for row in rows if group_name(row, kind) != name]
            if not kept:
                continue
            calibration = fit(kept, catalog, held)
            ratios = estimate_ratios(left_out, calibration, catalog)
            folds.append(Fold(kind, name, calibration, error_summary(kind, name, ratios)))
    return folds


def _yaml_number(value: float) -> str:
    return repr(float(round(value, 6)))


def holdout_errors(catalog: Catalog, calibration: Calibration | None = None) -> list[GroupError]:
    """The error of `calibration` (default: the catalog's) on the held-out rows: all, then by group."""
    rows = catalog.calibration_holdout
    if not rows:
        return []
    return group_errors(rows, estimate_ratios(rows, catalog.calibration if calibration is None else calibration,
                                              catalog))


def _factor_line(lines: Sequence[str], name: str) -> int:
    """The index of the one line holding fitted factor `name` ('parent.key': the key's line in the
    parent's block)."""
    parent, _, key = name.rpartition(".")
    indent = "    " if parent else "  "
    pattern = re.compile(rf"^{indent}{re.escape(key)}:[ \t]*[^\s#]")
    current = None
    found = []
    for index, line in enumerate(lines):
        top = re.match(r"^  ([A-Za-z_]\w*):", line)
        if top:
            current = top.group(1)
        if pattern.match(line) and (not parent or current == parent):
            found.append(index)
    if len(found) != 1:
        where = f" under '  {parent}:'" if parent else ""
        raise ValueError(f"calibration.yaml must have exactly one '{indent}{key}:' line{where}")
    return found[0]


def update_calibration_yaml(text: str, calibration: Calibration, fitted_comment: str) -> str:
    """calibration.yaml's text with the fitted factors' values and its '# fitted:' line replaced,
    everything else (comments, rows, order) unchanged."""
    lines = text.split("\n")
    for name, value in factor_values(calibration).items():
        index = _factor_line(lines, name)
        key = name.rpartition(".")[2]
        lines[index] = re.sub(rf"^(\s*{re.escape(key)}:[ \t]*)[^\s#]+",
                              lambda match: match.group(1) + _yaml_number(value), lines[index])
    text = "\n".join(lines)
    fitted = re.compile(r"^# fitted:.*$", re.MULTILINE)
    if len(fitted.findall(text)) != 1:
        raise ValueError("calibration.yaml must have exactly one '# fitted:' comment line")
    if "\n" in fitted_comment:
        raise ValueError("the fitted comment is one line")
    return fitted.sub(lambda _: f"# fitted: {fitted_comment}", text)
