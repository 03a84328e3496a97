"""Plan time for DeepSeek-R1 over every layout (issue 28: goal under 1 s): every catalog GPU,
quantisation and KV dtype, TP 1/2/4/8, PP 1/2/4 where TP alone does not hold the weights, EP over
every divisor of TP, attention data parallelism; no release limits and a quality budget that
admits every format, so nothing is left out of the search. Prints the median and worst of a
few runs, and the plans each GPU type gets.

Run: PYTHONPATH=operator .venv/bin/python benchmarks/bench_plan_layouts.py
"""

from __future__ import annotations

import statistics
import time

from llmfleet.catalog import load_catalog
from llmfleet.planner import PlanRequest, SearchSpace, SloTargets, Workload, plan

REPEATS = 5
GOAL_SECONDS = 1.0


def main() -> None:
    catalog = load_catalog()
    request = PlanRequest(
        catalog.model("deepseek-r1"),
        Workload(input_tokens_mean=4000, input_tokens_p99=8000, output_tokens_mean=1000, output_tokens_p99=4000,
                 peak_requests_per_sec=8),
        SloTargets(ttft_p99_ms=5000, tpot_p99_ms=100, max_quality_loss_percent=100.0),
        SearchSpace(gpu_types=tuple(catalog.gpus), quantizations=tuple(catalog.quantizations),
                    kv_cache_dtypes=tuple(catalog.kv_cache_dtypes)))
    seconds = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = plan(request, catalog)
        seconds.append(time.perf_counter() - start)
    print(f"DeepSeek-R1 over every layout: median {statistics.median(seconds):.3f} s, worst {max(seconds):.3f} s "
          f"over {REPEATS} runs (goal < {GOAL_SECONDS:g} s); {result.rationale[0]}")
    print(f"chosen: {result.replicas} x {result.gpu_type} {result.layout.label} {result.quantization} "
          f"KV {result.kv_cache_dtype}")
    for gpu in catalog.gpus:
        one = plan(PlanRequest(request.model, request.workload, request.slo,
                               SearchSpace(gpu_types=(gpu,), quantizations=request.space.quantizations,
                                           kv_cache_dtypes=request.space.kv_cache_dtypes)), catalog)
        print(f"  {gpu}: " + (f"{one.replicas} x {one.layout.label} {one.quantization} KV {one.kv_cache_dtype}, "
                              f"{one.nodes_per_replica} node(s) per replica" if one.feasible else one.rationale[0]))


if __name__ == "__main__":
    main()
