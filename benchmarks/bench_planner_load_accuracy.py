"""Planner latency under load against public measurements (issue 30, part 5).

Estimates every row of benchmarks/data/planner_load_accuracy.yaml (a TensorRT-LLM serving sweep of
concurrency: mean TTFT, mean time per output token, output tokens/s) with the planner's current model
and factors, two ways:
- at the measured rate (requests/s = output tokens/s / output length), the open-loop model the planner
  sizes fleets with (`predict_at_load`, `steady_step_seconds`): mean TPOT (the decode batch Little's
  law builds, rate x output length x TPOT, is off by the same ratio, so it is not listed), mean TTFT (Poisson arrivals; the measurement is a closed loop, whose arrivals are more
  regular, so the model's queueing should come out at or above it); and the model's p99 TTFT over the
  measured mean TTFT, which must not be under 1 (a p99 below the mean is wrong whatever the tail);
- at the measured concurrency, the closed-loop model of `llmfleet estimate` (`predict_at_concurrency`);
and the replica's saturation throughput against the sweep's plateau. It prints, for the fit set and
the check set apart, each row and each quantity's median estimate/measured.

The fit and check sets were split in the data file before any estimate; the check is read once after
a change of the model, and every reading of both is appended to
docs/benchmarks/planner-load-accuracy-log.md (met or missed: there are no goals, the ratios are the
reading). Writes docs/benchmarks/planner-load-accuracy.md.

Run: PYTHONPATH=operator .venv/bin/python benchmarks/bench_planner_load_accuracy.py [--fit-only]
(--fit-only, while a change is being chosen: the fit set alone, logged, no report written.)
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data" / "planner_load_accuracy.yaml"
REPORT = REPO / "docs" / "benchmarks" / "planner-load-accuracy.md"
LOG = REPO / "docs" / "benchmarks" / "planner-load-accuracy-log.md"
COMMAND = "PYTHONPATH=operator .venv/bin/python benchmarks/bench_planner_load_accuracy.py"
SETS = ("fit", "check")
# estimate()'s engine limits: the source states none.
MAX_BATCH_SIZE, MAX_NUM_TOKENS, KV_FREE_FRACTION = 2048, 8192, 0.9
# A row is on the sweep's plateau (its capacity) within this share of the sweep's highest throughput.
PLATEAU_SHARE = 0.98
QUANTITIES = ("TPOT at rate", "mean TTFT at rate", "p99 TTFT at rate over mean", "TPOT closed loop",
              "mean TTFT closed loop")
LOG_HEADER = """# Planner latency under load: every reading

Appended by `benchmarks/bench_planner_load_accuracy.py` on every run: median estimate/measured per
quantity over each set of `benchmarks/data/planner_load_accuracy.yaml` ("inf": the model calls the
measured load overloaded), and the saturation throughput over the sweep's plateau. The check set is
a check only until its first reading after a change of the model; a reading taken while choosing a
change spends it, and the report must then say so.

| when | commit | set | rows | TPOT at rate | mean TTFT at rate | p99 TTFT at rate over mean | TPOT closed loop | mean TTFT closed loop | capacity |
|---|---|---|---:|---:|---:|---:|---:|---:|---:|
"""
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_sandbox import append_run, commit  # noqa: E402

from llmfleet.catalog import Catalog, load_catalog  # noqa: E402
from llmfleet.planner.latency import (  # noqa: E402
    Engine,
    build_engine,
    predict_at_concurrency,
    predict_at_load,
    saturation_throughput_tokens_per_sec,
    steady_step_seconds,
)


@dataclass(frozen=True)
class Row:
    set: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    ttft_mean_ms: float
    itl_mean_ms: float
    output_tokens_per_sec: float
    source: str

    @property
    def requests_per_sec(self) -> float:
        return self.output_tokens_per_sec / self.output_tokens


@dataclass(frozen=True)
class Outcome:
    row: Row
    estimated: dict[str, float]
    measured: dict[str, float]

    def ratio(self, quantity: str) -> float:
        return self.estimated[quantity] / self.measured[quantity]


def load_rows() -> tuple[dict, list[Row]]:
    document = yaml.safe_load(DATA.read_text())
    rows = [Row(**entry) for entry in document["rows"]]
    unknown = {row.set for row in rows} - set(SETS)
    if unknown:
        raise ValueError(f"{DATA}: rows[].set must be one of {SETS}, got {sorted(unknown)}")
    return document["engine"], rows


def engine_for(spec: dict, catalog: Catalog) -> Engine:
    return build_engine(catalog.model(spec["model"]), catalog.gpu(spec["gpu"]),
                        catalog.quantization(spec["quantization"]), catalog.kv_cache_dtype(spec["kv_cache_dtype"]),
                        spec["tensor_parallel_size"], catalog.calibration, max_batch_size=MAX_BATCH_SIZE,
                        max_num_tokens=MAX_NUM_TOKENS, kv_cache_free_gpu_mem_fraction=KV_FREE_FRACTION)


def estimate(engine: Engine, row: Row) -> Outcome:
    isl, osl, rate = row.input_tokens, row.output_tokens, row.requests_per_sec
    context = isl + osl / 2
    tau = steady_step_seconds(engine, rate, isl, 0.0, osl, context)
    at_rate = predict_at_load(engine, rate, isl, isl, osl, osl, 0.0)
    ttft_closed_s, tpot_closed_s = predict_at_concurrency(engine, isl, osl, row.concurrency)
    estimated = {
        "TPOT at rate": math.inf if tau is None else tau * 1000,
        "mean TTFT at rate": at_rate.ttft_mean_ms,
        "p99 TTFT at rate over mean": at_rate.ttft_p99_ms,
        "TPOT closed loop": tpot_closed_s * 1000,
        "mean TTFT closed loop": ttft_closed_s * 1000,
    }
    measured = {
        "TPOT at rate": row.itl_mean_ms,
        "mean TTFT at rate": row.ttft_mean_ms, "p99 TTFT at rate over mean": row.ttft_mean_ms,
        "TPOT closed loop": row.itl_mean_ms,
        "mean TTFT closed loop": row.ttft_mean_ms,
    }
    return Outcome(row, estimated, measured)


def capacities(engine: Engine, rows: list[Row]) -> list[tuple[Row, float]]:
    """(the sweep's highest-throughput row, saturation estimate / its throughput) for each shape whose
    sweep reaches a plateau: at least two rows within PLATEAU_SHARE of its highest throughput."""
    found = []
    for shape in sorted({(row.input_tokens, row.output_tokens) for row in rows}):
        sweep = [row for row in rows if (row.input_tokens, row.output_tokens) == shape]
        top = max(sweep, key=lambda row: row.output_tokens_per_sec)
        if sum(row.output_tokens_per_sec >= PLATEAU_SHARE * top.output_tokens_per_sec for row in sweep) >= 2:
            found.append((top, saturation_throughput_tokens_per_sec(engine, *shape) / top.output_tokens_per_sec))
    return found


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-only", action="store_true",
                        help="estimate the fit set alone (while choosing a change: the check stays unread)")
    fit_only = parser.parse_args().fit_only
    catalog = load_catalog()
    spec, rows = load_rows()
    engine = engine_for(spec, catalog)
    measured_at = commit()
    lines = [
        "# Planner latency under load (issue 30, part 5)", "",
        f"Generated by `{COMMAND}` at commit {measured_at}. Machine: {os.cpu_count()} cores, "
        f"{platform.machine()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}. "
        "Every reading: [planner-load-accuracy-log.md](planner-load-accuracy-log.md).", "",
        f"Engine: {spec['model']} on {spec['tensor_parallel_size']} x {spec['gpu']}, {spec['quantization']} "
        f"weights, KV {spec['kv_cache_dtype']}, max_batch_size {MAX_BATCH_SIZE}, max_num_tokens {MAX_NUM_TOKENS}. "
        "Rows, source and the fit/check split: `benchmarks/data/planner_load_accuracy.yaml`. 'At rate': the "
        "open-loop model at the measured request rate; 'closed loop': `llmfleet estimate` at the measured "
        "concurrency. Ratios are estimate/measured; inf: the model calls the measured load overloaded.", ""]
    for name in SETS[:1] if fit_only else SETS:
        outcomes = [estimate(engine, row) for row in rows if row.set == name]
        medians = {quantity: _median([outcome.ratio(quantity) for outcome in outcomes]) for quantity in QUANTITIES}
        capacity = capacities(engine, [outcome.row for outcome in outcomes])
        lines += [f"## {name} set ({len(outcomes)} rows)", "",
                  "| quantity | median est/meas |", "|---|---:|",
                  *(f"| {quantity} | {_fmt(medians[quantity])} |" for quantity in QUANTITIES),
                  *(f"| saturation throughput, {top.input_tokens}/{top.output_tokens} (plateau "
                    f"{top.output_tokens_per_sec:.0f} tok/s) | {ratio:.3f} |" for top, ratio in capacity), "",
                  "| ISL/OSL | concurrency | req/s | " + " | ".join(f"{q} est / meas" for q in QUANTITIES) + " |",
                  "|---|---:|---:|" + "---:|" * len(QUANTITIES)]
        for outcome in outcomes:
            row = outcome.row
            cells = [f"{_fmt(outcome.estimated[q])} / {_fmt(outcome.measured[q])}" for q in QUANTITIES]
            lines.append(f"| {row.input_tokens}/{row.output_tokens} | {row.concurrency} | "
                         f"{row.requests_per_sec:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
        capacity_cell = ", ".join(f"{ratio:.3f}" for _, ratio in capacity) or "-"
        append_run(LOG, LOG_HEADER, f"| {time.strftime('%Y-%m-%d %H:%M')} | {measured_at} | {name} | {len(outcomes)} | "
                   + " | ".join(_fmt(medians[q]) for q in QUANTITIES) + f" | {capacity_cell} |")
        print(f"{name}: " + ", ".join(f"{q} {_fmt(medians[q])}" for q in QUANTITIES) + f", capacity {capacity_cell}")
    if not fit_only:
        REPORT.write_text("\n".join(lines))
        print(f"wrote {REPORT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
