"""`llmfleet model import`: a Hugging Face config.json as the spec.model.architecture block."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llmfleet.cli.inputs import BadInput


def add_commands(commands) -> None:
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
    imported.set_defaults(handler=_run_import)


def _run_import(args) -> int:
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
