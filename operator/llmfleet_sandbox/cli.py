"""`llmfleet sandbox`: the sandbox's commands, plugged into the product's command line through
the `llmfleet.cli_plugins` entry point (pyproject.toml), so that the product never imports the
sandbox and the operator image, which ships the product alone, has no `sandbox` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from llmfleet.cli import BadInput, positive_int
from llmfleet.simulation.routing import DEFAULT_ROUTING, ROUTINGS
from llmfleet_sandbox.config import (
    MAX_INSTANCE,
    PROMETHEUS_AUTH_MODES,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_SERVICE,
    SandboxConfig,
    default_state_dir,
)


def add_commands(commands) -> None:
    """Add `sandbox` and its actions to the `llmfleet` subparsers."""
    sandbox = commands.add_parser(
        "sandbox", help="a real Kubernetes cluster with fake GPU nodes on this machine",
        description="A local cluster: real etcd, kube-apiserver, controller-manager and scheduler, "
                    "a node agent running pods as local processes on fake GPU nodes, a service "
                    "proxy and Prometheus. Needs root for per-pod network namespaces.")
    sandbox.add_argument("--state-dir", type=Path, default=None,
                         help="where the sandbox keeps its state (default: $LLMFLEET_SANDBOX_DIR "
                              "or ~/.local/state/llmfleet/sandbox, sandbox-N for --instance N)")
    sandbox.add_argument("--instance", type=int, metavar="N",
                         default=int(os.environ.get("LLMFLEET_SANDBOX_INSTANCE", "0")),
                         help="run beside other sandboxes: instance N gets bridge llmfN, pods in "
                              "10.(244+N).0.0/16, Services in 10.(96+N).0.0/24 and every port + N*100; "
                              "N is 0 to 9 (default $LLMFLEET_SANDBOX_INSTANCE or 0; the tests and "
                              "benchmarks use 1)")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    sandbox_up = sandbox_commands.add_parser("up", help="start the sandbox (idempotent)")
    sandbox_up.add_argument("--nodes", type=int, default=2, help="number of GPU nodes (default 2)")
    sandbox_up.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    sandbox_up.add_argument("--gpu-type", default="H100-SXM-80GB",
                            help="GPU type of those nodes, as named in the catalog (default H100-SXM-80GB)")
    sandbox_up.add_argument("--extra-node-pool", action="append", default=[], metavar="GPU_TYPE=NODES",
                            help="more GPU nodes of another type, numbered after the others, e.g. "
                                 "L40S-48GB=1 for a cluster of mixed pools (repeatable)")
    sandbox_up.add_argument("--service-proxy-scheduler", choices=ROUTINGS,
                            default=DEFAULT_ROUTING,
                            help="how Services spread connections over ready endpoints: random (kube-proxy's "
                                 "default iptables and nftables modes), round-robin (its IPVS mode's rr) or "
                                 "least-connections (IPVS lc); either way a connection, not a request, is "
                                 f"balanced (default {DEFAULT_ROUTING})")
    sandbox_up.add_argument("--scrape-interval", type=positive_int, default=None,
                            metavar="S", help="Prometheus scrape interval in seconds (default 15, the "
                                              "chart's PodMonitor default)")
    sandbox_up.add_argument("--prometheus-auth", choices=PROMETHEUS_AUTH_MODES, default=None,
                            help="basic: Prometheus serves HTTPS with a certificate from the sandbox's CA and "
                                 "asks for basic auth (its own web config); bearer: a proxy in the manner of "
                                 "kube-rbac-proxy serves HTTPS with such a certificate and lets a request "
                                 "through only with a Kubernetes token the sandbox's apiserver authenticates "
                                 "(TokenReview, else 401) and allows get (POST: create) on services/proxy "
                                 f"{PROMETHEUS_SERVICE} in namespace {PROMETHEUS_NAMESPACE} "
                                 "(SubjectAccessReview, else 403), Prometheus listening on loopback alone. "
                                 "`sandbox env` exports how to reach it (default none: plain HTTP)")
    sandbox_down = sandbox_commands.add_parser(
        "down", help="stop every sandbox process and remove pod networks")
    sandbox_down.add_argument("--purge", action="store_true",
                              help="also delete the state directory (cluster data, certificates)")
    sandbox_commands.add_parser("status", help="show components and addresses; exit 1 if any is down")
    sandbox_commands.add_parser("kubeconfig", help="print the admin kubeconfig path")
    sandbox_commands.add_parser(
        "demo", help="helm-install the operator chart in-cluster and apply examples/sandbox-chat.yaml")
    sandbox_commands.add_parser("env", help="print shell exports: KUBECONFIG, PATH with the "
                                            "matching kubectl first, LLMFLEET_PROMETHEUS_URL and, behind "
                                            "authentication, its CA and credential files")
    sandbox_fault = sandbox_commands.add_parser(
        "fault", help="make one revision's emulated engines slow, drifting, failing or unloadable, or its "
                      "engine build fail on a full cache (for testing)",
        description="Inject faults into the engines of one revision of one LLMDeployment (its pods, by "
                    "their llmfleet.io/deployment and llmfleet.io/revision labels); containers started "
                    "afterwards get them, running engines follow a changed --slowdown or --error-percent "
                    "within a second, and each call replaces that revision's faults: "
                    "--slowdown multiplies every prefill and decode cost, --drift adds a per-token chance "
                    "that the answer leaves the model's reference answer, --error-percent fails that share "
                    "of requests, --fail-load makes the engine fail to load (Triton exits, the container "
                    "crash-loops), --engine-cache-full makes the build's engine writes fail with ENOSPC. "
                    "A sandbox knob, not part of the LLMDeployment API; the defaults remove it.")
    sandbox_fault.add_argument("--namespace", required=True, help="the pods' namespace")
    sandbox_fault.add_argument("--deployment", required=True, metavar="NAME",
                               help="the LLMDeployment (a revision hash alone can be shared by several)")
    sandbox_fault.add_argument("--revision", required=True, help="the revision (status.currentRevision)")
    sandbox_fault.add_argument("--slowdown", type=float, default=1.0, metavar="FACTOR",
                               help="multiplier of the engine's step costs, e.g. 2 doubles TTFT (default 1)")
    sandbox_fault.add_argument("--drift", type=float, default=0.0, metavar="PROBABILITY",
                               help="added per-token chance of leaving the reference answer, e.g. 0.05 "
                                    "(default 0)")
    sandbox_fault.add_argument("--error-percent", type=float, default=0.0, metavar="PERCENT",
                               help="share of requests the engine fails, e.g. 20 (default 0)")
    sandbox_fault.add_argument("--fail-load", action="store_true",
                               help="the engine fails to load, as on a GPU without the memory for it")
    sandbox_fault.add_argument("--engine-cache-full", action="store_true",
                               help="the revision's engine build fails writing the engine: ENOSPC, as on a "
                                    "full engine cache volume")
    node_power = sandbox_commands.add_parser(
        "node-power", help="unplug a node or plug it back in (for testing node loss)",
        description="Power a sandbox node off: its pods' processes die at once and its agent stops "
                    "heartbeating, so the control plane marks it NotReady and evicts its pods once their "
                    "tolerations run out (30 s in the sandbox). Powered on, it heartbeats again, finishes "
                    "the deletion of evicted pods and runs the pods still bound to it.")
    node_power.add_argument("state", choices=("off", "on"))
    node_power.add_argument("node", help="the node's name, e.g. gpu-node-1 (kubectl get nodes)")
    scrape = sandbox_commands.add_parser(
        "scrape", help="make Prometheus lose a pod or find it again (for testing partial metrics)",
        description="Leave a pod out of Prometheus' service discovery (off) or put it back (on). The pod "
                    "goes on serving; Prometheus ends its series (staleness markers), so queries answer "
                    "without it, as when discovery or a scrape fails in a real cluster.")
    scrape.add_argument("state", choices=("off", "on"))
    scrape.add_argument("pod", help="the pod's name (kubectl get pods)")
    scrape.add_argument("--namespace", required=True, help="the pod's namespace")
    scrape_interval = sandbox_commands.add_parser(
        "scrape-interval", help="scrape one namespace's pods at an interval of its own",
        description="Prometheus scrapes the namespace's pods every SECONDS from its next discovery "
                    "refresh (2 s), as under a PodMonitor with its own interval; `default` returns them "
                    "to the sandbox's interval (`sandbox up --scrape-interval`).")
    scrape_interval.add_argument("seconds", metavar="SECONDS|default")
    scrape_interval.add_argument("--namespace", required=True)
    sandbox.set_defaults(handler=_run)


def _config(args) -> SandboxConfig:
    from llmfleet_sandbox.manager import configured

    if not 0 <= args.instance <= MAX_INSTANCE:
        raise BadInput(f"--instance must be within 0..{MAX_INSTANCE}, got {args.instance}")
    state_dir = args.state_dir or default_state_dir(args.instance)
    if args.sandbox_command != "up":
        return configured(state_dir)
    return SandboxConfig(
        state_dir=state_dir,
        node_count=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_type=args.gpu_type,
        extra_node_pools=tuple(_node_pool(text) for text in args.extra_node_pool),
        service_proxy_scheduler=args.service_proxy_scheduler,
        instance=args.instance,
        # Unset flags leave SandboxConfig's defaults, declared there.
        **{name: value for name, value in (("scrape_interval_seconds", args.scrape_interval),
                                           ("prometheus_auth", args.prometheus_auth)) if value is not None},
    )


def _scrape_seconds(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise BadInput(f"scrape-interval: expected whole seconds at least 1 or `default`, got {text!r}")
    return int(text)


def _node_pool(text: str) -> tuple[str, int]:
    gpu_type, separator, count = text.partition("=")
    if not separator or not count.isdigit() or int(count) < 1:
        raise BadInput(f"--extra-node-pool: expected GPU_TYPE=NODES with NODES at least 1 "
                       f"(e.g. L40S-48GB=1), got {text!r}")
    return gpu_type, int(count)


def _run(args) -> int:
    try:
        from llmfleet_sandbox import manager
    except ModuleNotFoundError as error:
        # The package alone is here, not its extra's dependencies (cryptography, bcrypt, pytriton).
        if error.name is None or error.name.startswith("llmfleet"):
            raise
        raise BadInput(f"the sandbox needs {error.name}, which is not installed; install the sandbox's "
                       "dependencies from a source checkout: pip install -e '.[sandbox]' "
                       "(`make sandbox` does)") from None
    from llmfleet_sandbox.gpus import gfd_labels

    config = _config(args)
    if args.sandbox_command == "up":
        if config.node_count < 1 or config.gpus_per_node < 1:
            raise SystemExit("llmfleet sandbox up: --nodes and --gpus-per-node must be at least 1")
        for flag, gpu_type in (("--gpu-type", config.gpu_type),
                               *(("--extra-node-pool", pool_type) for pool_type, _ in config.extra_node_pools)):
            try:
                gfd_labels(gpu_type, config.gpus_per_node)
            except ValueError as error:
                raise SystemExit(f"llmfleet sandbox up: {flag}: {error}") from None
        from llmfleet_sandbox.network import NetworkSetupError

        try:
            config = manager.up(config)
        except NetworkSetupError as error:  # what this machine lacks (root, nftables): no traceback
            raise SystemExit(f"llmfleet sandbox up: {error}") from None
        print(manager.status(config)[1])
        llmfleet = Path(sys.executable).parent / "llmfleet"
        print(f"\nUse it:  eval \"$({llmfleet} sandbox env)\" && kubectl get nodes")
        return 0
    if args.sandbox_command == "node-power":
        from llmfleet_sandbox import faults

        if args.node not in config.node_names():
            raise BadInput(f"node-power: no node {args.node!r}; the nodes are {', '.join(config.node_names())}")
        faults.set_node_power(config.state_dir, args.node, args.state == "on")
        print(f"node {args.node}: power {args.state}" + (
            "; its pods' processes die and its heartbeats stop" if args.state == "off" else
            "; it heartbeats again and runs the pods still bound to it"))
        return 0
    if args.sandbox_command == "scrape":
        from llmfleet_sandbox import faults

        faults.set_pod_scraped(config.state_dir, args.namespace, args.pod, args.state == "on")
        print(f"pod {args.namespace}/{args.pod}: " + (
            "back in Prometheus' service discovery" if args.state == "on" else
            "left out of Prometheus' service discovery; its series end within a scrape interval"))
        return 0
    if args.sandbox_command == "scrape-interval":
        from llmfleet_sandbox import prometheus

        seconds = None if args.seconds == "default" else _scrape_seconds(args.seconds)
        prometheus.set_namespace_scrape_interval(config.state_dir, args.namespace, seconds)
        print(f"namespace {args.namespace}: scraped every "
              f"{seconds or config.scrape_interval_seconds} s from the next discovery refresh")
        return 0
    if args.sandbox_command == "fault":
        from llmfleet.render.identity import DEPLOYMENT_LABEL, selector_labels
        from llmfleet_sandbox import faults

        deployment_label = selector_labels(args.deployment)[DEPLOYMENT_LABEL]
        fault = faults.Fault(args.namespace, deployment_label, args.revision, args.slowdown, args.drift,
                             args.error_percent, args.fail_load, args.engine_cache_full)
        if fault.problems():
            raise BadInput("; ".join(fault.problems()))
        faults.set_fault(config.state_dir, fault)
        target = f"{args.namespace}/{args.deployment} revision {args.revision}"
        print(f"{target}: fault removed" if fault.harmless else
              f"{target}: engines started from now on are {fault.describe()}")
        return 0
    if args.sandbox_command == "down":
        manager.down(config, purge=args.purge)
        return 0
    if args.sandbox_command == "status":
        all_up, text = manager.status(config)
        print(text)
        return 0 if all_up else 1
    if args.sandbox_command == "kubeconfig":
        if not config.admin_kubeconfig.exists():
            raise SystemExit("llmfleet sandbox kubeconfig: no sandbox here yet; run `llmfleet sandbox up`")
        print(config.admin_kubeconfig)
        return 0
    if args.sandbox_command == "demo":
        try:
            print(manager.demo(config))
        except manager.SandboxError as error:
            raise SystemExit(f"llmfleet sandbox demo: {error}") from None
        return 0
    if args.sandbox_command == "env":
        try:
            print(manager.environment_script(config), end="")
        except manager.SandboxError as error:
            raise SystemExit(f"llmfleet sandbox env: {error}") from None
        return 0
    raise AssertionError(args.sandbox_command)
