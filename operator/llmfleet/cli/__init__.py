"""The `llmfleet` command line: the top-level parser, the commands plugged in from other
packages, and main. Each command's options and handler live in a module of their own:

    planning    plan, estimate
    run         the operator
    load        the load generator
    simulate    a spec's plan, replicas and autoscaler against a trace, in virtual time
    rollout     watch and steer a canary rollout
    fleet       fleet status
    model       model import (a config.json as an architecture block)
    inputs      BadInput and the argument types every command checks its input with
    prometheus  the --prometheus-* options of run and fleet status

Handlers import what they use (Kopf, the Kubernetes client, the load generator) when they run, so
that `llmfleet --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from llmfleet import exit_codes
from llmfleet.cli import fleet, load, model, planning, rollout, run, simulate
from llmfleet.cli.inputs import BadInput, positive_int

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
    simulate.add_commands(commands)
    rollout.add_commands(commands)
    fleet.add_commands(commands)
    model.add_commands(commands)
    return parser


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

