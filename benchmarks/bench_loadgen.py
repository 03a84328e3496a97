"""The load generator's own overhead, against a tritonserver on the fastest engine the catalog has.

The server is the rendered ensemble on the sandbox image's emulated backend (as a serving pod runs
it) for Llama 3.1 8B in FP8 on a B200: its steps take a few milliseconds (the planner's fixed
step overhead included), printed first; what the client adds comes on top of that floor.

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
from triton_process import MODEL, deployment_spec, start_triton  # noqa: E402

from llmfleet.loadgen.lengths import FixedLength  # noqa: E402
from llmfleet.loadgen.runner import Target, run_closed_loop, run_open_loop  # noqa: E402
from llmfleet.loadgen.schedule import parse_schedule, poisson_arrivals  # noqa: E402
from llmfleet.loadgen.stats import Slo, summarize  # noqa: E402
from llmfleet.loadgen.workload import PromptFactory, planned_requests  # noqa: E402

import numpy as np  # noqa: E402

FAST_ENGINE = deployment_spec("llama-3.1-8b", "B200-180GB", "FP8", "FP8", 1, max_batch_size=256,
                              max_num_tokens=8192, max_input_len=2048, max_seq_len=4096)
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
    with tempfile.TemporaryDirectory() as tmp, start_triton(Path(tmp), FAST_ENGINE) as server:
        target = Target([server.grpc_url], MODEL)
        prompts = PromptFactory(seed=0)
        print(f"machine: {os.cpu_count()} CPUs; engine: decode step {server.profile.decode_step_base_ms:.2f} ms, "
              f"{server.profile.prefill_ms_per_token:.4f} ms per prompt token\n")
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


if __name__ == "__main__":
    main()
