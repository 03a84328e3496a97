"""The `llmfleet` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _sandbox_config(args):
    from llmfleet.sandbox.config import SandboxConfig
    from llmfleet.sandbox.manager import configured

    if args.sandbox_command != "up":
        return configured(args.state_dir)
    defaults = SandboxConfig()
    return SandboxConfig(
        state_dir=args.state_dir or defaults.state_dir,
        node_count=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_type=args.gpu_type,
        scrape_interval_seconds=args.scrape_interval,
    )


def _run_sandbox(args) -> int:
    from llmfleet.sandbox import manager
    from llmfleet.sandbox.gpus import gfd_labels

    config = _sandbox_config(args)
    if args.sandbox_command == "up":
        if config.node_count < 1 or config.gpus_per_node < 1:
            raise SystemExit("llmfleet sandbox up: --nodes and --gpus-per-node must be at least 1")
        try:
            gfd_labels(config.gpu_type, config.gpus_per_node)
        except ValueError as error:
            raise SystemExit(f"llmfleet sandbox up: --gpu-type: {error}") from None
        config = manager.up(config)
        print(manager.status(config)[1])
        print(f"\nUse it:  eval \"$(llmfleet sandbox env)\" && kubectl get nodes")
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
    if args.sandbox_command == "env":
        try:
            print(manager.environment_script(config), end="")
        except manager.SandboxError as error:
            raise SystemExit(f"llmfleet sandbox env: {error}") from None
        return 0
    raise AssertionError(args.sandbox_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmfleet",
        description="Plan, serve and autoscale LLMs on Kubernetes with Triton + TensorRT-LLM.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sandbox = commands.add_parser(
        "sandbox", help="a real Kubernetes cluster with fake GPU nodes on this machine",
        description="A local cluster: real etcd, kube-apiserver, controller-manager and scheduler, "
                    "a node agent running pods as local processes on fake GPU nodes, a service "
                    "proxy and Prometheus. Needs root for per-pod network namespaces.")
    sandbox.add_argument("--state-dir", type=Path, default=None,
                         help="where the sandbox keeps its state (default: $LLMFLEET_SANDBOX_DIR "
                              "or ~/.local/state/llmfleet/sandbox)")
    sandbox_commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="ACTION")
    sandbox_up = sandbox_commands.add_parser("up", help="start the sandbox (idempotent)")
    sandbox_up.add_argument("--nodes", type=int, default=2, help="number of GPU nodes (default 2)")
    sandbox_up.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    sandbox_up.add_argument("--gpu-type", default="H100-SXM-80GB",
                            help="GPU type of every node, as named in the catalog (default H100-SXM-80GB)")
    sandbox_up.add_argument("--scrape-interval", type=int, default=5,
                            help="Prometheus scrape interval in seconds (default 5)")
    sandbox_down = sandbox_commands.add_parser(
        "down", help="stop every sandbox process and remove pod networks")
    sandbox_down.add_argument("--purge", action="store_true",
                              help="also delete the state directory (cluster data, certificates)")
    sandbox_commands.add_parser("status", help="show components and addresses; exit 1 if any is down")
    sandbox_commands.add_parser("kubeconfig", help="print the admin kubeconfig path")
    sandbox_commands.add_parser("env", help="print shell exports: KUBECONFIG, PATH with the "
                                            "matching kubectl first, LLMFLEET_PROMETHEUS_URL")
    sandbox.set_defaults(handler=_run_sandbox)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
