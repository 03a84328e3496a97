"""`llmfleet fleet status`: the cluster's GPUs and every LLMDeployment, with SLO attainment
when Prometheus is given."""

from __future__ import annotations

import sys

from llmfleet.cli.inputs import BadInput
from llmfleet.cli.prometheus import add_prometheus_arguments, prometheus_connection


def add_commands(commands) -> None:
    fleet = commands.add_parser(
        "fleet", help="the cluster's GPUs and every LLMDeployment at a glance",
        description="GPUs by type and by node pool (nodes, allocatable, held by pods, free, most free on one "
                    "node) and, for every LLMDeployment "
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

    from llmfleet.fleet import fleet_status, gpu_inventory
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
    print(fleet_status(gpu_inventory(nodes, pods), deployments, attainment,
                       args.window_s if connection is not None else None))
    return 0
