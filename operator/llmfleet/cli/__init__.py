"""The `llmfleet` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from llmfleet import exit_codes
from llmfleet.cli import load, planning, run
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
    load.add_commands(commands)
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
