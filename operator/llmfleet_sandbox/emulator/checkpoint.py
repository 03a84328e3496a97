"""A Hugging Face checkpoint as the LLM-API runtime's PyTorch backend loads it, read as an engine.

The llmapi runtime has no built engine: the LLM loads the checkpoint directory named by
model.yaml's `model` (config.json in Hugging Face keys, and for ModelOpt-quantised checkpoints
hf_quant_config.json with `quantization.quant_algo` / `kv_cache_quant_algo`) with the limits
model.yaml gives. This module turns both into the `EngineConfig` the emulator's profile is
derived from, so one profile path serves both runtimes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmfleet_sandbox.emulator.engine_config import CONFIG_FILE, EngineConfig, EngineConfigError

QUANT_CONFIG_FILE = "hf_quant_config.json"
# pytorch_backend_config.kv_cache_dtype -> kv_cache_quant_algo ("auto" keeps the checkpoint's).
KV_CACHE_QUANT_ALGO_BY_DTYPE = {"fp8": "FP8"}
# The sandbox's build and hub write bfloat16 checkpoints; the emulator names float16 too.
DTYPES = ("bfloat16", "float16")


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise EngineConfigError(f"{path} does not exist: is the checkpoint in the cache?") from None
    except (OSError, ValueError) as error:
        raise EngineConfigError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise EngineConfigError(f"{path} must hold a JSON object")
    return data


def _required(data: dict[str, Any], key: str, where: Path | str, kind: type = int) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise EngineConfigError(f"{where}: {key} must be a {kind.__name__}, got {value!r}")
    return value


def engine_config_from_checkpoint(checkpoint_dir: Path, llm_args: dict[str, Any]) -> EngineConfig:
    """The engine the LLM would run for `llm_args` (model.yaml without triton_config)."""
    config_path = checkpoint_dir / CONFIG_FILE
    config = _json(config_path)
    quantization = _json(checkpoint_dir / QUANT_CONFIG_FILE).get("quantization", {}) \
        if (checkpoint_dir / QUANT_CONFIG_FILE).exists() else {}
    dtype = config.get("torch_dtype", "bfloat16")
    if dtype not in DTYPES:
        raise EngineConfigError(f"{config_path}: torch_dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    kv_dtype = (llm_args.get("pytorch_backend_config") or {}).get("kv_cache_dtype", "auto")
    if kv_dtype != "auto" and kv_dtype not in KV_CACHE_QUANT_ALGO_BY_DTYPE:
        raise EngineConfigError(f"model.yaml pytorch_backend_config.kv_cache_dtype {kv_dtype!r} is not auto or "
                                + ", ".join(KV_CACHE_QUANT_ALGO_BY_DTYPE))
    heads = _required(config, "num_attention_heads", config_path)
    hidden_size = _required(config, "hidden_size", config_path)
    tp = _required(llm_args, "tensor_parallel_size", "model.yaml")
    pp = _required(llm_args, "pipeline_parallel_size", "model.yaml")
    context = _required(config, "max_position_embeddings", config_path)
    architectures = config.get("architectures") or ["unknown"]
    return EngineConfig(
        version="llmapi",
        architecture=architectures[0],
        dtype=dtype,
        num_hidden_layers=_required(config, "num_hidden_layers", config_path),
        hidden_size=hidden_size,
        intermediate_size=_required(config, "intermediate_size", config_path),
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads", heads),
        head_size=config.get("head_dim") or hidden_size // heads,
        vocab_size=_required(config, "vocab_size", config_path),
        max_position_embeddings=context,
        quant_algo=quantization.get("quant_algo"),
        kv_cache_quant_algo=KV_CACHE_QUANT_ALGO_BY_DTYPE.get(kv_dtype, quantization.get("kv_cache_quant_algo")),
        world_size=tp * pp, tp_size=tp, pp_size=pp,
        max_batch_size=_required(llm_args, "max_batch_size", "model.yaml"),
        # No input or sequence limit in model.yaml: the model's context window bounds both.
        max_input_len=context, max_seq_len=context,
        max_num_tokens=_required(llm_args, "max_num_tokens", "model.yaml"),
        num_experts=config.get("num_local_experts", 1),
        experts_per_token=config.get("num_experts_per_tok", 1),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )
