"""Stand-ins for TensorRT-LLM's build tools: `quantize.py` and `trtllm-build`.

The engine build Job runs them at their paths in the Triton TensorRT-LLM image (see
trtllm_image.BUILD_TOOLS). They take the real tools' flags, check them as the real tools do where
that is cheap, and write the files a real build writes, in the same layout and with the same
config.json keys, but with tiny placeholders instead of weights and engines:

    quantize.py  --model_dir HF_DIR ... --output_dir CKPT   CKPT/config.json, CKPT/rank<r>.safetensors
    trtllm-build --checkpoint_dir CKPT --output_dir ENGINE  ENGINE/config.json, ENGINE/rank<r>.engine

quantize.py also reads its calibration set where the real one would (`--calib_dataset`, default
the hub's cnn_dailymail) and fails as the real one would on one it cannot read or reach; it
calibrates nothing.

The engine's config.json is what the emulated backend reads (emulator/engine_config.py).
Sources: NVIDIA/TensorRT-LLM@059c97c10c12e948e91676c8db3c9f137b0a2389:examples/quantization/quantize.py
(flags), @008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc:tensorrt_llm/commands/build.py and
tensorrt_llm/builder.py (flags, BuildConfig defaults, the checks in _init_max_seq_len and build(),
Engine.save's file names), docs/source/architecture/checkpoint.md (checkpoint layout); stored
commits, not tags.
"""

from __future__ import annotations

import argparse
import csv
import errno
import json
import os
import re
import struct
import sys
import time
from pathlib import Path
from typing import Any

from llmfleet.catalog.release_record import RUNTIME_RELEASES, Calibration, load_release_record
from llmfleet_sandbox.emulator.engine_config import (
    KV_CACHE_QUANT_ALGO_BY_FLAG,
    QUANT_ALGO_BY_QFORMAT,
    QUANTIZE_ONLY_QUANT_ALGO_BY_QFORMAT,
)
from llmfleet_sandbox import faults, hub
from llmfleet_sandbox.hub import HF_MODEL_CLASSES
from llmfleet_sandbox.trtllm_image import HUB_EGRESS_VARIABLE, RELEASE_VARIABLE

CONFIG_FILE = "config.json"
# TensorRT-LLM in the operator's default image, nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3
# (Triton release notes); engines record the version that built them.
TENSORRT_LLM_VERSION = "0.16.0"
BUILD_SECONDS_ENV = "LLMFLEET_SANDBOX_BUILD_SECONDS"
DEFAULT_BUILD_SECONDS = 5.0
PROGRESS_INTERVAL_S = 1.0

# quantize.py's --qformat choices, in its order (nvfp4 is newer than the 0.16 release).
QFORMATS = ("nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec")
QUANT_ALGOS = {**QUANT_ALGO_BY_QFORMAT, **QUANTIZE_ONLY_QUANT_ALGO_BY_QFORMAT}
# The architectures the stand-in builds: the catalog's (all are in TensorRT-LLM's MODEL_MAP).
ARCHITECTURES = frozenset(architecture for architecture, _ in HF_MODEL_CLASSES.values())
# quant_algos with FP8 context attention (build() keeps paged context FMHA with an FP8 KV cache
# only for these).
FP8_CONTEXT_FMHA_QUANT_ALGOS = ("FP8", "W4A8_AWQ", "NVFP4")


class ToolError(Exception):
    """The real tool would stop here; the message says why (printed, exit code 1)."""


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ToolError(f"{path.parent} does not appear to have a file named {path.name} ({what})") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ToolError(f"cannot read {path} ({what}): {error}") from None
    if not isinstance(data, dict):
        raise ToolError(f"{path} ({what}) must hold a JSON object")
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=4) + "\n")


def _placeholder_safetensors(metadata: dict[str, str]) -> bytes:
    """A valid safetensors file holding no tensors: the header length (u64 LE), then the header."""
    header = json.dumps({"__metadata__": metadata}).encode()
    return struct.pack("<Q", len(header)) + header


def _require(config: dict[str, Any], key: str, source: Path) -> Any:
    if key not in config:
        raise ToolError(f"{source}: {key} is missing")
    return config[key]


# ---------------------------------------------------------------------------------------------
# quantize.py's calibration set: get_calib_dataloader's branches, in its order (the release
# record's quantize.calibration, with sources). The real loader is datasets.load_dataset; this
# reads what it would read from a local directory, as far as the sandbox can without pyarrow.

# The one name it loads from outside the hub: the Pile's validation set on the-eye.eu.
PILEVAL = "pileval"
PILEVAL_URL = "https://the-eye.eu/public/AI/pile/val.jsonl.zst"
# datasets' packaged builders by file extension (json, csv, text, and the two the sandbox cannot read).
DATA_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".txt": "text",
                      ".parquet": "parquet", ".arrow": "arrow"}
UNREADABLE_BUILDERS = ("parquet", "arrow")
# datasets' split names in file and directory names (data_files.py), tried in this order; a
# directory none of whose files names a split is all train.
SPLIT_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
SPLIT_SEPARATORS = re.compile(r"[-._ 0-9/]+")
# The config of cnn_dailymail the loader asks for, and the column it reads.
HUB_DATASET_CONFIG, HUB_DATASET_COLUMN = "3.0.0", "article"


def release_calibration() -> Calibration:
    """The calibration facts of the image's release (the engine runtime's pinned one by default)."""
    calibration = load_release_record(os.environ.get(RELEASE_VARIABLE) or RUNTIME_RELEASES["engine"]).calibration
    if calibration is None:
        raise ToolError("this image's release runs no quantize.py")
    return calibration


def hub_reachable() -> bool:
    """Whether this pod reaches the hub. The sandbox's Triton image says so (its hub serves every
    pod, as the real hub serves a cluster with egress); anywhere else the stand-in assumes a cluster
    without hub egress, so a build that only works with the hub fails here as it would there rather
    than passing because the sandbox happens to have a hub."""
    return os.environ.get(HUB_EGRESS_VARIABLE) == "1"


def load_calibration_set(value: str, calibration: Calibration) -> int:
    """What the real script's get_calib_dataloader loads for --calib_dataset `value`, failing where
    it fails; the number of rows it would calibrate on."""
    if value == PILEVAL:
        raise ToolError(f"ConnectionError: Couldn't reach {PILEVAL_URL} ({PILEVAL}): no network beyond the sandbox's "
                        "hub reaches a sandbox pod")
    if calibration.hub_dataset_marker in value:
        return _load_hub_dataset(value)
    if os.path.isdir(value):
        return _load_local_dataset(Path(value), calibration)
    raise ToolError(f"NotImplementedError: Unsupported dataset name or local repo directory: {value}.")


def _load_hub_dataset(value: str) -> int:
    if not hub_reachable():
        raise ToolError(
            f"ConnectionError: Couldn't reach '{value}' on the Hub (no hub egress): quantize.py loads --calib_dataset "
            f"{value!r} (its default) with datasets.load_dataset from the Hugging Face hub at build time, and this "
            f"pod cannot reach the hub ({HUB_EGRESS_VARIABLE} is not 1). Give --calib_dataset a local directory "
            "(LLMDeployment spec.engine.calibrationDataset)")
    try:
        files = hub.repo_files(value, repo_type="dataset")
    except hub.HubError as error:
        raise ToolError(f"FileNotFoundError: Couldn't find '{value}' on the Hugging Face Hub: {error}") from None
    rows = [row for path, content in files.items() if path.startswith(f"{HUB_DATASET_CONFIG}/")
            and "train" in SPLIT_SEPARATORS.split(path) for row in _json_rows(content.decode(), path)]
    if not rows:
        raise ToolError(f"ValueError: {value} has no config {HUB_DATASET_CONFIG} with a train split")
    return len(_column(rows, HUB_DATASET_COLUMN, value))


def _data_files(directory: Path) -> list[Path]:
    """The files datasets considers: not hidden, not under a '.' or '__' directory."""
    return sorted(path for path in directory.rglob("*") if path.is_file()
                  and not any(part.startswith((".", "__")) for part in path.relative_to(directory).parts)
                  and path.suffix.lower() in DATA_FILE_BUILDERS)


def _splits(directory: Path, files: list[Path]) -> dict[str, list[Path]]:
    words = {path: set(SPLIT_SEPARATORS.split(str(path.relative_to(directory)))) for path in files}
    named: dict[str, list[Path]] = {}
    for path in files:
        split = next((split for split, keywords in SPLIT_KEYWORDS.items() if words[path] & set(keywords)), None)
        if split is not None:
            named.setdefault(split, []).append(path)
    return named or {"train": files}


def _json_rows(text: str, where: str) -> list[dict[str, Any]]:
    """JSON lines, or one JSON document holding a list of records (the json builder reads both)."""
    try:
        if text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise ToolError(f"DatasetGenerationError: cannot read {where} as JSON lines or a JSON list: {error}") from None
    if not all(isinstance(row, dict) for row in rows):
        raise ToolError(f"DatasetGenerationError: {where} has records that are not JSON objects")
    return rows


def _rows(path: Path, builder: str) -> list[dict[str, Any]]:
    text = path.read_text(errors="replace")
    if builder == "json":
        return _json_rows(text, str(path))
    if builder == "csv":
        return list(csv.DictReader(text.splitlines(), delimiter="\t" if path.suffix.lower() == ".tsv" else ","))
    return [{"text": line} for line in text.splitlines()]  # the text builder: one row per line


def _column(rows: list[dict[str, Any]], column: str, where: str) -> list[str]:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    if column not in columns:
        raise ToolError(f'KeyError: "Column {column} not in the dataset. Current columns in the dataset: {columns}" '
                        f"({where}: quantize.py reads the {column} column)")
    values = [row.get(column) for row in rows]
    if not all(isinstance(value, str) for value in values):
        raise ToolError(f"ValueError: the {column} column of {where} holds values that are not text; the tokenizer "
                        "takes strings")
    return values


def _load_local_dataset(directory: Path, calibration: Calibration) -> int:
    files = _data_files(directory)
    if not files:
        raise ToolError(f"EmptyDatasetError: The directory at {directory} doesn't contain any data files "
                        f"(looked for {', '.join(DATA_FILE_BUILDERS)})")
    splits = _splits(directory, files)
    split = calibration.local_split
    if split not in splits:
        raise ToolError(f'ValueError: Unknown split "{split}". Should be one of {sorted(splits)}. (quantize.py loads '
                        f'{directory} with split="{split}")')
    builders = {DATA_FILE_BUILDERS[path.suffix.lower()] for path in splits[split]}
    if len(builders) > 1:
        raise ToolError(f"the {split} split of {directory} mixes formats ({', '.join(sorted(builders))}); "
                        "datasets loads it with one builder")
    (builder,) = builders
    if builder in UNREADABLE_BUILDERS:
        raise ToolError(f"the sandbox's quantize.py cannot read {builder} files (it has no pyarrow; the real "
                        "datasets can): give the sandbox JSON lines, CSV or text")
    rows = [row for path in splits[split] for row in _rows(path, builder)]
    if not rows:
        raise ToolError(f"the {split} split of {directory} has no rows: nothing to calibrate on")
    return len(_column(rows, calibration.local_text_column, f"the {split} split of {directory}"))


# ---------------------------------------------------------------------------------------------
# quantize.py


def quantize(model_dir: Path, output_dir: Path, *, dtype: str = "auto", qformat: str = "full_prec",
             kv_cache_dtype: str | None = None, tp_size: int = 1, pp_size: int = 1,
             calib_dataset: str | None = None) -> dict[str, Any]:
    """Write the TensorRT-LLM checkpoint of the Hugging Face model in `model_dir`; returns its config.
    A build that calibrates first loads `calib_dataset` (None: the real script's default) as the
    real one would, and fails where it would."""
    if qformat not in QFORMATS:
        raise ToolError(f"invalid qformat {qformat!r}; choose from {', '.join(QFORMATS)}")
    if kv_cache_dtype not in KV_CACHE_QUANT_ALGO_BY_FLAG:
        raise ToolError(f"invalid kv_cache_dtype {kv_cache_dtype!r}; choose from int8, fp8")
    if tp_size < 1 or pp_size < 1:
        raise ToolError(f"tp_size and pp_size must be at least 1, got {tp_size} and {pp_size}")
    source = Path(model_dir) / CONFIG_FILE
    hf = _read_json(source, "the Hugging Face model config")
    architectures = _require(hf, "architectures", source)
    architecture = architectures[0] if isinstance(architectures, list) and architectures else None
    if architecture not in ARCHITECTURES:
        raise ToolError(f"{source}: architecture {architecture!r} is not one the sandbox builds: "
                        f"{', '.join(sorted(ARCHITECTURES))}")
    heads = _require(hf, "num_attention_heads", source)
    layers = _require(hf, "num_hidden_layers", source)
    hidden_size = _require(hf, "hidden_size", source)
    if heads % tp_size:
        raise ToolError(f"tp_size {tp_size} must divide num_attention_heads {heads} (attention heads are split "
                        "evenly across tensor-parallel ranks)")
    if pp_size > layers:
        raise ToolError(f"pp_size {pp_size} exceeds num_hidden_layers {layers}")
    calibration = release_calibration()
    if calibration.calibrates(qformat, kv_cache_dtype):
        # After the model and tokenizer load, as in quantize_and_export.
        dataset = calibration.default if calib_dataset is None else calib_dataset
        rows = load_calibration_set(dataset, calibration)
        print(f"Loading calibration dataset {dataset}: {rows} sample(s) (the sandbox calibrates nothing)", flush=True)
    if dtype == "auto":
        # quantize.py: the source model's dtype, except that float32 becomes float16.
        source_dtype = hf.get("torch_dtype", "float16")
        dtype = "float16" if source_dtype == "float32" else source_dtype
    quant_algo = QUANT_ALGOS[qformat]
    kv_cache_quant_algo = KV_CACHE_QUANT_ALGO_BY_FLAG[kv_cache_dtype]
    world_size = tp_size * pp_size
    checkpoint: dict[str, Any] = {
        "architecture": architecture,
        "model_type": hf.get("model_type"),
        "dtype": dtype,
        "logits_dtype": "float32",
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": hf.get("num_key_value_heads", heads),
        "hidden_size": hidden_size,
        "intermediate_size": _require(hf, "intermediate_size", source),
        "head_size": hf.get("head_dim") or hidden_size // heads,
        "vocab_size": _require(hf, "vocab_size", source),
        "max_position_embeddings": _require(hf, "max_position_embeddings", source),
        "hidden_act": hf.get("hidden_act", "silu"),
        "position_embedding_type": "rope_gpt_neox",
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_cache_quant_algo},
        "mapping": {"world_size": world_size, "tp_size": tp_size, "pp_size": pp_size},
    }
    if hf.get("num_local_experts", 1) > 1:
        checkpoint["moe"] = {"num_experts": hf["num_local_experts"], "top_k": hf.get("num_experts_per_tok", 1)}
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_json(output_dir / CONFIG_FILE, checkpoint)
    for rank in range(world_size):
        (output_dir / f"rank{rank}.safetensors").write_bytes(_placeholder_safetensors(
            {"llmfleet_sandbox": f"placeholder weights of rank {rank}/{world_size}", "quant_algo": str(quant_algo)}))
    return checkpoint


# The real script's other options: calibration, NeMo input, Medusa and export settings.
IGNORED_QUANTIZE_OPTIONS: dict[str, type] = {
    "nemo_ckpt_path": str, "decoder_type": str, "device": str, "device_map": str,
    "calib_tp_size": int, "calib_pp_size": int, "seed": int, "tokenizer_max_seq_length": int, "batch_size": int,
    "calib_size": int, "calib_max_seq_length": int, "cp_size": int, "awq_block_size": int,
    "quantize_lm_head": bool, "export_format": str,
}


def _quantize_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quantize.py",
        description="llmfleet sandbox stand-in for TensorRT-LLM's examples/quantization/quantize.py: reads "
                    "MODEL_DIR/config.json and writes a TensorRT-LLM checkpoint (config.json and one placeholder "
                    "rank<r>.safetensors per rank) to --output_dir. A calibrating build loads --calib_dataset as the "
                    "real script would, and fails where it would; nothing is calibrated, no real weights.")
    parser.add_argument("--model_dir", help="directory of the Hugging Face model")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float16", "bfloat16", "float32"],
                        help="dtype of the unquantised parts; auto: the model's torch_dtype (float32 -> float16)")
    parser.add_argument("--qformat", default="full_prec", choices=QFORMATS, help="quantization format")
    parser.add_argument("--kv_cache_dtype", default=None, choices=["int8", "fp8"], help="KV cache dtype")
    parser.add_argument("--tp_size", type=int, default=1, help="tensor-parallel size of the checkpoint")
    parser.add_argument("--pp_size", type=int, default=1, help="pipeline-parallel size of the checkpoint")
    parser.add_argument("--output_dir", default="exported_model", help="where to write the checkpoint")
    parser.add_argument("--calib_dataset", default=None,
                        help="the hub dataset name or the local directory of the calibration set (default: the "
                             "release's, cnn_dailymail from the hub); read by builds that calibrate")
    ignored = parser.add_argument_group("options of the real script accepted with no effect in the sandbox")
    for name, kind in IGNORED_QUANTIZE_OPTIONS.items():
        if kind is bool:
            ignored.add_argument(f"--{name}", action="store_true")
        else:
            ignored.add_argument(f"--{name}", type=kind)
    return parser


def quantize_main(argv: list[str] | None = None) -> int:
    parser = _quantize_parser()
    args = parser.parse_args(argv)
    noted = [name for name in IGNORED_QUANTIZE_OPTIONS if getattr(args, name) not in (None, False)]
    if noted:
        print(f"note: the sandbox quantize.py ignores --{', --'.join(noted)}", file=sys.stderr)
    if args.model_dir is None:
        # The real script also takes a NeMo checkpoint; the sandbox hub serves Hugging Face models only.
        print("error: give --model_dir (the sandbox quantize.py reads Hugging Face models only)", file=sys.stderr)
        return 1
    start_s = time.monotonic()
    try:
        checkpoint = quantize(Path(args.model_dir), Path(args.output_dir), dtype=args.dtype, qformat=args.qformat,
                              kv_cache_dtype=args.kv_cache_dtype, tp_size=args.tp_size, pp_size=args.pp_size,
                              calib_dataset=args.calib_dataset)
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    quantization = checkpoint["quantization"]
    print(f"quantized {checkpoint['architecture']} ({args.qformat}: quant_algo {quantization['quant_algo']}, "
          f"kv_cache_quant_algo {quantization['kv_cache_quant_algo']}) for {checkpoint['mapping']['world_size']} "
          f"rank(s); checkpoint exported to {args.output_dir} in {time.monotonic() - start_s:.2f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# trtllm-build

# Plugin options of PluginConfig in the same source: dtype plugins ("disable" turns one off)
# and enable/disable features, with their defaults.
PLUGIN_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "disable")
DTYPE_PLUGINS = {"gpt_attention_plugin": "auto", "gemm_plugin": "disable", "nccl_plugin": "auto",
                 "moe_plugin": "auto"}
GEMM_PLUGIN_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "disable")
FEATURES = {"context_fmha": True, "remove_input_padding": True, "use_paged_context_fmha": False,
            "use_fp8_context_fmha": False, "multiple_profiles": False, "use_custom_all_reduce": True,
            "reduce_fusion": False, "enable_xqa": True, "multi_block_mode": False}
DEFAULT_TOKENS_PER_BLOCK = 64
KV_CACHE_TYPES = ("continuous", "paged", "disabled")


def _warn(message: str) -> None:
    print(f"[TRT-LLM] [W] {message}", flush=True)


def _build_config(args: argparse.Namespace, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """BuildConfig as the real build settles it: defaults deduced, values clipped with a warning."""
    plugins: dict[str, Any] = {"dtype": checkpoint["dtype"]}
    for name in DTYPE_PLUGINS:
        value = getattr(args, name)
        plugins[name] = None if value == "disable" else value
    for name in FEATURES:
        plugins[name] = getattr(args, name) == "enable"
    plugins["tokens_per_block"] = args.tokens_per_block
    if args.kv_cache_type is not None and args.paged_kv_cache is not None \
            and (args.paged_kv_cache == "enable") != (args.kv_cache_type == "paged"):
        raise ToolError(f"--paged_kv_cache {args.paged_kv_cache} contradicts --kv_cache_type {args.kv_cache_type}")
    kv_cache_type = args.kv_cache_type or ("continuous" if args.paged_kv_cache == "disable" else "paged")
    plugins["paged_kv_cache"] = kv_cache_type == "paged"

    max_seq_len = args.max_seq_len or checkpoint["max_position_embeddings"]
    max_input_len = args.max_input_len
    if max_input_len > max_seq_len:
        _warn(f"max_input_len {max_input_len} is larger than max_seq_len {max_seq_len}, clipping it to max_seq_len")
        max_input_len = max_seq_len
    max_num_tokens, max_batch_size = args.max_num_tokens, args.max_batch_size
    if max_num_tokens > max_seq_len * max_batch_size:
        _warn(f"max_num_tokens {max_num_tokens} is larger than max_seq_len * max_batch_size; using "
              f"{max_seq_len * max_batch_size}")
        max_num_tokens = max_seq_len * max_batch_size
    if plugins["context_fmha"] and max_num_tokens < args.tokens_per_block:
        _warn(f"max_num_tokens {max_num_tokens} is below tokens_per_block {args.tokens_per_block}; using "
              f"{args.tokens_per_block}")
        max_num_tokens = args.tokens_per_block
    elif not plugins["context_fmha"] and max_num_tokens < max_input_len:
        _warn(f"without context FMHA max_num_tokens must be at least max_input_len; using {max_input_len}")
        max_num_tokens = max_input_len
    opt_num_tokens = args.opt_num_tokens
    if opt_num_tokens is None and not plugins["multiple_profiles"]:
        opt_num_tokens = min(max_batch_size * args.max_beam_width, max_num_tokens)

    quantization = checkpoint["quantization"]
    if plugins["use_paged_context_fmha"]:
        if not plugins["context_fmha"]:
            _warn("context FMHA is disabled, so paged context FMHA is disabled")
            plugins["use_paged_context_fmha"] = False
        elif quantization.get("kv_cache_quant_algo") == "INT8":
            _warn("paged context FMHA is disabled: it does not work with an INT8 KV cache")
            plugins["use_paged_context_fmha"] = False
        elif quantization.get("kv_cache_quant_algo") == "FP8":
            if quantization.get("quant_algo") in FP8_CONTEXT_FMHA_QUANT_ALGOS:
                plugins["use_fp8_context_fmha"] = True
            else:
                _warn("paged context FMHA is disabled: an FP8 KV cache needs FP8 context FMHA, which needs "
                      "an FP8 quantization workflow")
                plugins["use_paged_context_fmha"] = False
    return {
        "max_input_len": max_input_len,
        "max_seq_len": max_seq_len,
        "opt_batch_size": 8,
        "max_batch_size": max_batch_size,
        "max_beam_width": args.max_beam_width,
        "max_num_tokens": max_num_tokens,
        "opt_num_tokens": opt_num_tokens,
        "max_prompt_embedding_table_size": 0,
        "kv_cache_type": kv_cache_type.upper(),  # the KVCacheType enum's name, as BuildConfig.to_dict writes it
        "gather_context_logits": False,
        "gather_generation_logits": False,
        "strongly_typed": True,
        "plugin_config": plugins,
    }


def build_seconds() -> float:
    value = os.environ.get(BUILD_SECONDS_ENV, "")
    try:
        seconds = float(value) if value else DEFAULT_BUILD_SECONDS
    except ValueError:
        raise ToolError(f"{BUILD_SECONDS_ENV}={value!r} is not a number of seconds") from None
    if seconds < 0:
        raise ToolError(f"{BUILD_SECONDS_ENV} must not be negative, got {value}")
    return seconds


def trtllm_build(args: argparse.Namespace, duration_s: float) -> dict[str, Any]:
    """Build (placeholder) engines from the checkpoint in args.checkpoint_dir; returns the engine config."""
    checkpoint_dir = Path(args.checkpoint_dir)
    source = checkpoint_dir / CONFIG_FILE
    checkpoint = _read_json(source, "the TensorRT-LLM checkpoint config")
    for key in ("dtype", "max_position_embeddings", "quantization", "mapping"):
        _require(checkpoint, key, source)
    architecture = _require(checkpoint, "architecture", source)
    if architecture not in ARCHITECTURES:
        raise ToolError(f"Unsupported model architecture: {architecture}")
    world_size = _require(checkpoint["mapping"], "world_size", source)
    missing = [f"rank{rank}.safetensors" for rank in range(world_size)
               if not (checkpoint_dir / f"rank{rank}.safetensors").is_file()]
    if missing:
        raise ToolError(f"{checkpoint_dir} lacks the weights of {', '.join(missing)} (world_size {world_size})")
    build_config = _build_config(args, checkpoint)

    print(f"[TRT-LLM] [I] building {world_size} {architecture} engine(s) from {checkpoint_dir} "
          f"({duration_s:g} s in the sandbox)", flush=True)
    start_s = time.monotonic()
    while (elapsed_s := time.monotonic() - start_s) < duration_s:
        print(f"[TRT-LLM] [I] building engines: {min(99, int(100 * elapsed_s / duration_s))}%", flush=True)
        time.sleep(min(PROGRESS_INTERVAL_S, duration_s - elapsed_s))
    # As the real build, write the TensorRT timing cache to --output_timing_cache (relative to
    # the working directory by default), so a read-only working directory fails here too.
    Path(args.output_timing_cache).write_bytes(b"llmfleet sandbox placeholder timing cache\n")
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    engine_config = {"version": TENSORRT_LLM_VERSION, "pretrained_config": checkpoint, "build_config": build_config}
    _write_json(output_dir / CONFIG_FILE, engine_config)
    for rank in range(world_size):
        engine = output_dir / f"rank{rank}.engine"
        if faults.injected(dict(os.environ)).cache_full:
            # What a write to a full volume raises; uncaught, as in the real tool.
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(engine))
        engine.write_bytes(f"llmfleet sandbox placeholder engine, rank {rank} of {world_size}\n".encode())
    print(f"[TRT-LLM] [I] Total time of building all engines: "
          f"{time.strftime('%H:%M:%S', time.gmtime(time.monotonic() - start_s))}", flush=True)
    return engine_config


def _kv_cache_type(value: str) -> str:
    if value.lower() not in KV_CACHE_TYPES:
        raise argparse.ArgumentTypeError(f"Invalid value '{value}'. Expected one of {list(KV_CACHE_TYPES)}")
    return value.lower()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtllm-build", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="llmfleet sandbox stand-in for TensorRT-LLM's trtllm-build: reads CHECKPOINT_DIR/config.json and "
                    "writes OUTPUT_DIR/config.json (the engine config) and one placeholder rank<r>.engine per rank, "
                    f"after ${BUILD_SECONDS_ENV} seconds (default {DEFAULT_BUILD_SECONDS:g}).")
    parser.add_argument("--checkpoint_dir", required=True, help="directory of the TensorRT-LLM checkpoint")
    parser.add_argument("--output_dir", default="engine_outputs", help="where to write the engines and config.json")
    parser.add_argument("--max_batch_size", type=int, default=2048, help="most requests the engine schedules at once")
    parser.add_argument("--max_input_len", type=int, default=1024, help="longest input of one request")
    parser.add_argument("--max_seq_len", "--max_decoder_seq_len", dest="max_seq_len", type=int, default=None,
                        help="longest request, input plus output (default: the model's max_position_embeddings)")
    parser.add_argument("--max_beam_width", type=int, default=1, help="most beams of beam search")
    parser.add_argument("--max_num_tokens", type=int, default=8192, help="most batched input tokens in one step")
    parser.add_argument("--opt_num_tokens", type=int, default=None, help="token count the engine is tuned for")
    parser.add_argument("--kv_cache_type", type=_kv_cache_type, default=None,
                        help=f"KV cache type: {', '.join(KV_CACHE_TYPES)} (default paged)")
    parser.add_argument("--paged_kv_cache", choices=["enable", "disable"], default=None,
                        help="deprecated form of --kv_cache_type paged/continuous")
    parser.add_argument("--workers", type=int, default=1, help="accepted; the stand-in builds in one process")
    parser.add_argument("--log_level", default="info", help="accepted; the stand-in logs at info")
    parser.add_argument("--input_timing_cache", default=None, help="accepted; no timing cache in the sandbox")
    parser.add_argument("--output_timing_cache", default="model.cache",
                        help="where to write the timing cache (a placeholder in the sandbox)")
    plugins = parser.add_argument_group("plugin config")
    for name, default in DTYPE_PLUGINS.items():
        plugins.add_argument(f"--{name}", default=default,
                             choices=GEMM_PLUGIN_DTYPES if name == "gemm_plugin" else PLUGIN_DTYPES,
                             help=f"enable {name} with this dtype (auto: the model dtype) or disable it")
    for name, default in FEATURES.items():
        plugins.add_argument(f"--{name}", default="enable" if default else "disable", choices=["enable", "disable"],
                             help=f"enable or disable {name}")
    plugins.add_argument("--tokens_per_block", type=int, default=DEFAULT_TOKENS_PER_BLOCK,
                         help="tokens in one paged KV cache block")
    return parser


def trtllm_build_main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        trtllm_build(args, build_seconds())
    except ToolError as error:
        print(f"[TRT-LLM] [E] {error}", file=sys.stderr, flush=True)
        return 1
    return 0
