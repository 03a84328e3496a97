"""The load generator's own overhead, against a tritonserver whose emulated engine answers at once.

Measures (client and server share this machine's cores, so these are floors of the pair):
  - the cost of opening a gRPC stream (client + start_stream + stop_stream + close), which is
    what a stream per request would add to every request, against reusing streams;
  - open-loop runs at rising rates: send lag (arrival time to send), callback time per token,
    TTFT of a near-instant engine (the client + Triton floor);
  - a closed loop streaming many tokens: the tokens/s the client absorbs.
Prints markdown for docs/loadgen.md.
Run: .venv/bin/python benchmarks/bench_loadgen.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator" / "tests"))

import tritonclient.grpc as grpcclient  # noqa: E402
from test_emulator_triton import BASE_PROFILE, _start_triton  # noqa: E402

from llmfleet.loadgen.lengths import FixedLength  # noqa: E402
from llmfleet.loadgen.runner import Target, run_closed_loop, run_open_loop  # noqa: E402
from llmfleet.loadgen.schedule import parse_schedule, poisson_arrivals  # noqa: E402
from llmfleet.loadgen.stats import Slo, summarize  # noqa: E402
from llmfleet.loadgen.workload import PromptFactory, planned_requests  # noqa: E402

import numpy as np  # noqa: E402

# Steps of 0.05 ms: the engine's own time is negligible, what remains is Triton and the client.
INSTANT_PROFILE = {**BASE_PROFILE, "prefillMsPerToken": 0.0, "prefillFixedMs": 0.0, "decodeStepBaseMs": 0.05,
                   "decodeStepMsPerSequence": 0.0, "decodeStepMsPerKvToken": 0.0, "jitterFraction": 0.0,
                   "maxBatchSize": 256, "maxNumTokens": 8192}
RATES_PER_SECOND = (50, 100, 200)
RUN_S = 10


def stream_open_ms(url: str, count: int = 50) -> float:
    durations = []
    for _ in range(count):
        start = time.perf_counter()
        client = grpcclient.InferenceServerClient(url)
        client.start_stream(callback=lambda result, error: None)
        client.stop_stream()
        client.close()
        durations.append((time.perf_counter() - start) * 1000)
    return statistics.median(durations)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server_lifetime = _start_triton(Path(tmp), INSTANT_PROFILE)
        server = next(server_lifetime)
        try:
            target = Target([server.grpc_url], "tensorrt_llm")
            prompts = PromptFactory(seed=0)
            print(f"machine: {os.cpu_count()} CPUs\n")
            print(f"opening and closing one stream: median {stream_open_ms(server.grpc_url):.2f} ms\n")
            print("| open loop, 32 in / 16 out tokens | requests | send lag p50 / p99 ms | callback p50 / p99 us "
                  "| TTFT p50 / p99 ms | ITL p50 / p99 ms |")
            print("|---|---|---|---|---|---|")
            for rate in RATES_PER_SECOND:
                arrivals = poisson_arrivals(parse_schedule(str(rate)), RUN_S, np.random.default_rng(rate))
                plan = list(planned_requests(FixedLength(32), FixedLength(16), 0, arrivals))
                result = run_open_loop(target, plan, prompts, RUN_S, 4096, 60, quiet=True)
                summary = summarize(result.records, result.duration_s, Slo(), RUN_S, result.client)
                client = summary["client"]
                print(f"| {rate}/s | {summary['completed']}/{summary['requests']} "
                      f"| {client['send_lag_ms']['p50']} / {client['send_lag_ms']['p99']} "
                      f"| {client['callback_us']['p50']} / {client['callback_us']['p99']} "
                      f"| {summary['ttft_ms']['p50']} / {summary['ttft_ms']['p99']} "
                      f"| {summary['itl_ms']['p50']} / {summary['itl_ms']['p99']} |")
            print("\n| closed loop, 32 in / 512 out tokens | output tokens/s | callback p50 / p99 us "
                  "| ITL p50 / p99 ms |")
            print("|---|---|---|---|")
            for concurrency in (1, 8, 32):
                requests = planned_requests(FixedLength(32), FixedLength(512), 0)
                result = run_closed_loop(target, requests, prompts, concurrency, RUN_S, 60, quiet=True)
                summary = summarize(result.records, result.duration_s, Slo(), RUN_S, result.client)
                client = summary["client"]
                print(f"| {concurrency} clients | {summary['output_tokens_per_second']:.0f} "
                      f"| {client['callback_us']['p50']} / {client['callback_us']['p99']} "
                      f"| {summary['itl_ms']['p50']} / {summary['itl_ms']['p99']} |")
        finally:
            server_lifetime.close()


if __name__ == "__main__":
    main()
