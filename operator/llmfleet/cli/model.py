"""`llmfleet model import`: a Hugging Face config.json as the spec.model.architecture block."""

from __future__ import annotations

import sys

from llmfleet.cli.inputs import BadInput, read_mapping


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
        imported = architecture_from_hf_config(read_mapping(args.config, args.config, json_only=True))
    except UnrepresentableConfig as error:
        raise BadInput(f"{args.config}: cannot represent {error}") from None
    for note in imported.ignored:
        print(f"llmfleet model import: ignored {note}", file=sys.stderr)
    block = imported.architecture.model_dump(mode="json", by_alias=True, exclude_none=True)
    print(yaml.safe_dump({"architecture": block}, sort_keys=False), end="")
    return 0
