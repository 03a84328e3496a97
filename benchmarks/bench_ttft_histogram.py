"""The p99 TTFT Prometheus reads from the histogram against the exact p99 of the same requests,
with the fixed buckets of before and with the deployment's own (render.ttft_buckets).

Pure and fast (no sandbox): the sandbox demo's spec (examples/sandbox-chat.yaml: SLO 500 ms,
the autoscaler's default target) planned, one replica of its engine served in virtual time
(llmfleet.simulation, the emulated engine's scheduler) with Poisson arrivals at rates that
put the p99 from under the scale-down threshold (half the target) to over the SLO. Each request's TTFT is what the client
sees; the histogram counts the same TTFTs and `histogram_quantile` interpolates as Prometheus
does (llmfleet.simulation.prometheus_view). Errors are histogram / exact - 1, over the whole run
and over every 60 s window (the p99 the autoscaler reads comes from a window) whose own p99
lies in the dense range.
Writes docs/benchmarks/ttft-histogram.md and appends to ttft-histogram-log.md.
Run: .venv/bin/python benchmarks/bench_ttft_histogram.py   (about a minute)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

from llmfleet.api import LLMDeployment  # noqa: E402
from llmfleet.autoscale import DEFAULT_TUNING, target_ttft_p99_ms  # noqa: E402
from llmfleet.catalog import load_catalog  # noqa: E402
from llmfleet.cli.inputs import read_mapping  # noqa: E402
from llmfleet.loadgen.command import length_distributions, open_loop_plan  # noqa: E402
from llmfleet.planner import plan  # noqa: E402
from llmfleet.planner.spec_adapter import plan_request_from_spec  # noqa: E402
from llmfleet.render.ttft_buckets import DENSE_REACH, UNRECORDED_BOUNDS_MS, deployment_ttft_bounds_ms  # noqa: E402
from llmfleet.simulation.deployment import engine_for, query_window_seconds  # noqa: E402
from llmfleet.simulation.fleet import Fleet, FleetSettings, simulate  # noqa: E402
from llmfleet.simulation.prometheus_view import TtftHistogram, histogram_quantile  # noqa: E402
from llmfleet.simulation.replica import Arrival  # noqa: E402

REPORT = REPO / "docs" / "benchmarks" / "ttft-histogram.md"
LOG = REPO / "docs" / "benchmarks" / "ttft-histogram-log.md"
SPEC = REPO / "examples" / "sandbox-chat.yaml"
RATES_PER_S = (0.6, 1.0, 1.3, 1.35, 1.4, 1.45, 1.5, 1.55, 1.6)
DURATION_S = 1800.0
WINDOW_S = 60.0
MIN_WINDOW_REQUESTS = 20
SCRAPE_INTERVAL_S = 15.0
P99 = 0.99


def histogram_p99_ms(ttfts_ms: list[float], bounds_ms) -> float:
    histogram = TtftHistogram(bounds_ms)
    for ttft in ttfts_ms:
        histogram.observe(ttft)
    return histogram_quantile(P99, bounds_ms, histogram.cumulative())


def errors(ttfts_ms: list[float], bounds_ms) -> float:
    return histogram_p99_ms(ttfts_ms, bounds_ms) / float(np.percentile(ttfts_ms, 99)) - 1


def served_ttfts(spec, chosen, catalog, rate_per_s: float, seed: int) -> list[tuple[float, float]]:
    """(arrival s, TTFT ms) of every answered request, one replica at `rate_per_s`."""
    w = spec.workload
    args = argparse.Namespace(trace=None, schedule=f"steps:0:{rate_per_s}", duration_s=DURATION_S, seed=seed,
                              input_tokens=f"lognormal:{w.input_tokens_mean}:{w.input_tokens_p99}",
                              output_tokens=f"lognormal:{w.output_tokens_mean}:{w.output_tokens_p99}")
    requests, _ = open_loop_plan(args, *length_distributions(args))
    arrivals = [Arrival(r.arrival_s * 1000, min(r.input_tokens, spec.engine.max_input_len), r.output_tokens)
                for r in requests]
    fleet = Fleet(engine_for(spec, chosen, catalog), 1, spec.slo.ttft_p99_ms, None)
    settings = FleetSettings(SCRAPE_INTERVAL_S, query_window_seconds(SCRAPE_INTERVAL_S), SCRAPE_INTERVAL_S, 0.0,
                             seed=seed)
    run = simulate(fleet, settings, arrivals)
    return [(r.arrival.arrival_ms / 1000, r.ttft_ms) for r in run.requests if r.ttft_ms is not None]


def windowed(served: list[tuple[float, float]]) -> list[list[float]]:
    by_window: dict[int, list[float]] = {}
    for arrival_s, ttft_ms in served:
        by_window.setdefault(int(arrival_s // WINDOW_S), []).append(ttft_ms)
    return [ttfts for ttfts in by_window.values() if len(ttfts) >= MIN_WINDOW_REQUESTS]


def percent(value: float) -> str:
    return f"{100 * value:+.1f}%"


def spread(absolute_errors: list[float]) -> str:
    """median / p90 / max of absolute errors, in percent."""
    if not absolute_errors:
        return "-"
    median, p90 = np.percentile(absolute_errors, [50, 90])
    return f"{100 * median:.1f}% / {100 * p90:.1f}% / {100 * max(absolute_errors):.1f}%"


def main() -> None:
    started = time.monotonic()
    deployment = LLMDeployment.from_manifest(read_mapping(str(SPEC), str(SPEC)))
    spec = deployment.spec
    chosen = plan(plan_request_from_spec(spec))
    catalog = load_catalog()
    new_bounds = deployment_ttft_bounds_ms(spec)
    slo_ms = spec.slo.ttft_p99_ms
    target_ms = target_ttft_p99_ms(spec.autoscaling, slo_ms)
    rows, worst = [], {"old": 0.0, "new": 0.0}
    all_old_windows: list[float] = []
    all_new_windows: list[float] = []
    window_sizes: list[int] = []
    # The dense range at this target (render.ttft_buckets), which the bound is about.
    dense_from_ms = target_ms * DEFAULT_TUNING.scale_down_below_target_fraction * (1 - DENSE_REACH)
    dense_to_ms = slo_ms * (1 + DENSE_REACH)
    in_range = []
    for index, rate in enumerate(RATES_PER_S):
        served = served_ttfts(spec, chosen, catalog, rate, seed=index)
        ttfts = [ttft for _, ttft in served]
        exact = float(np.percentile(ttfts, 99))
        old, new = errors(ttfts, UNRECORDED_BOUNDS_MS), errors(ttfts, new_bounds)
        windows = [w for w in windowed(served) if dense_from_ms <= float(np.percentile(w, 99)) <= dense_to_ms]
        old_windows = [abs(errors(w, UNRECORDED_BOUNDS_MS)) for w in windows]
        new_windows = [abs(errors(w, new_bounds)) for w in windows]
        all_old_windows += old_windows
        all_new_windows += new_windows
        window_sizes += [len(w) for w in windows]
        rows.append(f"| {rate:g} | {len(ttfts)} | {exact:.0f} | {percent(old)} | {percent(new)} | "
                    f"{len(windows)} | {spread(old_windows)} | {spread(new_windows)} |")
        if dense_from_ms <= exact <= dense_to_ms:
            in_range.append(exact)
            worst["old"], worst["new"] = max(worst["old"], abs(old)), max(worst["new"], abs(new))
        print(f"{rate} req/s: exact p99 {exact:.0f} ms, old {percent(old)}, new {percent(new)}", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    commit += "+changes" if dirty else ""
    table = ["| rate (req/s) | requests | exact p99 (ms) | error, fixed buckets | error, deployment's buckets | "
             "60 s windows in the dense range | fixed: abs error median / p90 / max | "
             "deployment's: median / p90 / max |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|", *rows,
             f"| all | | | | | {len(all_new_windows)} | {spread(all_old_windows)} | {spread(all_new_windows)} |"]
    summary = (f"Over the runs whose exact p99 lies in the dense range, {dense_from_ms:.0f} to {dense_to_ms:.0f} ms "
               f"(under the scale-down threshold to over the SLO; {len(in_range)} of "
               f"{len(RATES_PER_S)}): the largest error of the whole-run p99 is {100 * worst['old']:.1f}% with the "
               f"fixed buckets and {100 * worst['new']:.1f}% with the deployment's. Over the 60 s windows whose "
               f"p99 lies in the dense range ({min(window_sizes)} to {max(window_sizes)} requests "
               "each: the p99 lies between the two slowest, whose gap no bucket resolves): "
               f"median / p90 / max absolute error {spread(all_old_windows)} with the fixed buckets, "
               f"{spread(all_new_windows)} with the deployment's.")
    report = "\n".join([
        "## TTFT histogram p99 against the exact p99", "",
        f"Generated by `.venv/bin/python benchmarks/bench_ttft_histogram.py` at {commit} "
        f"({datetime.date.today()}, Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"{time.monotonic() - started:.0f} s). The sandbox demo's spec ({SPEC.relative_to(REPO)}: "
        f"{chosen.summary}, SLO {slo_ms} ms, the autoscaler's default target {target_ms} ms at no known "
        f"prefill floor), one replica in virtual time, {DURATION_S:.0f} s of Poisson arrivals per rate. "
        "Error = the p99 `histogram_quantile` reads from the histogram / the exact p99 of the same requests "
        "(numpy's, as `llmfleet load` reports it) - 1. Fixed buckets: the one set every deployment had before "
        f"({len(UNRECORDED_BOUNDS_MS)} bounds); the deployment's: {len(new_bounds)} bounds, "
        f"{', '.join(str(b) for b in new_bounds)} ms.", "",
        summary, "", *table, "",
        "Log of every run: [ttft-histogram-log.md](ttft-histogram-log.md).", ""])
    REPORT.write_text(report)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with LOG.open("a") as log:
        if LOG.stat().st_size == 0:
            log.write("# bench_ttft_histogram.py runs\n\nEvery run, kept.\n\n")
        log.write(f"## {stamp}, {commit}\n\n{summary}\n\n" + "\n".join(table) + "\n\n")
    print(report)


if __name__ == "__main__":
    main()
