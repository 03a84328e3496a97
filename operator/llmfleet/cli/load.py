"""`llmfleet load`: the load generator (llmfleet.loadgen) from the command line."""

from __future__ import annotations

import argparse

from llmfleet import exit_codes
from llmfleet.cli.inputs import BadInput


def add_commands(commands) -> None:
    load = commands.add_parser(
        "load", help="replay traffic against Triton and measure TTFT, TPOT, goodput",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Stream requests to Triton's `tensorrt_llm` model over gRPC and record each\n"
                    "request's TTFT, TPOT, inter-token gaps and end-to-end latency.\n\n"
                    "Open loop (default): Poisson arrivals on --schedule (or a --trace), sent at their\n"
                    "time whatever is in flight. --sweep: closed loops of N clients per step, then the\n"
                    "TTFT-TPOT-throughput Pareto frontier (pareto.png, sweep.json).\n\n"
                    + TRAFFIC_SYNTAX + "\n"
                    "Writes requests.csv and summary.json to --output-dir and prints the summary.\n"
                    f"Exit codes: {exit_codes.OK} every request completed; {exit_codes.REQUESTS_FAILED} some "
                    f"failed or were truncated; {exit_codes.BAD_INPUT} bad\nflags or files; "
                    f"{exit_codes.TARGET_UNAVAILABLE} an endpoint does not answer or does not serve --model.")
    where = load.add_mutually_exclusive_group(required=True)
    where.add_argument("--target", metavar="HOST:PORT", help="one gRPC endpoint, e.g. a Service's ClusterIP:8001")
    where.add_argument("--endpoints", metavar="A:PORT,B:PORT", help="several endpoints, used round robin")
    load.add_argument("--model", default=None,
                      help="Triton model to stream from: one taking text_input/max_tokens/stream (the engine "
                           "runtime's ensemble) or text_input/sampling_param_max_tokens/streaming (the llmapi "
                           "runtime's tensorrt_llm). Default: ensemble if the first endpoint serves it, else "
                           "tensorrt_llm")
    traffic = load.add_mutually_exclusive_group()
    add_arrival_arguments(traffic, "constant:1")
    traffic.add_argument("--sweep", metavar="N,N,...", help="closed-loop concurrency steps, e.g. 1,2,4,8,16,32")
    add_length_arguments(load, "length of the schedule, or of each --sweep step")
    load.add_argument("--shared-prefix-fraction", type=float, default=0.0, metavar="F",
                      help="share of every prompt that is a common prefix, 0..1 (default 0)")
    load.add_argument("--seed", type=int, default=0, help="seed for arrivals, lengths and prompts (default 0)")
    load.add_argument("--slo-ttft-ms", type=float, default=None, metavar="MS", help="TTFT objective for goodput")
    load.add_argument("--slo-tpot-ms", type=float, default=None, metavar="MS", help="TPOT objective for goodput")
    load.add_argument("--window-s", type=float, metavar="S", default=5.0,
                      help="width of the summary's time-series windows (default 5)")
    load.add_argument("--max-in-flight", type=int, default=2048, metavar="N",
                      help="safety cap on open requests; arrivals that wait for it are reported (default 2048)")
    load.add_argument("--drain-timeout-s", type=float, metavar="S", default=120.0,
                      help="after the last arrival, how long to wait for open requests before "
                           "counting them truncated (default 120)")
    load.add_argument("--max-stream-age-s", type=float, metavar="S", default=2.0,
                      help="reopen a gRPC stream once it is this old, so that a Service, which "
                           "balances connections, spreads load onto new replicas (default 2)")
    load.add_argument("--output-dir", default="llmfleet-load", metavar="DIR",
                      help="where the CSV, JSON and PNG go (default ./llmfleet-load)")
    load.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    load.set_defaults(handler=_run_load)


# How --schedule, --trace and the lengths are written (`load` and `simulate`).
TRAFFIC_SYNTAX = ("Schedules (requests/s; times in s from the start; the last rate holds):\n"
                  "  5 | constant:5          a constant rate\n"
                  "  steps:0:2,60:8,120:2    2/s from 0 s, 8/s from 60 s, 2/s from 120 s\n"
                  "  ramp:0:1,60:10,120:1    linear between the points\n"
                  "  csv:PATH                rows time_s,rate (diurnal curve), linear between rows\n"
                  "Lengths (tokens): N | fixed:N | uniform:LOW:HIGH | lognormal:MEAN:P99\n"
                  "Trace: CSV with header arrival_s,input_tokens,output_tokens, or .jsonl objects\n"
                  "with those keys.\n")


def add_arrival_arguments(traffic, schedule_default: str | None) -> None:
    """--schedule and --trace, into the mutually exclusive group `traffic` (with
    `add_length_arguments` and --seed, what llmfleet.loadgen.command.open_loop_plan reads)."""
    traffic.add_argument("--schedule", default=schedule_default, metavar="SPEC",
                         help="arrival rate schedule, see above"
                              + (f" (default {schedule_default})" if schedule_default else ""))
    traffic.add_argument("--trace", metavar="FILE", help="replay arrivals and lengths from a CSV or JSONL trace")


def add_length_arguments(parser, duration_help: str) -> None:
    """--duration-s and the length distributions of a --schedule's requests."""
    parser.add_argument("--duration-s", type=float, metavar="S", default=60.0,
                        help=f"{duration_help} (default 60)")
    parser.add_argument("--input-tokens", default="lognormal:512:2048", metavar="DIST",
                        help="prompt length distribution (default lognormal:512:2048)")
    parser.add_argument("--output-tokens", default="lognormal:128:512", metavar="DIST",
                        help="output length distribution (default lognormal:128:512)")


def _run_load(args) -> int:
    from llmfleet.loadgen.command import LoadInputError, run

    try:
        return run(args)
    except LoadInputError as error:
        raise BadInput(str(error)) from None
