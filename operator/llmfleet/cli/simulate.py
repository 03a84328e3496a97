"""`llmfleet simulate`: what a spec would do with a trace or schedule, in virtual time
(llmfleet.simulation): plan, replicas, routing, metrics, autoscaler."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from llmfleet import exit_codes
from llmfleet.cli.inputs import BadInput, positive_float
from llmfleet.cli.load import TRAFFIC_SYNTAX, add_arrival_arguments, add_length_arguments
from llmfleet.cli.planning import read_plan_request
from llmfleet.settings import OperatorSettings
from llmfleet.simulation.routing import DEFAULT_ROUTING, ROUTINGS

# The operator's and the sandbox's defaults, each a flag here.
DEFAULT_SCRAPE_INTERVAL_SECONDS = 15.0  # the chart's PodMonitor and the sandbox's Prometheus
# docs/autoscaling.md: in the sandbox new replicas serve about 8 s after the scale-up (pod start,
# engine load, readiness probe); a real engine loads in minutes.
DEFAULT_START_UP_DELAY_SECONDS = 8.0


def add_commands(commands) -> None:
    simulate = commands.add_parser(
        "simulate", help="replay a trace or schedule against a spec's plan and autoscaler, in virtual time",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan the LLMDeployment, then serve the traffic with its replicas in virtual time: each\n"
                    "replica the emulated engine's scheduler (the sandbox's), the Service's routing,\n"
                    "Prometheus scraping the pods, and with spec.autoscaling the operator's autoscaler\n"
                    "deciding on what Prometheus would answer, new replicas serving after a start-up delay.\n"
                    "Reports SLO attainment, latency, replica-seconds, GPU-hours, relative cost and every\n"
                    "scaling decision (summary.json, timeline.svg in --output-dir). docs/simulate.md.\n\n"
                    + TRAFFIC_SYNTAX + "\n"
                    f"Exit codes: {exit_codes.OK} simulated; {exit_codes.NOT_FEASIBLE} nothing meets the spec; "
                    f"{exit_codes.BAD_INPUT} bad flags or files.")
    simulate.add_argument("-f", "--file", required=True, metavar="FILE",
                          help="LLMDeployment manifest (YAML or JSON); - reads stdin")
    traffic = simulate.add_mutually_exclusive_group(required=True)
    add_arrival_arguments(traffic, None)
    add_length_arguments(simulate, "length of the schedule")
    simulate.add_argument("--seed", type=int, default=0, help="seed for arrivals and lengths (default 0)")
    simulate.add_argument("--scrape-interval-seconds", type=positive_float, default=DEFAULT_SCRAPE_INTERVAL_SECONDS,
                          metavar="S", help="how often Prometheus scrapes the pods; the autoscaler's query "
                                            "window follows from it (default %(default)g)")
    simulate.add_argument("--reconcile-interval-seconds", type=positive_float, metavar="S",
                          default=OperatorSettings.timer_interval_seconds,
                          help="how often the operator passes an autoscaled deployment (default %(default)g)")
    simulate.add_argument("--start-up-delay-seconds", type=_non_negative, metavar="S",
                          default=DEFAULT_START_UP_DELAY_SECONDS,
                          help="from a scale-up to the new replica serving (default %(default)g, the sandbox's)")
    simulate.add_argument("--routing", choices=ROUTINGS, default=DEFAULT_ROUTING,
                          help="how the Service spreads requests: at random per connection (kube-proxy's "
                               "default iptables mode, and the sandbox's), round-robin or least-connections "
                               "(its IPVS mode's rr and lc) (default %(default)s)")
    simulate.add_argument("--output-dir", default="llmfleet-simulate", metavar="DIR",
                          help="where summary.json and timeline.svg go (default ./llmfleet-simulate)")
    simulate.add_argument("-o", "--output", choices=("table", "json"), default="table",
                          help="output format (default table)")
    simulate.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    simulate.set_defaults(handler=_run_simulate)


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _traffic(args):
    from llmfleet.loadgen.command import LoadInputError, length_distributions, open_loop_plan
    from llmfleet.simulation.replica import Arrival

    if not args.duration_s > 0:
        raise BadInput(f"--duration-s must be greater than 0, got {args.duration_s}")
    try:
        requests, _ = open_loop_plan(args, *length_distributions(args))
    except LoadInputError as error:
        raise BadInput(str(error)) from None
    return [Arrival(request.arrival_s * 1000, request.input_tokens, request.output_tokens) for request in requests]


def _progress(quiet: bool):
    if quiet:
        return None
    started = time.monotonic()

    def show(virtual_s: float, last_arrival_s: float) -> None:
        print(f"\rllmfleet simulate: {virtual_s:,.0f} of {last_arrival_s:,.0f} s of traffic, "
              f"{time.monotonic() - started:.1f} s", end="", file=sys.stderr, flush=True)
    return show


def _run_simulate(args) -> int:
    from llmfleet.catalog import load_catalog
    from llmfleet.planner import format_plan_table, plan
    from llmfleet.render.pod import gpus_per_replica
    from llmfleet.simulation.deployment import exported_queue_series, fleet_for, query_window_seconds
    from llmfleet.simulation.fleet import FleetSettings, simulate
    from llmfleet.simulation.plot import timeline_svg
    from llmfleet.simulation.report import Costs, format_summary, summarize

    spec, request = read_plan_request(args.file)
    arrivals = _traffic(args)  # every input is checked before the plan is made
    result = plan(request)
    if not result.feasible:
        print(format_plan_table(result), file=sys.stderr)
        print("llmfleet simulate: no configuration meets the spec; nothing to simulate", file=sys.stderr)
        return exit_codes.NOT_FEASIBLE
    catalog = load_catalog()
    fleet = fleet_for(spec, result, catalog)
    settings = FleetSettings(
        scrape_interval_seconds=args.scrape_interval_seconds,
        window_seconds=query_window_seconds(args.scrape_interval_seconds),
        reconcile_interval_seconds=args.reconcile_interval_seconds,
        start_up_delay_seconds=args.start_up_delay_seconds, routing=args.routing,
        seed=args.seed, **exported_queue_series(spec))
    started = time.monotonic()
    run = simulate(fleet, settings, arrivals, _progress(args.quiet))
    wall_s = time.monotonic() - started
    if not args.quiet:
        print(file=sys.stderr)
    costs = Costs(gpus_per_replica(result), catalog.gpus[result.gpu_type].relative_cost_per_gpu_hour)
    summary = {"plan": result.summary, "initial_replicas": fleet.initial_replicas,
               "autoscaling": fleet.autoscaling is not None, "routing": args.routing,
               "scrape_interval_s": settings.scrape_interval_seconds, "query_window_s": settings.window_seconds,
               "reconcile_interval_s": settings.reconcile_interval_seconds,
               "start_up_delay_s": settings.start_up_delay_seconds,
               **summarize(run, spec.slo.ttft_p99_ms, spec.slo.tpot_p99_ms, costs),
               "virtual_seconds_per_second": round(run.end_s / wall_s, 1) if wall_s > 0 else None}
    output_dir = Path(args.output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n",
                                                 encoding="utf-8")
        (output_dir / "timeline.svg").write_text(
            timeline_svg(run, spec.slo.ttft_p99_ms, f"{result.summary}: {len(arrivals)} requests, "
                                                    f"{run.end_s:,.0f} s"), encoding="utf-8")
    except OSError as error:
        raise BadInput(f"--output-dir {args.output_dir}: cannot write: {error.strerror}") from None
    if args.output == "json":
        print(json.dumps(summary, indent=2, allow_nan=False))
    else:
        print(f"plan                {result.summary}, {fleet.initial_replicas} replicas to start"
              f"{', autoscaled' if fleet.autoscaling else ''}")
        print(format_summary(summary))
        print(f"simulated           {run.end_s:,.0f} s in {wall_s:.1f} s")
    if not args.quiet:
        print(f"llmfleet simulate: wrote {output_dir / 'summary.json'}, {output_dir / 'timeline.svg'}", file=sys.stderr)
    return exit_codes.OK
