"""The sandbox's model hub, and the `huggingface-cli download` stand-in that reads it.

The sandbox has no network. Its hub holds the public models of the llmfleet catalog under their
Hugging Face repo ids; each repo's files are generated from the catalog's numbers: the model's
config.json (Hugging Face keys), a tokenizer_config.json for the sandbox tokenizer (one token per
whitespace-separated word, see emulator/tokenizer.py) and a tiny weights placeholder, so that the
build's later steps (quantize.py, trtllm-build) have the files they read. The build Job runs
the stand-in as `huggingface-cli` (see trtllm_image.BUILD_TOOLS).

It also holds two dataset repos (`--repo-type dataset`), generated too: `cnn_dailymail`, which
quantize.py loads by default to calibrate (config 3.0.0, train split, column article), and
`llmfleet-sandbox/calibration-text`, a calibration set in the layout quantize.py reads from a
local directory (train split, column text) for builds that name one. Both are JSON lines where
Hub repos usually hold Parquet: the sandbox has no pyarrow to read Parquet with.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import struct
import sys
from pathlib import Path

from llmfleet.catalog import ModelArch, load_catalog
from llmfleet.catalog.release_record import load_release_record, release_names
from llmfleet_sandbox.emulator import tokenizer

# Repo id -> catalog model. The ids are the models' official repositories on huggingface.co
# (organisations meta-llama, mistralai and Qwen), base and instruct variants where both share the
# catalog's architecture numbers. Qwen2.5-72B (base) is left out: its config.json has a longer
# max_position_embeddings than the instruct model the catalog describes.
HUB_REPOS: dict[str, str] = {
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-405B": "llama-3.1-405b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
    "mistralai/Mistral-7B-Instruct-v0.1": "mistral-7b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b",
}

# Published ModelOpt-quantised repos -> (their source repo, catalog quantisation), from the
# releases' records (the llmapi runtime serves FP8/NVFP4 from them).
QUANTIZED_REPOS: dict[str, tuple[str, str]] = {
    repo: (source, quantization)
    for name in release_names()
    for (source, quantization), repo in load_release_record(name).published_checkpoints.items()
    if source in HUB_REPOS
}
QUANT_CONFIG_FILE = "hf_quant_config.json"
# Catalog quantisation -> the quant_algo ModelOpt writes in hf_quant_config.json.
MODELOPT_QUANT_ALGO = {"FP8": "FP8", "NVFP4": "NVFP4"}

# Catalog model -> (`architectures[0]`, `model_type`) of its Hugging Face config.json.
HF_MODEL_CLASSES: dict[str, tuple[str, str]] = {
    "llama-3.1-8b": ("LlamaForCausalLM", "llama"),
    "llama-3.1-70b": ("LlamaForCausalLM", "llama"),
    "llama-3.1-405b": ("LlamaForCausalLM", "llama"),
    "mistral-7b": ("MistralForCausalLM", "mistral"),
    "mixtral-8x7b": ("MixtralForCausalLM", "mixtral"),
    "qwen2.5-72b": ("Qwen2ForCausalLM", "qwen2"),
}

# Dataset repos: id -> path in the repo -> rows (JSON lines). cnn_dailymail under the id quantize.py
# names (catalog/releases/engine-24.12.yaml, quantize.calibration), with the config, split and
# columns its loader reads.
CALIBRATION_ROWS = 16
HUB_DATASETS: dict[str, dict[str, list[dict[str, str]]]] = {
    "cnn_dailymail": {"3.0.0/train-00000-of-00001.jsonl": [
        {"article": f"sandbox article {row}: " + "news " * 24, "highlights": f"sandbox highlight {row}",
         "id": f"{row:040x}"} for row in range(CALIBRATION_ROWS)]},
    "llmfleet-sandbox/calibration-text": {"data/train-00000-of-00001.jsonl": [
        {"text": f"calibration sample {row}: " + "the quick brown fox jumps over the lazy dog " * 4}
        for row in range(CALIBRATION_ROWS)]},
}
DATASET_CARD = "README.md"

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
META_ORGANISATION = "meta-llama/"
ORIGINAL_WEIGHTS_FILE = "original/consolidated.00.pth"
HUB_URL = "https://huggingface.co"


class HubError(Exception):
    """A download the real hub would refuse; the message is what huggingface-cli prints."""

    def __init__(self, message: str, error_class: str = "HfHubHTTPError"):
        super().__init__(message)
        # The huggingface_hub exception the real CLI dies with, named in its last output line.
        self.error_class = error_class


def _not_found(kind: str, url: str) -> HubError:
    return HubError(
        f"404 Client Error. (Request ID: llmfleet-sandbox)\n\n{kind} Not Found for url: {url}.\n"
        "Please make sure you specified the correct `repo_id` and `repo_type`.\n"
        "If you are trying to access a private or gated repo, make sure you are authenticated.\n"
        f"(The sandbox hub holds only these model repos: {', '.join(sorted([*HUB_REPOS, *QUANTIZED_REPOS]))}; "
        f"and these dataset repos: {', '.join(sorted(HUB_DATASETS))}.)",
        f"{kind}NotFoundError")


def hf_config(model: ModelArch) -> dict:
    """The model's config.json as its Hugging Face repo has it (the keys TensorRT-LLM reads)."""
    architecture, model_type = HF_MODEL_CLASSES[model.name]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "num_hidden_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_position_embeddings,
        "hidden_act": "silu",
        "tie_word_embeddings": model.tie_word_embeddings,
        "torch_dtype": "bfloat16",
    }
    if model.num_experts > 1:
        # Mixtral's config.json names its MoE sizes so.
        config["num_local_experts"] = model.num_experts
        config["num_experts_per_tok"] = model.experts_per_token
    return config


def _weights_placeholder(repo_id: str) -> bytes:
    """A valid safetensors file with no tensors: an 8-byte header length, then the JSON header."""
    header = json.dumps({"__metadata__": {"format": "pt", "llmfleet_sandbox": f"placeholder for {repo_id}"}})
    return struct.pack("<Q", len(header)) + header.encode()


def dataset_files(repo_id: str) -> dict[str, bytes]:
    """Path in the dataset repo -> content: its card and its rows as JSON lines."""
    files = {DATASET_CARD: f"# {repo_id}\n\nGenerated by the llmfleet sandbox hub.\n".encode()}
    for path, rows in HUB_DATASETS[repo_id].items():
        files[path] = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return files


def repo_files(repo_id: str, revision: str | None = None, repo_type: str = "model") -> dict[str, bytes]:
    """Path in the repo -> content, for a repo the sandbox hub holds."""
    if repo_type == "dataset" and repo_id in HUB_DATASETS:
        if revision not in (None, "main"):
            raise _not_found("Revision", f"{HUB_URL}/api/datasets/{repo_id}/revision/{revision}")
        return dataset_files(repo_id)
    source_repo, quantization = QUANTIZED_REPOS.get(repo_id, (repo_id, None))
    if source_repo not in HUB_REPOS or repo_type != "model":
        raise _not_found("Repository", f"{HUB_URL}/api/{repo_type}s/{repo_id}/revision/{revision or 'main'}")
    if revision not in (None, "main"):
        raise _not_found("Revision", f"{HUB_URL}/api/models/{repo_id}/revision/{revision}")
    model = load_catalog().model(HUB_REPOS[source_repo])
    files = {
        CONFIG_FILE: (json.dumps(hf_config(model), indent=2) + "\n").encode(),
        # The sandbox tokenizer (emulator.tokenizer) stands in for the model's real one.
        tokenizer.CONFIG_FILE: (json.dumps(tokenizer.tokenizer_config(model.vocab_size), indent=2) + "\n").encode(),
        WEIGHTS_FILE: _weights_placeholder(repo_id),
    }
    if quantization is not None:
        files[QUANT_CONFIG_FILE] = (json.dumps({"producer": {"name": "modelopt"}, "quantization": {
            "quant_algo": MODELOPT_QUANT_ALGO[quantization], "kv_cache_quant_algo": None}}, indent=2) + "\n").encode()
    if repo_id.startswith(META_ORGANISATION):
        # Meta's repos also carry the weights in Meta's own format under original/, which a
        # Hugging Face checkpoint conversion does not read.
        files[ORIGINAL_WEIGHTS_FILE] = b"llmfleet sandbox placeholder for Meta-format weights\n"
    return files


def _directory_pattern(pattern: str) -> str:
    # A pattern naming a folder ("original/") means everything under it, as in huggingface_hub.
    return pattern + "*" if pattern.endswith("/") else pattern


def filter_paths(paths: list[str], include: list[str] | None, exclude: list[str] | None) -> list[str]:
    """The paths huggingface-cli downloads for --include/--exclude, as huggingface_hub selects them:
    fnmatch patterns (`*` also matches `/`); with --include a path must match one of its patterns
    (so an empty --include selects nothing), and it must match no --exclude pattern."""
    allow = None if include is None else [_directory_pattern(p) for p in include]
    ignore = [_directory_pattern(p) for p in exclude or ()]
    return [path for path in paths
            if (allow is None or any(fnmatch.fnmatchcase(path, p) for p in allow))
            and not any(fnmatch.fnmatchcase(path, p) for p in ignore)]


def download(repo_id: str, local_dir: Path, *, filenames: list[str] | None = None,
             include: list[str] | None = None, exclude: list[str] | None = None,
             revision: str | None = None, repo_type: str = "model") -> list[Path]:
    """Write the selected files of `repo_id` under `local_dir`; returns the written paths."""
    files = repo_files(repo_id, revision, repo_type)
    if filenames:
        missing = [name for name in filenames if name not in files]
        if missing:
            raise HubError(f"404 Client Error. (Request ID: llmfleet-sandbox)\n\nEntry Not Found for url: "
                           f"{HUB_URL}/{repo_id}/resolve/{revision or 'main'}/{missing[0]}.",
                           "EntryNotFoundError")
        selected = list(filenames)
    else:
        selected = filter_paths(sorted(files), include, exclude)
    written = []
    for name in selected:
        target = local_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(files[name])
        written.append(target)
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="huggingface-cli",
        description="llmfleet sandbox stand-in for the huggingface_hub CLI: `download` serves the sandbox "
                    "hub's model and dataset repos (no network).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{download}")
    download_parser = commands.add_parser(
        "download", help="download files from a model or dataset repo",
        description="Download files of a repo of the sandbox hub into --local-dir. Known model repos: "
                    + ", ".join(sorted([*HUB_REPOS, *QUANTIZED_REPOS])) + "; dataset repos (--repo-type dataset): "
                    + ", ".join(sorted(HUB_DATASETS)) + ".")
    download_parser.add_argument("repo_id", help="ID of the repo to download from (e.g. `username/repo-name`)")
    download_parser.add_argument("filenames", nargs="*", help="files to download (default: the whole repo)")
    download_parser.add_argument("--repo-type", choices=["model", "dataset", "space"], default="model",
                                 help="type of the repo (the sandbox hub holds models and a few datasets)")
    download_parser.add_argument("--revision", help="git revision; the sandbox hub has `main` only")
    download_parser.add_argument("--include", nargs="*", help="glob patterns of the files to download")
    download_parser.add_argument("--exclude", nargs="*", help="glob patterns of the files not to download")
    download_parser.add_argument("--local-dir", type=Path,
                                 help="directory to write the files to (required in the sandbox: it has no "
                                      "hub cache)")
    download_parser.add_argument("--cache-dir", help="accepted; unused (the sandbox writes to --local-dir)")
    download_parser.add_argument("--token", help="accepted; the sandbox hub needs no token")
    download_parser.add_argument("--force-download", action="store_true", help="accepted; every download is fresh")
    download_parser.add_argument("--max-workers", type=int, default=8, help="accepted; unused")
    download_parser.add_argument("--quiet", action="store_true", help="print only the local path")
    return parser


def huggingface_cli_main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.local_dir is None:
        parser.error("the sandbox hub writes to --local-dir only; give --local-dir DIR")
    if args.filenames and (args.include or args.exclude):
        # As the real CLI does: explicit filenames win over patterns, with a warning.
        print("warning: filenames given, so --include and --exclude are ignored", file=sys.stderr)
    try:
        written = download(args.repo_id, args.local_dir, filenames=args.filenames,
                           include=None if args.filenames else args.include,
                           exclude=None if args.filenames else args.exclude,
                           revision=args.revision, repo_type=args.repo_type)
    except HubError as error:
        print(f"huggingface_hub.errors.{error.error_class}: {error}", file=sys.stderr)
        return 1
    if not args.quiet:
        for path in written:
            print(f"downloaded {path.relative_to(args.local_dir)}", file=sys.stderr)
    # Like the real CLI: the path of the downloaded files on stdout (a file's path for one file).
    print(written[0] if len(args.filenames) == 1 else args.local_dir)
    return 0
