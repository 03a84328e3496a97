"""`llmfleet plan` and `llmfleet estimate`: the planner's answer for an LLMDeployment manifest,
and its numbers for one fixed configuration."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from llmfleet import exit_codes
from llmfleet.cli.inputs import BadInput, positive_int, read_mapping


def add_commands(commands) -> None:
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


def _add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="output format (default table)")


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


def read_plan_request(path: str):
    """The validated spec of the LLMDeployment manifest at `path` (- for stdin) and the planner's
    question for it; BadInput names every problem's field."""
    from llmfleet.api import InvalidSpecError
    from llmfleet.planner.spec_adapter import plan_request_from_spec

    spec = _deployment_spec(read_mapping(path, f"-f {path}"), path)
    try:
        return spec, plan_request_from_spec(spec)
    except InvalidSpecError as error:  # admission accepts it, but it leaves nothing to plan with
        raise _invalid_manifest(path, error) from None


def _run_plan(args) -> int:
    from llmfleet.planner import format_plan_table, plan
    from llmfleet.render import revision_hash

    spec, request = read_plan_request(args.file)
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
    document = read_mapping(args.file, f"-f {args.file}")
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
