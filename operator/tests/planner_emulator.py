"""The planner's under-load predictions beside the emulated engine's scheduler run in virtual
time, for the same engine: used by test_planner_vs_emulator.py (a small grid, in CI) and
benchmarks/bench_planner_vs_emulator.py (the full grid, docs/benchmarks/planner-vs-emulator.md).

Both sides start from one pinned LLMDeployment spec: the planner builds its engine model from
the catalog, the emulator its profile from the config.json the build writes for that spec
(`engine_config_for`), as the served emulator does at model load. Arrivals are Poisson at the
case's rate per replica (what a Service that picks endpoints at random gives each replica),
with log-normal prompt and answer lengths drawn as `llmfleet load` draws them.

The emulator's step is the planner's step linearised (additive costs), so a difference between
the two mixes the queueing model's error with the step model's. `compare(..., planner_step=True)`
runs the same scheduler with the planner's own step cost (`planner_step_ms`) to separate them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llmfleet.catalog import load_catalog
from llmfleet.loadgen.lengths import parse_length_distribution
from llmfleet.loadgen.schedule import parse_schedule, poisson_arrivals
from llmfleet.loadgen.workload import planned_requests
from llmfleet.planner import SloTargets, Workload, plan
from llmfleet.planner.latency import Engine, build_engine, predict_at_load, prefill_attention_flops, step_seconds
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render.model_repo import KV_CACHE_FREE_GPU_MEM_FRACTION
from llmfleet.simulation.profile import EngineProfile
from llmfleet_sandbox.emulator.profile import profile_for_engine
from llmfleet.simulation.replica import Arrival, serve
from llmfleet.simulation.timing import StepWork
from triton_process import deployment_spec, engine_config_for

# Requests served before this are the warm-up: the engine starts empty.
WARM_UP_S = 60.0
# The most replicas a fleet comparison tries.
MOST_REPLICAS = 16


@dataclass(frozen=True)
class Case:
    model: str
    gpu_type: str
    tensor_parallel_size: int
    quantization: str
    kv_cache_dtype: str
    max_batch_size: int
    max_num_tokens: int
    input_tokens_mean: int
    input_tokens_p99: int
    output_tokens_mean: int
    output_tokens_p99: int
    requests_per_sec: float  # per replica

    @property
    def label(self) -> str:
        return (f"{self.model} {self.gpu_type.split('-')[0]} TP{self.tensor_parallel_size} {self.quantization} "
                f"batch {self.max_batch_size}, {self.input_tokens_mean}/{self.output_tokens_mean} tokens, "
                f"{self.requests_per_sec:.2f} req/s")


@dataclass(frozen=True)
class Comparison:
    case: Case
    predicted_ttft_p99_ms: float  # inf: the planner calls the load more than the engine holds
    predicted_tpot_p99_ms: float
    emulated_ttft_p99_ms: float
    emulated_tpot_p99_ms: float
    requests: int
    # False when the emulated engine falls behind: its queue, hence TTFT, grows through the run
    # and its p99 measures only how long the run was.
    emulated_keeps_up: bool

    @property
    def ttft_error(self) -> float:
        """(predicted - emulated) / emulated."""
        return self.predicted_ttft_p99_ms / self.emulated_ttft_p99_ms - 1

    @property
    def tpot_error(self) -> float:
        return self.predicted_tpot_p99_ms / self.emulated_tpot_p99_ms - 1


def _spec(case: Case):
    return deployment_spec(case.model, case.gpu_type, case.quantization, case.kv_cache_dtype,
                           case.tensor_parallel_size, max_batch_size=case.max_batch_size,
                           max_num_tokens=case.max_num_tokens)


def engines(case: Case) -> tuple[Engine, EngineProfile]:
    """The planner's engine model and the emulator's profile of the case's engine."""
    spec = _spec(case)
    catalog = load_catalog()
    gpu = catalog.gpu(case.gpu_type)
    config = engine_config_for(spec)
    engine = build_engine(config.model_arch(), gpu, catalog.quantization(case.quantization),
                          catalog.kv_cache_dtype(case.kv_cache_dtype), case.tensor_parallel_size,
                          catalog.calibration, max_batch_size=case.max_batch_size,
                          max_num_tokens=case.max_num_tokens,
                          kv_cache_free_gpu_mem_fraction=KV_CACHE_FREE_GPU_MEM_FRACTION)
    return engine, profile_for_engine(config, gpu, KV_CACHE_FREE_GPU_MEM_FRACTION, enable_prefix_reuse=False)


def planner_step_ms(engine: Engine) -> Callable[[StepWork], float]:
    """The planner's cost of a step's work (`step_seconds`). The work does not say how its prompt
    tokens split between prompts or what each had cached, so their attention is counted as one
    chunk from an empty cache: exact for one prompt per step, an over-count for several."""
    def cost_ms(work: StepWork) -> float:
        context = work.kv_tokens_read / work.decode_sequences if work.decode_sequences else 0.0
        attention = prefill_attention_flops(engine.model, work.prefill_tokens, 0) if work.prefill_tokens else 0.0
        return 1000 * step_seconds(engine, work.decode_sequences, context, work.prefill_tokens, attention,
                                   prefill_sequences=work.prompts_completed)
    return cost_ms


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def arrivals(case: Case, duration_s: float, seed: int) -> list[Arrival]:
    times_s = poisson_arrivals(parse_schedule(f"constant:{case.requests_per_sec}"), duration_s,
                               np.random.default_rng(seed))
    inputs = parse_length_distribution(f"lognormal:{case.input_tokens_mean}:{case.input_tokens_p99}")
    outputs = parse_length_distribution(f"lognormal:{case.output_tokens_mean}:{case.output_tokens_p99}")
    return [Arrival(at_s * 1000, request.input_tokens, request.output_tokens)
            for at_s, request in zip(times_s, planned_requests(inputs, outputs, seed, times_s))]


def compare(case: Case, duration_s: float = 1200.0, seed: int = 0, planner_step: bool = False) -> Comparison:
    """`planner_step`: the scheduler's steps cost what the planner's step model says, not the
    emulator's linear profile, so that only the queueing differs."""
    engine, profile = engines(case)
    predicted = predict_at_load(engine, case.requests_per_sec, case.input_tokens_mean, case.input_tokens_p99,
                                case.output_tokens_mean, case.output_tokens_p99, 0.0)
    step_ms = planner_step_ms(engine) if planner_step else None
    served = [request for request in serve(profile, arrivals(case, duration_s, seed), step_ms=step_ms)
              if request.arrival.arrival_ms >= WARM_UP_S * 1000]
    tpots = [request.tpot_ms for request in served if request.tpot_ms is not None]
    ttfts = [request.ttft_ms for request in served]
    quarter = len(ttfts) // 4
    keeps_up = statistics.median(ttfts[-quarter:]) <= 2 * statistics.median(ttfts[:quarter]) + 1000
    return Comparison(case, predicted.ttft_p99_ms, predicted.tpot_p99_ms, p99(ttfts), p99(tpots), len(served),
                      keeps_up)


def error_summary(errors: list[float]) -> tuple[float, float]:
    """(median, p90) of the absolute relative errors."""
    magnitudes = sorted(abs(error) for error in errors)
    return statistics.median(magnitudes), magnitudes[min(len(magnitudes) - 1, int(0.9 * len(magnitudes)))]


def planned_replicas(fleet: Case, slo_ttft_p99_ms: float) -> int | None:
    """The replicas `plan()` gives the fleet's engine (configuration pinned, replicas free) at
    the fleet's rate, as the operator plans them: p99 TTFT `slo_ttft_p99_ms`, TPOT loose enough
    not to bind, the KV pool as `engines` builds it, and no serving release's limits (which formats
    a release serves without a checkpoint is not what is compared). None when no count meets it."""
    request = plan_request_from_spec(_spec(fleet))
    request = dataclasses.replace(
        request, slo=SloTargets(slo_ttft_p99_ms, 1000.0),
        workload=Workload(fleet.input_tokens_mean, fleet.input_tokens_p99, fleet.output_tokens_mean,
                          fleet.output_tokens_p99, fleet.requests_per_sec),
        space=dataclasses.replace(request.space, pinned_replicas=None, gpu_budget=None, release=None,
                                  release_support=None,
                                  kv_cache_free_gpu_mem_fraction=KV_CACHE_FREE_GPU_MEM_FRACTION))
    planned = plan(request)
    return planned.replicas if planned.feasible else None


def fewest_replicas(fleet: Case, slo_ttft_p99_ms: float, split: str, duration_s: float = 1200.0) -> int | None:
    """Fewest emulated replicas whose p99 TTFT meets the SLO with the fleet's Poisson arrivals
    split at random (each replica Poisson at rate / n) or round-robin (arrival i to i mod n).
    None when `MOST_REPLICAS` do not."""
    _, profile = engines(fleet)
    stream = arrivals(fleet, duration_s, seed=0)
    for replicas in range(1, MOST_REPLICAS + 1):
        if split == "random":
            shares = [arrivals(dataclasses.replace(fleet, requests_per_sec=fleet.requests_per_sec / replicas),
                               duration_s, seed=0)]
        else:
            shares = [stream[index::replicas] for index in range(replicas)]
        ttfts = [request.ttft_ms for share in shares for request in serve(profile, share)
                 if request.arrival.arrival_ms >= WARM_UP_S * 1000]
        if p99(ttfts) <= slo_ttft_p99_ms:
            return replicas
    return None
