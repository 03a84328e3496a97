"""`llmfleet rollout`: watch a canary rollout and steer it through the rollout-command
annotation, which the operator carries out."""

from __future__ import annotations

import argparse

from llmfleet.cli.inputs import BadInput


def add_commands(commands) -> None:
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
