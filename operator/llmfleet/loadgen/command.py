"""`llmfleet load`: flags to a workload, a run, and the output files."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from llmfleet import exit_codes
from llmfleet.loadgen.lengths import LengthDistribution, LengthError, parse_length_distribution
from llmfleet.loadgen.runner import Target, run_closed_loop, run_open_loop, write_json, write_requests_csv
from llmfleet.loadgen.schedule import ScheduleError, parse_schedule, poisson_arrivals, schedule_from_csv
from llmfleet.loadgen.stats import Slo, pareto_frontier, summarize
from llmfleet.loadgen.transport import TargetUnavailable, check_endpoints
from llmfleet.loadgen.workload import PlannedRequest, PromptFactory, TraceError, parse_trace, planned_requests


class LoadInputError(ValueError):
    """A flag or file that cannot be used; the message names the flag and the fix."""


@dataclass(frozen=True)
class _Common:
    target: Target
    prompts: PromptFactory
    slo: Slo
    output_dir: Path


def _endpoints(args) -> list[str]:
    flag, text = ("--target", args.target) if args.target else ("--endpoints", args.endpoints)
    endpoints = [item.strip() for item in text.split(",") if item.strip()]
    if flag == "--target" and len(endpoints) != 1:
        raise LoadInputError("--target takes one HOST:PORT; for several use --endpoints A:8001,B:8001")
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise LoadInputError(f"{flag}: {endpoint!r} is not HOST:PORT (Triton's gRPC port is usually 8001)")
    if not endpoints:
        raise LoadInputError(f"{flag}: give at least one HOST:PORT")
    return endpoints


def _parsed(flag: str, parse, text: str):
    try:
        return parse(text)
    except (ScheduleError, LengthError, TraceError, ValueError) as error:
        raise LoadInputError(f"{flag} {text}: {error}") from None


def _read(flag: str, path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise LoadInputError(f"{flag}: cannot read {path}: {error.strerror}") from None


def _schedule(args):
    if args.schedule.startswith("csv:"):
        path = args.schedule.removeprefix("csv:")
        return _parsed("--schedule", schedule_from_csv, _read("--schedule", path))
    return _parsed("--schedule", parse_schedule, args.schedule)


def _check_positive(flag: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise LoadInputError(f"{flag} must be greater than 0, got {value}")


def _common(args) -> _Common:
    for flag, value in (("--duration-s", args.duration_s), ("--window-s", args.window_s),
                        ("--drain-timeout-s", args.drain_timeout_s), ("--slo-ttft-ms", args.slo_ttft_ms),
                        ("--slo-tpot-ms", args.slo_tpot_ms), ("--max-in-flight", args.max_in_flight),
                        ("--max-stream-age-s", args.max_stream_age_s)):
        _check_positive(flag, value)
    if not 0 <= args.shared_prefix_fraction <= 1:
        raise LoadInputError(f"--shared-prefix-fraction must be within 0..1, got {args.shared_prefix_fraction}")
    return _Common(Target(_endpoints(args), args.model), PromptFactory(args.seed, args.shared_prefix_fraction),
                   Slo(args.slo_ttft_ms, args.slo_tpot_ms), Path(args.output_dir))


def run(args) -> int:
    """The `llmfleet load` handler; raises LoadInputError for bad flags (exit 2)."""
    common = _common(args)
    input_lengths, output_lengths = length_distributions(args)
    # Every flag and file is checked before the first connection.
    if args.sweep is not None:
        concurrencies = _parsed("--sweep", _concurrencies, args.sweep)
    else:
        plan, duration_s = open_loop_plan(args, input_lengths, output_lengths)
    try:
        model = check_endpoints(common.target.endpoints, common.target.model)
    except TargetUnavailable as error:
        print(f"llmfleet load: {error}", file=sys.stderr)
        return exit_codes.TARGET_UNAVAILABLE
    common = replace(common, target=Target(common.target.endpoints, model))
    common.output_dir.mkdir(parents=True, exist_ok=True)
    if args.sweep is not None:
        return _sweep(common, planned_requests(input_lengths, output_lengths, args.seed), concurrencies, args)
    return _open_loop(common, plan, duration_s, args)


def length_distributions(args) -> tuple[LengthDistribution, LengthDistribution]:
    """--input-tokens and --output-tokens."""
    return (_parsed("--input-tokens", parse_length_distribution, args.input_tokens),
            _parsed("--output-tokens", parse_length_distribution, args.output_tokens))


def open_loop_plan(args, input_lengths: LengthDistribution,
                   output_lengths: LengthDistribution) -> tuple[list[PlannedRequest], float]:
    """The requests and the schedule's length: from --trace, or from --schedule, --duration-s,
    the lengths and --seed (`llmfleet load`'s open loop, and `llmfleet simulate`)."""
    if args.trace is not None:
        jsonl = args.trace.endswith((".jsonl", ".json"))
        plan = _parsed("--trace", lambda text: parse_trace(text, jsonl), _read("--trace", args.trace))
        return plan, plan[-1].arrival_s
    arrivals = poisson_arrivals(_schedule(args), args.duration_s, np.random.default_rng([args.seed, 0]))
    plan = list(planned_requests(input_lengths, output_lengths, args.seed, arrivals))
    if not plan:
        raise LoadInputError("--schedule: no request arrives within --duration-s; raise the rate or the duration")
    return plan, args.duration_s


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        raise ValueError("expected whole numbers separated by commas, e.g. 1,2,4,8,16,32") from None
    if not values or min(values) < 1:
        raise ValueError("every concurrency must be at least 1")
    return values


@contextlib.contextmanager
def _stop_on_interrupt():
    """SIGINT (Ctrl-C) or SIGTERM ends a run early and cleanly: no new request is sent, those in
    flight finish, and the results cover what was sent. A second one abandons them."""
    stop = threading.Event()

    def request_stop(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        print(f"llmfleet load: {signal.Signals(signum).name}: sending no more requests; waiting for those "
              "in flight (again to abandon them)", file=sys.stderr, flush=True)
        stop.set()
    previous = {signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _open_loop(common: _Common, plan, duration_s: float, args) -> int:
    with _stop_on_interrupt() as stop:
        result = run_open_loop(common.target, plan, common.prompts, duration_s, args.max_in_flight,
                               args.drain_timeout_s, args.quiet, args.max_stream_age_s, stop)
    sent_s = duration_s if result.stopped_at_s is None else result.stopped_at_s
    summary = {"mode": "open-loop", "schedule": None if args.trace else args.schedule, "trace": args.trace,
               "schedule_duration_s": duration_s,
               **({"stopped_at_s": round(result.stopped_at_s, 3)} if result.stopped_at_s is not None else {}),
               "offered_rate_per_second": _round_rate(len(result.records), sent_s),
               **summarize(result.records, result.duration_s, common.slo, args.window_s, result.client)}
    write_requests_csv(common.output_dir / "requests.csv", result.records)
    write_json(common.output_dir / "summary.json", summary)
    _report(summary, common.output_dir, ["requests.csv", "summary.json"], args.quiet)
    if result.client.in_flight_cap_hits:
        print(f"llmfleet load: {result.client.in_flight_cap_hits} arrivals waited for the --max-in-flight cap "
              f"({args.max_in_flight}); the run was not fully open-loop", file=sys.stderr)
    return exit_codes.OK if summary["completed"] == summary["requests"] else exit_codes.REQUESTS_FAILED


def _round_rate(count: int, duration_s: float) -> float | None:
    return round(count / duration_s, 3) if duration_s > 0 else None


def _sweep(common: _Common, requests, concurrencies: list[int], args) -> int:
    points, steps, failed = [], [], 0
    for concurrency in concurrencies:
        result = run_closed_loop(common.target, requests, common.prompts, concurrency, args.duration_s,
                                 args.drain_timeout_s, args.quiet)
        summary = summarize(result.records, result.duration_s, common.slo, args.window_s, result.client)
        write_requests_csv(common.output_dir / f"requests-concurrency-{concurrency}.csv", result.records)
        failed += summary["requests"] - summary["completed"]
        steps.append({"concurrency": concurrency, **summary})
        points.append({"concurrency": concurrency, "requests": summary["requests"], "errors": summary["errors"],
                       "requests_per_second": summary["achieved_rate_per_second"],
                       "output_tokens_per_second": summary["output_tokens_per_second"],
                       "ttft_p50_ms": summary["ttft_ms"]["p50"], "ttft_p99_ms": summary["ttft_ms"]["p99"],
                       "tpot_p50_ms": summary["tpot_ms"]["p50"], "tpot_p99_ms": summary["tpot_ms"]["p99"],
                       "goodput": summary["goodput"]})
    frontier = pareto_frontier(points)
    body = {"mode": "sweep", "step_duration_s": args.duration_s, "input_tokens": args.input_tokens,
            "output_tokens": args.output_tokens, "points": points, "pareto_frontier": frontier, "steps": steps}
    write_json(common.output_dir / "sweep.json", body)
    from llmfleet.loadgen.plot import draw_pareto

    draw_pareto(points, frontier, common.output_dir / "pareto.png",
                f"{common.target.model}: input {args.input_tokens}, output {args.output_tokens} tokens, "
                f"{args.duration_s:g} s per step")
    _report({key: body[key] for key in ("points", "pareto_frontier")}, common.output_dir,
            ["sweep.json", "pareto.png"], args.quiet)
    return exit_codes.OK if failed == 0 else exit_codes.REQUESTS_FAILED


def _report(body: dict, output_dir: Path, files: list[str], quiet: bool) -> None:
    """The summary on stdout (for scripts); where the files went on stderr."""
    print(json.dumps({key: value for key, value in body.items() if key != "windows"}, indent=2))
    if not quiet:
        print(f"llmfleet load: wrote {', '.join(str(output_dir / name) for name in files)}", file=sys.stderr)
