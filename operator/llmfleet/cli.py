"""The `llmfleet` command line."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from llmfleet import exit_codes
from llmfleet.render.settings import RenderSettings
from llmfleet.settings import OperatorSettings


class BadInput(Exception):
    """Input the command cannot use (unreadable file, invalid manifest, unknown name): exit 2."""


# Commands from outside the product (the sandbox's `llmfleet sandbox`): each entry point of this
# group is a callable that gets the subparsers and adds its commands, whose handlers may raise
# BadInput like the product's own.
CLI_PLUGIN_GROUP = "llmfleet.cli_plugins"


def _read_yaml_mapping(path: str) -> dict[str, Any]:
    """One YAML (or JSON) mapping from a file, or from stdin when path is `-`."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise BadInput(f"-f {path}: cannot read it: {error.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BadInput(f"-f {path}: not valid YAML: {error}") from None
    if not isinstance(document, dict):
        raise BadInput(f"-f {path}: expected one YAML mapping, got {type(document).__name__}")
    return document


def _problem_lines(source: str, what: str, problems: list[tuple[str, str]]) -> str:
    return "\n".join([f"{source} is not a valid {what}:"] + [f"  {path}: {message}" for path, message in problems])


def _invalid_manifest(path: str, error) -> BadInput:
    return BadInput(_problem_lines(f"-f {path}", "LLMDeployment", error.problems))


def _deployment_spec(manifest: dict[str, Any], path: str):
    """The validated spec of an LLMDeployment manifest read from path."""
    from llmfleet.api import InvalidSpecError, LLMDeployment

    try:
        return LLMDeployment.from_manifest(manifest).spec
    except InvalidSpecError as error:
        raise _invalid_manifest(path, error) from None


def _print_json(body: dict) -> None:
    # An infeasible plan may predict an unbounded latency; JSON has no infinity, so it is null.
    def finite(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        if isinstance(value, list):
            return [finite(item) for item in value]
        return value

    print(json.dumps(finite(body), indent=2, allow_nan=False))


def _run_plan(args) -> int:
    from llmfleet.api import InvalidSpecError
    from llmfleet.planner import format_plan_table, plan
    from llmfleet.planner.spec_adapter import plan_request_from_spec
    from llmfleet.render import revision_hash

    spec = _deployment_spec(_read_yaml_mapping(args.file), args.file)
    try:
        request = plan_request_from_spec(spec)
    except InvalidSpecError as error:  # admission accepts it, but it leaves nothing to plan with
        raise _invalid_manifest(args.file, error) from None
    result = plan(request)
    # The revision the operator makes of this spec and plan (status.currentRevision, the pods'
    # llmfleet.io/revision label), e.g. for `llmfleet sandbox fault --revision`.
    revision = revision_hash(spec, result) if result.feasible else None
    if args.output == "json":
        _print_json({**result.to_json_dict(), "revision": revision})
    else:
        print(format_plan_table(result))
        if revision:
            print(f"\nrevision: {revision}")
    if result.feasible:
        return 0
    print("llmfleet plan: no configuration meets the spec; the rationale above gives the reason and "
          "the closest option", file=sys.stderr)
    return exit_codes.NOT_FEASIBLE


def _known(flag: str, what: str, value: str, known: tuple[str, ...]) -> str:
    if value not in known:
        raise BadInput(f"{flag}: unknown {what} {value!r}; choose one of: {', '.join(known)}")
    return value


def _architecture_field(error: dict[str, Any]) -> str:
    """The field a validation error of a plain architecture file is about."""
    path = ".".join(map(str, error["loc"]))
    # A rule spanning several fields names the one it is about in its context, as in the API.
    field_path = (error.get("ctx") or {}).get("field_path") or ""
    return (path + field_path).lstrip(".") or "<root>"


def _estimate_model(args, catalog):
    """The architecture named by --model, or read from -f (a manifest or plain architecture fields)."""
    from pydantic import ValidationError

    from llmfleet.api import KIND, ModelArchitecture
    from llmfleet.planner.spec_adapter import model_arch_from_architecture, model_arch_from_spec

    if args.model is not None:
        return catalog.model(_known("--model", "model", args.model, tuple(catalog.models)))
    document = _read_yaml_mapping(args.file)
    if document.get("kind") == KIND:
        return model_arch_from_spec(_deployment_spec(document, args.file).model, catalog=catalog)
    try:
        architecture = ModelArchitecture.model_validate(document)
    except ValidationError as error:
        problems = [(_architecture_field(e), e["msg"].removeprefix("Value error, ")) for e in error.errors()]
        raise BadInput(_problem_lines(f"-f {args.file}", "model architecture", problems)) from None
    return model_arch_from_architecture(architecture)


def _run_estimate(args) -> int:
    from llmfleet.catalog import load_catalog
    from llmfleet.planner import estimate, format_estimate_table

    catalog = load_catalog()
    model = _estimate_model(args, catalog)
    gpu = _known("--gpu", "GPU type", args.gpu, tuple(catalog.gpus))
    quantization = _known("--quantization", "quantization", args.quantization, tuple(catalog.quantizations))
    kv_dtype = _known("--kv-dtype", "KV cache dtype", args.kv_dtype, tuple(catalog.kv_cache_dtypes))
    try:
        result = estimate(model, gpu, args.tp, quantization, kv_dtype, args.isl, args.osl, args.concurrency,
                          catalog=catalog)
    except ValueError as error:
        print(f"llmfleet estimate: this configuration cannot run: {error}", file=sys.stderr)
        return exit_codes.NOT_FEASIBLE
    if args.output == "json":
        _print_json(result.to_json_dict())
    else:
        print(format_estimate_table(result))
    return 0


def _prometheus_default(option: str) -> str | None:
    """Each --prometheus-OPTION defaults to $LLMFLEET_PROMETHEUS_OPTION (`sandbox env` sets them)."""
    return os.environ.get("LLMFLEET_PROMETHEUS_" + option.upper().replace("-", "_"))


def _add_prometheus_arguments(parser, purpose: str) -> None:
    group = parser.add_argument_group(
        "Prometheus", "How to reach Prometheus; each option defaults to $LLMFLEET_PROMETHEUS_<OPTION> "
                      "(e.g. $LLMFLEET_PROMETHEUS_CA_FILE). Secrets are read from files on every request, "
                      "so a rotated Secret or projected token is used without a restart.")
    group.add_argument("--prometheus-url", default=_prometheus_default("url"), metavar="URL",
                       help=f"Prometheus' base URL, a path prefix included (e.g. https://thanos:9091 or "
                            f"https://proxy/prometheus), {purpose}")
    group.add_argument("--prometheus-bearer-token-file", type=Path, default=_prometheus_default("bearer-token-file"),
                       metavar="FILE", help="send the file's content as a bearer token (e.g. the projected "
                                            "service-account token /var/run/secrets/kubernetes.io/serviceaccount/token)")
    group.add_argument("--prometheus-basic-auth-username", default=_prometheus_default("basic-auth-username"),
                       metavar="NAME", help="basic auth user name (with --prometheus-basic-auth-password-file)")
    group.add_argument("--prometheus-basic-auth-password-file", type=Path,
                       default=_prometheus_default("basic-auth-password-file"), metavar="FILE",
                       help="the file holding the basic auth password")
    group.add_argument("--prometheus-ca-file", type=Path, default=_prometheus_default("ca-file"), metavar="FILE",
                       help="PEM bundle of the CAs that sign Prometheus' certificate (default: the system's)")
    group.add_argument("--prometheus-server-name", default=_prometheus_default("server-name"), metavar="NAME",
                       help="the name Prometheus' certificate must carry, when the URL's host is not it")
    group.add_argument("--prometheus-client-cert-file", type=Path, default=_prometheus_default("client-cert-file"),
                       metavar="FILE", help="PEM client certificate for mutual TLS (with --prometheus-client-key-file)")
    group.add_argument("--prometheus-client-key-file", type=Path, default=_prometheus_default("client-key-file"),
                       metavar="FILE", help="PEM key of the client certificate")
    group.add_argument("--prometheus-header", action="append", default=None, metavar="NAME=VALUE",
                       help="an extra header on every query, e.g. X-Scope-OrgID=tenant-1 for Mimir or Cortex; "
                            "repeat for more (default: $LLMFLEET_PROMETHEUS_HEADER, one NAME=VALUE)")


def _prometheus_connection(args):
    """The validated connection, or None without a URL; a wrong option is BadInput naming it."""
    from llmfleet.metrics.connection import ConnectionOptionError, PrometheusConnection, parse_header

    if not args.prometheus_url:
        return None
    headers = args.prometheus_header or ([_prometheus_default("header")] if _prometheus_default("header") else [])
    try:
        connection = PrometheusConnection(
            url=args.prometheus_url, bearer_token_file=args.prometheus_bearer_token_file,
            basic_auth_username=args.prometheus_basic_auth_username,
            basic_auth_password_file=args.prometheus_basic_auth_password_file, ca_file=args.prometheus_ca_file,
            server_name=args.prometheus_server_name, client_cert_file=args.prometheus_client_cert_file,
            client_key_file=args.prometheus_client_key_file,
            headers=tuple(parse_header(text) for text in headers))
        connection.validate()
    except ConnectionOptionError as error:
        raise BadInput(str(error)) from error
    return connection


def _positive(text: str, kind: type = int) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {'at least 1' if kind is int else 'above 0'}, got {text}")
    return value


def _listen_address(text: str) -> str:
    _, separator, port = text.rpartition(":")
    if not separator or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. 0.0.0.0:8081, got {text!r}")
    return text


def positive_int(text: str) -> int:
    """An argument type for whole numbers from 1 (plugins' commands use it too)."""
    return _positive(text, int)


def _positive_float(text: str) -> float:
    return _positive(text, float)


def _add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="output format (default table)")


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
    plan = commands.add_parser(
        "plan", help="choose GPU type, TP, quantisation and replicas for an LLMDeployment",
        description="Plan an LLMDeployment manifest exactly as the operator would: the configuration "
                    "with the fewest GPUs meeting p99 TTFT and TPOT at the peak workload, its predicted "
                    "performance per replica, the rationale, the rejected alternatives and the revision "
                    "the operator would name it (status.currentRevision). Exit 0 with a "
                    "plan, 1 when nothing meets the spec (the closest option is shown), 2 when the "
                    "manifest is invalid (each problem names its field).")
    plan.add_argument("-f", "--file", required=True, metavar="FILE",
                      help="LLMDeployment manifest (YAML or JSON); - reads stdin")
    _add_output_flag(plan)
    plan.set_defaults(handler=_run_plan)

    estimate = commands.add_parser(
        "estimate", help="what-if numbers for one fixed configuration",
        description="Predict one replica (one TP group) of a fixed configuration: KV bytes per token, "
                    "KV capacity, requests held at once at ISL+OSL context, saturation throughput "
                    "(output tokens/s of the whole TP group) and TTFT/TPOT with CONCURRENCY clients "
                    "in a closed loop. Exit 1 when the configuration cannot run (weights do not fit, "
                    "TP does not divide the heads, the GPU lacks the format), 2 for an unknown name.")
    model = estimate.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", metavar="NAME", help="catalog model, e.g. llama-3.1-8b")
    model.add_argument("-f", "--file", metavar="FILE",
                       help="the model from a file (- reads stdin): an LLMDeployment manifest (its "
                            "spec.model, catalog name or inline architecture; nothing else in it is "
                            "used), or a YAML/JSON mapping of the architecture fields alone, spelled as "
                            "in spec.model.architecture (numLayers, hiddenSize, numAttentionHeads, "
                            "numKvHeads, headDim, vocabSize, intermediateSize, parameterCountBillions, "
                            "optional MoE, latentAttention and localAttention fields; `llmfleet model "
                            "import` writes them from a config.json)")
    estimate.add_argument("--gpu", required=True, help="GPU type as named in the catalog, e.g. H100-SXM-80GB")
    estimate.add_argument("--tp", required=True, type=positive_int, metavar="N", help="tensor-parallel size")
    estimate.add_argument("--quantization", required=True, metavar="Q",
                          help="weight format: BF16, FP16, FP8, INT8WeightOnly, INT4AWQ, INT8SmoothQuant or NVFP4")
    estimate.add_argument("--kv-dtype", required=True, metavar="D", help="KV-cache dtype: BF16, FP16, FP8 or INT8")
    estimate.add_argument("--isl", required=True, type=positive_int, metavar="N", help="input (prompt) tokens")
    estimate.add_argument("--osl", required=True, type=positive_int, metavar="N", help="output tokens")
    estimate.add_argument("--concurrency", type=positive_int, default=1, metavar="N",
                          help="clients sending requests back to back (default 1)")
    _add_output_flag(estimate)
    estimate.set_defaults(handler=_run_estimate)

    run = commands.add_parser(
        "run", help="run the operator (kubeconfig or in-cluster)",
        description="Run the LLMDeployment operator. Uses the in-cluster service account when "
                    "running in a pod, else --kubeconfig or $KUBECONFIG.")
    run.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, "
                                                        "then $KUBECONFIG, then ~/.kube/config)")
    run.add_argument("--namespace", action="append", default=[],
                     help="watch only namespaces matching this Kopf pattern: a name, a glob, or !GLOB to "
                          "exclude (repeatable; default: all namespaces)")
    run.add_argument("--engine-cache-claim", default=RenderSettings.engine_cache_claim_name, metavar="NAME",
                     help="PersistentVolumeClaim (ReadWriteMany) holding built engines in each namespace; "
                          "created when missing (default %(default)s)")
    run.add_argument("--engine-cache-storage-class", default=None, metavar="CLASS",
                     help="StorageClass of a created engine cache claim (default: the cluster's default)")
    run.add_argument("--engine-cache-size", default=RenderSettings.engine_cache_size, metavar="SIZE",
                     help="size of a created engine cache claim (default %(default)s)")
    run.add_argument("--model-code-image", default=RenderSettings.model_code_image, metavar="IMAGE",
                     help="image holding tensorrtllm_backend's all_models at each pinned tag, copied into the "
                          "serving pods' model repository (default %(default)s, the operator's own image)")
    run.add_argument("--object-store-client-image", default=RenderSettings.object_store_client_image,
                     metavar="IMAGE", help="AWS CLI image that downloads s3:// model sources in the build and "
                                           "prepare Jobs (default %(default)s; a mirror must keep the tag)")
    _add_prometheus_arguments(run, "for autoscaling, canary analysis and live re-planning; without it "
                                   "autoscaling holds")
    run.add_argument("--prometheus-scrape-interval-seconds", type=_positive_float,
                     default=_prometheus_default("scrape-interval-seconds"), metavar="S",
                     help="how often Prometheus scrapes the serving pods (the PodMonitor's interval); the "
                          "query windows and the staleness limit follow from it (default: "
                          "$LLMFLEET_PROMETHEUS_SCRAPE_INTERVAL_SECONDS, else read from the spacing of "
                          "each deployment's samples)")
    run.add_argument("--endpoint-picker-cluster-role", default=RenderSettings.endpoint_picker_cluster_role,
                     metavar="NAME", help="ClusterRole bound to the endpoint pickers of spec.routing.inferencePool "
                                          "in each namespace that has one; the chart creates it per release "
                                          "(default %(default)s)")
    run.add_argument("--operator-namespace", default=None, metavar="NS",
                     help="the namespace this operator's pods run in: NetworkPolicies rendered for "
                          "spec.networkPolicy let it reach the serving pods (golden prompts) "
                          "(default: none, as when it runs outside the cluster)")
    run.add_argument("--leader-election-namespace", default=None, metavar="NS",
                     help="run as one of several replicas: act only while holding the Lease "
                          "llmfleet-operator in this namespace, stand by otherwise (default: no "
                          "leader election; run exactly one replica)")
    run.add_argument("--leader-election-identity", default=None, metavar="ID",
                     help="this replica's name in the Lease; unique per process (default: "
                          "hostname and a random suffix). A process restarted with the same "
                          "identity takes its lease back without waiting for it to expire")
    run.add_argument("--observation-interval-seconds", type=positive_int,
                     default=int(OperatorSettings.observation_interval_seconds), metavar="S",
                     help="how often a settled revision's traffic is observed for live re-planning "
                          "(spec.plan.liveReplanning; default %(default)s)")
    run.add_argument("--observation-window-seconds", type=positive_int,
                     default=OperatorSettings.observation_window_seconds, metavar="S",
                     help="the window each observation covers (default %(default)s)")
    run.add_argument("--observation-min-requests", type=positive_int,
                     default=OperatorSettings.observation_min_requests, metavar="N",
                     help="requests a window needs before a speed is fitted to it (default %(default)s)")
    run.add_argument("--liveness", default=None, metavar="URL",
                     help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--metrics-address", type=_listen_address, default=None, metavar="HOST:PORT",
                     help="serve every LLMDeployment's state as Prometheus gauges at /metrics, e.g. "
                          "0.0.0.0:8081 (docs/operator.md, dashboards and alerts; default: not served)")
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.set_defaults(handler=_run_operator)
    _add_load_parser(commands)
    _add_rollout_parser(commands)
    _add_fleet_parser(commands)
    _add_model_parser(commands)
    return parser


def _add_model_parser(commands) -> None:
    model = commands.add_parser(
        "model", help="model architectures: import a Hugging Face config.json",
        description="Work with model architectures outside the catalog.")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    imported = model_commands.add_parser(
        "import", help="print a config.json as the spec.model.architecture block",
        description="Read a Hugging Face config.json and print the `architecture:` block of "
                    "spec.model (YAML), with the parameter count derived from it. Families read: "
                    "Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, DeepSeek-V3/R1, gpt-oss, Llama 4. "
                    "Fields read but not planned are listed on stderr. Exit 2 when the file cannot "
                    "be read or holds what the block cannot represent; the message names the field.")
    imported.add_argument("config", metavar="CONFIG.json", help="the model's config.json; - reads stdin")
    imported.set_defaults(handler=_run_model_import)


def _run_model_import(args) -> int:
    import yaml

    from llmfleet.planner.hf_config import UnrepresentableConfig, architecture_from_hf_config

    try:
        text = sys.stdin.read() if args.config == "-" else Path(args.config).read_text(encoding="utf-8")
    except OSError as error:
        raise BadInput(f"{args.config}: cannot read it: {error.strerror}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInput(f"{args.config}: not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise BadInput(f"{args.config}: expected one JSON object, got {type(config).__name__}")
    try:
        imported = architecture_from_hf_config(config)
    except UnrepresentableConfig as error:
        raise BadInput(f"{args.config}: cannot represent {error}") from None
    for note in imported.ignored:
        print(f"llmfleet model import: ignored {note}", file=sys.stderr)
    block = imported.architecture.model_dump(mode="json", by_alias=True, exclude_none=True)
    print(yaml.safe_dump({"architecture": block}, sort_keys=False), end="")
    return 0


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
    _add_prometheus_arguments(status, "for SLO attainment; without it attainment is not shown")
    status.add_argument("--window-s", type=int, default=300, metavar="S",
                        help="attainment over the last S seconds (default %(default)s)")
    status.set_defaults(handler=_run_fleet)


def _run_fleet(args) -> int:
    import datetime

    from llmfleet.fleet import fleet_status, gpus_by_type
    from llmfleet.k8s import KubeGateway, load_api_client

    if args.window_s < 1:
        raise BadInput(f"--window-s must be at least 1, got {args.window_s}")
    connection = _prometheus_connection(args)
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


# The Lease that operator replicas elect their leader with (--leader-election-namespace).
LEADER_LEASE_NAME = "llmfleet-operator"


@contextlib.contextmanager
def _liveness_while_standing_by(url: str | None):
    """Answer 200 on the liveness URL's path until the block ends (then Kopf serves it)."""
    if url is None:
        yield
        return
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    parsed = urlparse(url)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == (parsed.path or "/") else 404)
            self.end_headers()

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _run_operator(args) -> int:
    if args.kubeconfig:
        # Kopf's own login reads the same file. Set before the kubernetes client is imported:
        # it reads $KUBECONFIG once, at import.
        os.environ["KUBECONFIG"] = str(Path(args.kubeconfig).resolve())
    import kopf

    from llmfleet import handlers  # noqa: F401 - registers the handlers
    prometheus = _prometheus_connection(args)  # a wrong option stops here, before any election
    settings = OperatorSettings(
        scrape_interval_seconds=args.prometheus_scrape_interval_seconds,
        observation_interval_seconds=args.observation_interval_seconds,
        observation_window_seconds=args.observation_window_seconds,
        observation_min_requests=args.observation_min_requests,
        render=RenderSettings(
        engine_cache_claim_name=args.engine_cache_claim, engine_cache_storage_class=args.engine_cache_storage_class,
        engine_cache_size=args.engine_cache_size, model_code_image=args.model_code_image,
        object_store_client_image=args.object_store_client_image, operator_namespace=args.operator_namespace,
        endpoint_picker_cluster_role=args.endpoint_picker_cluster_role))
    kopf.configure(verbose=args.verbose)
    elector = None
    if args.leader_election_namespace:
        from llmfleet.k8s import leader, load_api_client

        elector = leader.LeaderElector(
            load_api_client(args.kubeconfig), args.leader_election_namespace, LEADER_LEASE_NAME,
            args.leader_election_identity or leader.default_identity())
        stopping = threading.Event()
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, lambda *_: stopping.set())
        # A standby is alive too: it answers the liveness probe until Kopf takes the port over.
        with _liveness_while_standing_by(args.liveness):
            if not elector.acquire(stopping):
                return 0
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, signal.SIG_DFL)  # Kopf installs its own
        elector.keep_renewing(leader.exit_on_lost_lease)
    try:
        kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
                 liveness_endpoint=args.liveness,
                 memo=kopf.Memo(operator_settings=settings, kubeconfig=args.kubeconfig,
                                prometheus=prometheus, metrics_address=args.metrics_address))
    finally:
        if elector is not None:
            elector.release()
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
