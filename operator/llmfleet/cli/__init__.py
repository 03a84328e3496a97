"""The `llmfleet` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from llmfleet import exit_codes
from llmfleet.cli import planning, run
from llmfleet.cli.inputs import BadInput, positive_int
from llmfleet.cli.prometheus import add_prometheus_arguments, prometheus_connection

# What plug-ins' commands import from here (llmfleet_sandbox.cli: BadInput, positive_int).
__all__ = ["CLI_PLUGIN_GROUP", "BadInput", "build_parser", "main", "positive_int"]


# Commands from outside the product (the sandbox's `llmfleet sandbox`): each entry point of this
# group is a callable that gets the subparsers and adds its commands, whose handlers may raise
# BadInput like the product's own.
CLI_PLUGIN_GROUP = "llmfleet.cli_plugins"


def _add_plugin_commands(commands) -> None:
    for entry_point in sorted(importlib.metadata.entry_points(group=CLI_PLUGIN_GROUP), key=lambda point: point.name):
        try:
            add_commands = entry_point.load()
        except ModuleNotFoundError as error:
            # The operator image declares the sandbox's entry point but ships the product alone.
            if error.name is not None and f"{entry_point.module}.".startswith(f"{error.name}."):
                continue
            raise
        add_commands(commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmfleet",
        description="Plan, serve and autoscale LLMs on Kubernetes with Triton + TensorRT-LLM.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_plugin_commands(commands)  # first, where `sandbox` has always stood in --help
    planning.add_commands(commands)
    run.add_commands(commands)
    _add_load_parser(commands)
    _add_rollout_parser(commands)
    _add_fleet_parser(commands)
    return parser


def _add_fleet_parser(commands) -> None:
    fleet = commands.add_parser(
        "fleet", help="the cluster's GPUs and every LLMDeployment at a glance",
        description="GPUs by type (nodes, allocatable, held by pods, free) and, for every LLMDeployment "
                    "in the cluster, its priority class, plan, GPUs, ready replicas, p99 TTFT, TTFT target, "
                    "SLO attainment (from Prometheus) and Planned condition.")
    fleet_commands = fleet.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    status = fleet_commands.add_parser("status", help="print the report")
    status.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then "
                                                           "$KUBECONFIG, then ~/.kube/config)")
    add_prometheus_arguments(status, "for SLO attainment; without it attainment is not shown")
    status.add_argument("--window-s", type=int, default=300, metavar="S",
                        help="attainment over the last S seconds (default %(default)s)")
    status.set_defaults(handler=_run_fleet)


def _run_fleet(args) -> int:
    import datetime

    from llmfleet.fleet import fleet_status, gpus_by_type
    from llmfleet.k8s import KubeGateway, load_api_client

    if args.window_s < 1:
        raise BadInput(f"--window-s must be at least 1, got {args.window_s}")
    connection = prometheus_connection(args)
    nodes, pods, deployments = KubeGateway(load_api_client(args.kubeconfig)).list_cluster()
    attainment = {}
    if connection is not None:
        from llmfleet.metrics import PrometheusMetrics
        from llmfleet.metrics.cadence import at_least

        metrics = PrometheusMetrics(connection)
        now = datetime.datetime.now(datetime.timezone.utc)
        for deployment in deployments:
            metadata, target = deployment["metadata"], ((deployment.get("spec") or {}).get("slo") or {}).get("ttftP99Ms")
            if target is None:
                continue
            namespace, name = metadata["namespace"], metadata["name"]
            cadence = metrics.scrape_cadence(namespace, name, now)
            window = at_least(args.window_s, cadence.shortest_window_seconds)
            if (widening := window.widening("--window-s", cadence)) is not None:
                print(f"{namespace}/{name}: {widening}", file=sys.stderr)
            attainment[(namespace, name)] = metrics.ttft_attainment(namespace, name, target, window.seconds, now)
        metrics.close()
    print(fleet_status(gpus_by_type(nodes, pods), deployments, attainment,
                       args.window_s if connection is not None else None))
    return 0


def _add_rollout_parser(commands) -> None:
    from llmfleet.rollout.machine import COMMANDS

    actions = {"status": "show the last canary rollout: phase, step, canary share, message", **COMMANDS}
    rollout = commands.add_parser(
        "rollout", help="watch and steer canary rollouts (spec.rollout.steps)",
        description="Watch and steer the canary rollout of an LLMDeployment. Commands are written "
                    "to the annotation llmfleet.io/rollout-command; the operator carries each out once "
                    "on its next pass and records it in status.canary.lastCommand.",
        epilog="\n".join(f"  {action:8} {text}" for action, text in actions.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    rollout.add_argument("action", choices=tuple(actions), metavar="ACTION",
                         help="one of: " + ", ".join(actions))
    rollout.add_argument("name", metavar="NAME", help="the LLMDeployment")
    rollout.add_argument("-n", "--namespace", default="default", help="its namespace (default %(default)s)")
    rollout.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then "
                                                            "$KUBECONFIG, then ~/.kube/config)")
    rollout.set_defaults(handler=_run_rollout)


def _run_rollout(args) -> int:
    import time

    from llmfleet.k8s import KubeGateway, load_api_client
    from llmfleet.reconcile import ROLLOUT_COMMAND_ANNOTATION

    gateway = KubeGateway(load_api_client(args.kubeconfig))
    deployment = gateway.get_llm_deployment(args.namespace, args.name)
    if deployment is None:
        raise BadInput(f"no LLMDeployment {args.namespace}/{args.name}; check NAME and --namespace")
    if args.action != "status":
        value = f"{args.action}/{time.time_ns()}"
        gateway.annotate_llm_deployment(args.namespace, args.name, ROLLOUT_COMMAND_ANNOTATION, value)
        print(f"{args.namespace}/{args.name}: {ROLLOUT_COMMAND_ANNOTATION}={value}; the operator carries it out "
              "on its next pass (`llmfleet rollout status` shows the result)")
        return 0
    status = deployment.get("status") or {}
    canary = status.get("canary")
    print(f"stable revision   {status.get('stableRevision') or '-'}")
    print(f"current revision  {status.get('currentRevision') or '-'}")
    if not canary:
        print("no canary rollout recorded (spec.rollout.steps set? a new revision since?)")
        return 0
    for label, key in (("phase", "phase"), ("canary revision", "canaryRevision"), ("step", "stepIndex"),
                       ("canary replicas", "canaryReplicas"), ("canary share %", "weightPercent"),
                       ("since", "stepStartedTime"), ("message", "message"), ("last command", "lastCommand"),
                       ("rolled back", "failedRevisions")):
        value = canary.get(key)
        if value is not None:
            print(f"{label:17} {', '.join(value) if isinstance(value, list) else value}")
    return 0


def _run_load(args) -> int:
    from llmfleet.loadgen.command import LoadInputError, run

    try:
        return run(args)
    except LoadInputError as error:
        raise BadInput(str(error)) from None


def _add_load_parser(commands) -> None:
    load = commands.add_parser(
        "load", help="replay traffic against Triton and measure TTFT, TPOT, goodput",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Stream requests to Triton's `tensorrt_llm` model over gRPC and record each\n"
                    "request's TTFT, TPOT, inter-token gaps and end-to-end latency.\n\n"
                    "Open loop (default): Poisson arrivals on --schedule (or a --trace), sent at their\n"
                    "time whatever is in flight. --sweep: closed loops of N clients per step, then the\n"
                    "TTFT-TPOT-throughput Pareto frontier (pareto.png, sweep.json).\n\n"
                    "Schedules (requests/s; times in s from the start; the last rate holds):\n"
                    "  5 | constant:5          a constant rate\n"
                    "  steps:0:2,60:8,120:2    2/s from 0 s, 8/s from 60 s, 2/s from 120 s\n"
                    "  ramp:0:1,60:10,120:1    linear between the points\n"
                    "  csv:PATH                rows time_s,rate (diurnal curve), linear between rows\n"
                    "Lengths (tokens): N | fixed:N | uniform:LOW:HIGH | lognormal:MEAN:P99\n"
                    "Trace: CSV with header arrival_s,input_tokens,output_tokens, or .jsonl objects\n"
                    "with those keys.\n\n"
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
    traffic.add_argument("--schedule", default="constant:1", metavar="SPEC",
                         help="arrival rate schedule, see above (default constant:1)")
    traffic.add_argument("--trace", metavar="FILE", help="replay arrivals and lengths from a CSV or JSONL trace")
    traffic.add_argument("--sweep", metavar="N,N,...", help="closed-loop concurrency steps, e.g. 1,2,4,8,16,32")
    load.add_argument("--duration-s", type=float, metavar="S", default=60.0,
                      help="length of the schedule, or of each --sweep step (default 60)")
    load.add_argument("--input-tokens", default="lognormal:512:2048", metavar="DIST",
                      help="prompt length distribution (default lognormal:512:2048)")
    load.add_argument("--output-tokens", default="lognormal:128:512", metavar="DIST",
                      help="output length distribution (default lognormal:128:512)")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BadInput as error:
        print(f"llmfleet {args.command}: {error}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except BrokenPipeError:
        # The reader went away (`llmfleet plan ... | head`): stop quietly like other Unix tools.
        # Pointing stdout at /dev/null keeps Python's exit-time flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
