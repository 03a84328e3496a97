"""The planner's p99 TTFT and TPOT under load against the emulated engine's scheduler run in
virtual time on the same engine, over a grid of engines, prompt/answer lengths and loads; and
the replicas each says a spec needs. Each case runs twice: with the emulator's own step cost
(its profile, linear) and with the planner's step model in the same scheduler, which leaves only
the planner's queueing model to differ.

Each case: Poisson arrivals at a share of the planner's saturation rate for one replica,
log-normal lengths as `llmfleet load` draws them, 1200 s of virtual time after a 60 s warm-up
(operator/tests/planner_emulator.py). Prints markdown and writes
docs/benchmarks/planner-vs-emulator.md. No sandbox needed.
Run: .venv/bin/python benchmarks/bench_planner_vs_emulator.py   (about two minutes)
"""

from __future__ import annotations

import dataclasses
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "docs" / "benchmarks" / "planner-vs-emulator.md"
sys.path.insert(0, str(REPO / "operator" / "tests"))

from llmfleet.planner.latency import predict_at_load, saturation_throughput_tokens_per_sec  # noqa: E402
from llmfleet_sandbox.emulator.simulate import serve  # noqa: E402
from planner_emulator import Case, arrivals, compare, engines, error_summary, p99  # noqa: E402

# (model, GPU, TP, weights, KV, max batch, max tokens per step)
ENGINES = (
    ("llama-3.1-70b", "H100-SXM-80GB", 1, "FP8", "FP8", 4, 2048),
    ("llama-3.1-70b", "H100-SXM-80GB", 2, "BF16", "BF16", 32, 4096),
    ("llama-3.1-8b", "A100-SXM-80GB", 1, "BF16", "BF16", 16, 512),
    ("llama-3.1-8b", "H100-SXM-80GB", 1, "FP8", "FP8", 64, 4096),
)
# (prompt mean, prompt p99, answer mean, answer p99)
LENGTHS = ((128, 256, 32, 64), (1024, 2048, 256, 512))
LOAD_SHARES = (0.2, 0.4, 0.6, 0.8)
DURATION_S = 1200.0
# Replicas: the fleet's rate split over n replicas, SLO p99 TTFT in ms.
FLEETS = (
    (Case("llama-3.1-70b", "H100-SXM-80GB", 1, "FP8", "FP8", 4, 2048, 128, 256, 32, 64, 6.0), 500),
    (Case("llama-3.1-70b", "H100-SXM-80GB", 1, "FP8", "FP8", 4, 2048, 256, 512, 64, 128, 4.0), 500),
    (Case("llama-3.1-8b", "A100-SXM-80GB", 1, "BF16", "BF16", 16, 512, 200, 400, 40, 80, 40.0), 300),
)
MOST_REPLICAS = 16


def grid() -> list[tuple[float, Case]]:
    """(load share, case) for every engine, lengths and share."""
    cases = []
    for engine_fields in ENGINES:
        for lengths in LENGTHS:
            probe = Case(*engine_fields, *lengths, 1.0)
            engine, _ = engines(probe)
            saturation_rps = saturation_throughput_tokens_per_sec(engine, lengths[0], lengths[2]) / lengths[2]
            cases += [(share, dataclasses.replace(probe, requests_per_sec=round(saturation_rps * share, 3)))
                      for share in LOAD_SHARES]
    return cases


def fewest_replicas(fleet: Case, slo_ms: float, split: str) -> int | None:
    """Fewest replicas whose emulated p99 TTFT meets the SLO with the fleet's Poisson arrivals
    split at random (each replica Poisson at rate / n) or round-robin (arrival i to i mod n)."""
    _, profile = engines(fleet)
    stream = arrivals(fleet, DURATION_S, seed=0)
    for replicas in range(1, MOST_REPLICAS + 1):
        if split == "random":
            ttfts = [request.ttft_ms for request in serve(
                profile, arrivals(dataclasses.replace(fleet, requests_per_sec=fleet.requests_per_sec / replicas),
                                  DURATION_S, seed=0)) if request.arrival.arrival_ms >= 60_000]
        else:
            ttfts = [request.ttft_ms for index in range(replicas) for request in serve(profile, stream[index::replicas])
                     if request.arrival.arrival_ms >= 60_000]
        if p99(ttfts) <= slo_ms:
            return replicas
    return None


def planned_replicas(fleet: Case, slo_ms: float) -> int | None:
    engine, _ = engines(fleet)
    for replicas in range(1, MOST_REPLICAS + 1):
        predicted = predict_at_load(engine, fleet.requests_per_sec / replicas, fleet.input_tokens_mean,
                                    fleet.input_tokens_p99, fleet.output_tokens_mean, fleet.output_tokens_p99, 0.0)
        if predicted.ttft_p99_ms <= slo_ms:
            return replicas
    return None


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip() or "unknown"


def ms(value: float) -> str:
    return "overloaded" if math.isinf(value) else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def main() -> int:
    started = time.monotonic()
    rows = [(share, compare(case, DURATION_S), compare(case, DURATION_S, planner_step=True))
            for share, case in grid()]
    comparisons = [comparison for _, comparison, _ in rows]
    same_step = [comparison for _, _, comparison in rows]

    # An emulated engine past its capacity queues without end: its p99 says only that.
    def comparable(c) -> bool:
        return math.isfinite(c.predicted_ttft_p99_ms) and c.emulated_keeps_up

    finite = [c for c in comparisons if comparable(c)]
    ttft_median, ttft_p90 = error_summary([c.ttft_error for c in finite])
    tpot_median, tpot_p90 = error_summary([c.tpot_error for c in finite])
    same_finite = [c for c in same_step if comparable(c)]
    same_ttft_median, same_ttft_p90 = error_summary([c.ttft_error for c in same_finite])
    same_tpot_median, same_tpot_p90 = error_summary([c.tpot_error for c in same_finite])
    lines = [
        "# Planner against the emulated engine", "",
        "Generated by `.venv/bin/python benchmarks/bench_planner_vs_emulator.py` at "
        f"{commit()} ({time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, "
        f"{time.monotonic() - started:.0f} s). For each case the planner's p99 TTFT and TPOT "
        "(`predict_at_load`) and the p99 of the emulated engine's scheduler run in virtual time "
        f"({DURATION_S:.0f} s of Poisson arrivals after a 60 s warm-up, the engine built from the "
        "same pinned spec, `operator/tests/planner_emulator.py`). Loads are shares of the planner's "
        "saturation rate for one replica. Error = predicted / emulated - 1.", "",
        f"Over the {len(finite)} cases where the planner predicts a finite p99 and the emulated engine keeps up "
        "(the median TTFT of the last quarter of arrivals within twice the first quarter's plus 1 s): "
        f"p99 TTFT error median {ttft_median:.0%}, p90 {ttft_p90:.0%}; "
        f"p99 TPOT error median {tpot_median:.0%}, p90 {tpot_p90:.0%}. "
        f"{len(comparisons) - len(finite)} cases are past one side's capacity (error '-'; 'falls behind': the emulated engine's queue grows through the run).", "",
        "The emulator's step is the planner's linearised into additive costs, which a step that "
        "mixes prompts with a decode batch pays in full where the planner's GEMM roofline overlaps "
        "them; so the same scheduler was also run with the planner's own step cost "
        "(`planner_step_ms`; columns 'same step'), leaving only the planner's queueing model to "
        f"differ. Over the {len(same_finite)} cases that then keep up: p99 TTFT error median "
        f"{same_ttft_median:.0%}, p90 {same_ttft_p90:.0%}; p99 TPOT error median {same_tpot_median:.0%}, "
        f"p90 {same_tpot_p90:.0%}.", "",
        "| engine | prompt / answer (mean) | load share | req/s | p99 TTFT planner / emulator (ms) | error "
        "| p99 TPOT planner / emulator (ms) | error | p99 TTFT / TPOT, same step (ms) | errors, same step "
        "| requests |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def error(c, value) -> str:
        return f"{value:+.0%}" if comparable(c) else "-"

    for (share, comparison, same) in rows:
        case = comparison.case
        engine = (f"{case.model} {case.gpu_type.split('-')[0]} TP{case.tensor_parallel_size} {case.quantization}, "
                  f"batch {case.max_batch_size}")
        lines.append(
            f"| {engine} | {case.input_tokens_mean} / {case.output_tokens_mean} | "
            f"{share:.0%} | {case.requests_per_sec:g} | "
            f"{ms(comparison.predicted_ttft_p99_ms)} / {ms(comparison.emulated_ttft_p99_ms)}"
            f"{'' if comparison.emulated_keeps_up else ' (falls behind)'} | "
            f"{error(comparison, comparison.ttft_error)} | "
            f"{ms(comparison.predicted_tpot_p99_ms)} / {ms(comparison.emulated_tpot_p99_ms)} | "
            f"{error(comparison, comparison.tpot_error)} | "
            f"{ms(same.emulated_ttft_p99_ms)}{'' if same.emulated_keeps_up else ' (falls behind)'} / "
            f"{ms(same.emulated_tpot_p99_ms)} | {error(same, same.ttft_error)} / {error(same, same.tpot_error)} | "
            f"{comparison.requests} |")
    lines += [
        "", "## Replicas a fleet needs", "",
        "The fewest replicas whose p99 TTFT meets the SLO at the fleet's rate: the planner's "
        "prediction (arrivals at random, each replica Poisson at rate / n), and the emulated engine "
        "with the fleet's arrivals split at random and round-robin (arrival i to replica i mod n, "
        "as the sandbox's default Service proxy does with a connection per request). Round-robin "
        "gives each replica a steadier stream than a random split, so it needs fewer.", "",
        "| fleet | rate (req/s) | SLO p99 TTFT (ms) | planner | emulator, random split | emulator, round-robin |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for fleet, slo_ms in FLEETS:
        def shown(value):
            return "-" if value is None else str(value)
        lines.append(
            f"| {fleet.model} {fleet.gpu_type.split('-')[0]} {fleet.quantization} batch {fleet.max_batch_size}, "
            f"{fleet.input_tokens_mean} / {fleet.output_tokens_mean} | {fleet.requests_per_sec:g} | {slo_ms} | "
            f"{shown(planned_replicas(fleet, slo_ms))} | {shown(fewest_replicas(fleet, slo_ms, 'random'))} | "
            f"{shown(fewest_replicas(fleet, slo_ms, 'round-robin'))} |")
    text = "\n".join(lines) + "\n"
    print(text)
    REPORT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
