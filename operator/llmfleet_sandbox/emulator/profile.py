"""The engine profile: what one emulated TensorRT-LLM engine is and how fast it runs.

The operator renders it as the JSON string parameter `engine_profile_json` of the
`tensorrt_llm` model's config.pbtxt (keys in camelCase, as in the CRDs). The descriptive keys
(GPU, TP, quantisation, KV dtype) only label the engine; the timing and capacity keys drive it.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from typing import Any


class ProfileError(ValueError):
    """The engine profile is missing a key or has an invalid value; the message names it."""


@dataclass(frozen=True)
class EngineProfile:
    gpu_type: str
    tensor_parallel_size: int
    quantization: str
    kv_cache_dtype: str
    # Prefill (context phase): cost per prompt token computed, plus a fixed cost per prompt
    # finishing in a step (the LM head that yields its first token).
    prefill_ms_per_token: float
    prefill_fixed_ms: float
    # Every step pays the base cost (weights streamed once, launches); each decoding sequence
    # adds its own cost and its KV read, proportional to the tokens in its context.
    decode_step_base_ms: float
    decode_step_ms_per_sequence: float
    decode_step_ms_per_kv_token: float
    kv_block_tokens: int
    kv_blocks_total: int
    max_batch_size: int
    max_num_tokens: int
    # Log-normal multiplicative noise on every step with mean 1 and this standard deviation
    # (approximately, for small values): real steps vary with clocks, NCCL and host jitter.
    jitter_fraction: float = 0.0
    enable_prefix_reuse: bool = False
    seed: int = 0

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> "EngineProfile":
        if not isinstance(data, dict):
            raise ProfileError(f"engine profile must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_JSON_KEYS))
        if unknown:
            raise ProfileError(f"engine profile has unknown keys {unknown}; known keys: {sorted(_JSON_KEYS)}")
        values = {}
        for json_key, field_name in _JSON_KEYS.items():
            if json_key not in data:
                if field_name in _OPTIONAL_DEFAULTS:
                    continue
                raise ProfileError(f"engine profile is missing required key {json_key!r}")
            values[field_name] = _checked(json_key, data[json_key])
        profile = cls(**values)
        profile._check_consistency()
        return profile

    @classmethod
    def from_json(cls, text: str) -> "EngineProfile":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ProfileError(f"engine profile is not valid JSON: {error}") from None
        return cls.from_json_dict(data)

    def to_json_dict(self) -> dict[str, Any]:
        return {json_key: getattr(self, field_name) for json_key, field_name in _JSON_KEYS.items()}

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks_total * self.kv_block_tokens

    def _check_consistency(self) -> None:
        # Every step must be able to carry one decode token per batch slot, or a full batch
        # could never make progress.
        if self.max_num_tokens < self.max_batch_size:
            raise ProfileError(f"maxNumTokens ({self.max_num_tokens}) must be at least "
                               f"maxBatchSize ({self.max_batch_size})")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_JSON_KEYS = {_camel(field.name): field.name for field in fields(EngineProfile)}
_OPTIONAL_DEFAULTS = {field.name for field in fields(EngineProfile) if field.default is not MISSING}

_NON_EMPTY_STRINGS = {"gpuType", "quantization", "kvCacheDtype"}
_POSITIVE_INTS = {"tensorParallelSize", "kvBlockTokens", "kvBlocksTotal", "maxBatchSize", "maxNumTokens"}


def _checked(key: str, value: Any) -> Any:
    if key in _NON_EMPTY_STRINGS:
        if not isinstance(value, str) or not value:
            raise ProfileError(f"engine profile key {key!r} must be a non-empty string, got {value!r}")
        return value
    if key in _POSITIVE_INTS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"engine profile key {key!r} must be a positive integer, got {value!r}")
        return value
    if key == "seed":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"engine profile key 'seed' must be an integer, got {value!r}")
        return value
    if key == "enablePrefixReuse":
        if not isinstance(value, bool):
            raise ProfileError(f"engine profile key 'enablePrefixReuse' must be true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ProfileError(f"engine profile key {key!r} must be a non-negative number, got {value!r}")
    if key == "jitterFraction" and value >= 1:
        raise ProfileError(f"engine profile key 'jitterFraction' must be below 1, got {value!r}")
    return float(value)
