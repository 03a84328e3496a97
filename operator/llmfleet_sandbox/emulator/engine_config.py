"""A TensorRT-LLM engine's `config.json`, as the sandbox's build tools write it and its backend reads it.

The engine directory (`gpt_model_path`) holds `config.json` in TensorRT-LLM's engine layout:

    {"version": "...",
     "pretrained_config": {"architecture", "dtype", "num_hidden_layers", "hidden_size",
                           "intermediate_size", "num_attention_heads", "num_key_value_heads",
                           "head_size", "vocab_size", "max_position_embeddings",
                           "quantization": {"quant_algo", "kv_cache_quant_algo"},
                           "mapping": {"world_size", "tp_size", "pp_size"},
                           optional "moe": {"num_experts", "top_k"}, optional "tie_word_embeddings"},
     "build_config": {"max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"}}

This module also maps between the catalog's quantisation names (BF16, FP8, INT4AWQ, ...) and
TensorRT-LLM's `quant_algo` / `kv_cache_quant_algo` names, through the catalog's `qformat` and
`kv_cache_dtype_flag` (the quantize.py flags), so the build stand-ins and the emulated backend
agree on one table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmfleet.catalog import Catalog, ModelArch, load_catalog, model_from_numbers

CONFIG_FILE = "config.json"

# quantize.py --qformat -> the quant_algo its checkpoint (and so the engine) records.
# int8_wo and full_prec are set by quantize.py itself ("Workaround for wo quantization" in
# NVIDIA/TensorRT-LLM@042c510d33e3ba07ac0e3d1ef810b82198b90e0c:tensorrt_llm/quantization/quantize_by_modelopt.py,
# a stored commit, not a tag); the others are what ModelOpt's export writes for those formats.
# Names: QuantAlgo in NVIDIA/TensorRT-LLM@d879430b040ea30c65220c9171a8a70607398748:tensorrt_llm/quantization/mode.py.
# To verify against the 24.12 image (TensorRT-LLM 0.16).
QUANT_ALGO_BY_QFORMAT: dict[str, str | None] = {
    "full_prec": None,
    "fp8": "FP8",
    "int8_wo": "W8A16",
    "int4_awq": "W4A16_AWQ",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "nvfp4": "NVFP4",
}
# Build tools: quantize.py accepts these qformats too, though no catalog quantisation uses them
# (int4_wo is set by the same workaround; W4A8_AWQ is ModelOpt's name for w4a8_awq).
QUANTIZE_ONLY_QUANT_ALGO_BY_QFORMAT: dict[str, str] = {"int4_wo": "W4A16", "w4a8_awq": "W4A8_AWQ"}
# quantize.py --kv_cache_dtype -> kv_cache_quant_algo (QuantAlgo.FP8 / QuantAlgo.INT8); no flag
# keeps the KV cache in the model dtype and records null.
KV_CACHE_QUANT_ALGO_BY_FLAG: dict[str | None, str | None] = {None: None, "fp8": "FP8", "int8": "INT8"}
# pretrained_config.dtype -> the catalog's name for unquantised weights / KV in that dtype.
CATALOG_NAME_BY_DTYPE = {"bfloat16": "BF16", "float16": "FP16"}


class EngineConfigError(ValueError):
    """The engine's config.json is missing, unreadable or lacks a key; the message says which."""


@dataclass(frozen=True)
class EngineConfig:
    version: str
    architecture: str
    dtype: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_size: int
    vocab_size: int
    max_position_embeddings: int
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    world_size: int
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    num_experts: int = 1
    experts_per_token: int = 1
    tie_word_embeddings: bool = False

    def to_json_dict(self) -> dict[str, Any]:
        pretrained: dict[str, Any] = {
            "architecture": self.architecture,
            "dtype": self.dtype,
            "num_hidden_layers": self.num_hidden_layers,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_size": self.head_size,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "quantization": {"quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo},
            "mapping": {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size},
        }
        if self.num_experts > 1:
            pretrained["moe"] = {"num_experts": self.num_experts, "top_k": self.experts_per_token}
        return {
            "version": self.version,
            "pretrained_config": pretrained,
            "build_config": {"max_batch_size": self.max_batch_size, "max_input_len": self.max_input_len,
                             "max_seq_len": self.max_seq_len, "max_num_tokens": self.max_num_tokens},
        }

    def model_arch(self) -> ModelArch:
        """The planner's view of the engine's model."""
        return model_from_numbers(
            name=self.architecture, num_layers=self.num_hidden_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads, num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_size, intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings, num_experts=self.num_experts,
            experts_per_token=self.experts_per_token, tie_word_embeddings=self.tie_word_embeddings)

    def catalog_quantization(self, catalog: Catalog | None = None) -> str:
        """The catalog quantisation the weights are in (unquantised: the model dtype's name)."""
        if self.quant_algo is None:
            return _dtype_name(self.dtype)
        catalog = catalog or load_catalog()
        for name, quantization in catalog.quantizations.items():
            if QUANT_ALGO_BY_QFORMAT.get(quantization.qformat) == self.quant_algo:
                return name
        raise EngineConfigError(f"config.json quant_algo {self.quant_algo!r} is not one the catalog builds; known: "
                                f"{sorted(filter(None, QUANT_ALGO_BY_QFORMAT.values()))}")

    def catalog_kv_cache_dtype(self, catalog: Catalog | None = None) -> str:
        if self.kv_cache_quant_algo is None:
            return _dtype_name(self.dtype)
        catalog = catalog or load_catalog()
        for name, kv_dtype in catalog.kv_cache_dtypes.items():
            flag = kv_dtype.kv_cache_dtype_flag
            if flag is not None and KV_CACHE_QUANT_ALGO_BY_FLAG[flag] == self.kv_cache_quant_algo:
                return name
        raise EngineConfigError(f"config.json kv_cache_quant_algo {self.kv_cache_quant_algo!r} is unknown; known: "
                                f"{sorted(filter(None, KV_CACHE_QUANT_ALGO_BY_FLAG.values()))}")


def quant_algo_for(quantization: str, catalog: Catalog | None = None) -> str | None:
    """TensorRT-LLM's quant_algo for a catalog quantisation (BF16 and FP16: None)."""
    return QUANT_ALGO_BY_QFORMAT[(catalog or load_catalog()).quantization(quantization).qformat]


def kv_cache_quant_algo_for(kv_cache_dtype: str, catalog: Catalog | None = None) -> str | None:
    """TensorRT-LLM's kv_cache_quant_algo for a catalog KV dtype (BF16 and FP16: None)."""
    return KV_CACHE_QUANT_ALGO_BY_FLAG[(catalog or load_catalog()).kv_cache_dtype(kv_cache_dtype).kv_cache_dtype_flag]


def dtype_for(quantization: str, kv_cache_dtype: str) -> str:
    """pretrained_config.dtype: the dtype of what is not quantised (FP16 if either says FP16)."""
    return "float16" if "FP16" in (quantization, kv_cache_dtype) else "bfloat16"


def _dtype_name(dtype: str) -> str:
    try:
        return CATALOG_NAME_BY_DTYPE[dtype]
    except KeyError:
        raise EngineConfigError(f"config.json dtype {dtype!r} is not one of {sorted(CATALOG_NAME_BY_DTYPE)}") from None


def read_engine_config(engine_dir: Path) -> EngineConfig:
    path = Path(engine_dir) / CONFIG_FILE
    if not Path(engine_dir).is_dir():
        raise EngineConfigError(f"engine directory {engine_dir} does not exist (gpt_model_path); was the engine built?")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise EngineConfigError(f"{path} does not exist: the engine directory has no config.json") from None
    except (OSError, json.JSONDecodeError) as error:
        raise EngineConfigError(f"cannot read {path}: {error}") from None
    return engine_config_from_json_dict(data, source=str(path))


def engine_config_from_json_dict(data: Any, source: str = CONFIG_FILE) -> EngineConfig:
    def section(parent: Any, key: str, where: str) -> dict:
        value = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(value, dict):
            raise EngineConfigError(f"{source}: {where}{key} must be an object")
        return value

    def value(parent: dict, key: str, where: str, kind: type, *, optional: bool = False, default: Any = None):
        if key not in parent:
            if optional:
                return default
            raise EngineConfigError(f"{source}: {where}{key} is missing")
        found = parent[key]
        if found is None and optional:
            return default
        if kind is int and (isinstance(found, bool) or not isinstance(found, int) or found < 1):
            raise EngineConfigError(f"{source}: {where}{key} must be a positive integer, got {found!r}")
        if kind is not int and not isinstance(found, kind):
            raise EngineConfigError(f"{source}: {where}{key} must be a {kind.__name__}, got {found!r}")
        return found

    pretrained = section(data, "pretrained_config", "")
    quantization = section(pretrained, "quantization", "pretrained_config.")
    mapping = section(pretrained, "mapping", "pretrained_config.")
    build = section(data, "build_config", "")
    moe = pretrained.get("moe") or {}
    if not isinstance(moe, dict) or not all(isinstance(moe.get(key, 0), int) for key in ("num_experts", "top_k")):
        raise EngineConfigError(f"{source}: pretrained_config.moe must be an object with integer num_experts, top_k")
    p, q, m, b = "pretrained_config.", "pretrained_config.quantization.", "pretrained_config.mapping.", "build_config."
    return EngineConfig(
        version=str(data.get("version", "")),
        architecture=value(pretrained, "architecture", p, str),
        dtype=value(pretrained, "dtype", p, str),
        **{key: value(pretrained, key, p, int) for key in (
            "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_size", "vocab_size", "max_position_embeddings")},
        quant_algo=value(quantization, "quant_algo", q, str, optional=True),
        kv_cache_quant_algo=value(quantization, "kv_cache_quant_algo", q, str, optional=True),
        world_size=value(mapping, "world_size", m, int),
        tp_size=value(mapping, "tp_size", m, int),
        pp_size=value(mapping, "pp_size", m, int, optional=True, default=1),
        **{key: value(build, key, b, int) for key in (
            "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")},
        # TensorRT-LLM writes num_experts 0 (and top_k 0) for dense models.
        num_experts=max(1, moe.get("num_experts") or 1),
        experts_per_token=max(1, moe.get("top_k") or 1),
        tie_word_embeddings=value(pretrained, "tie_word_embeddings", p, bool, optional=True, default=False),
    )
