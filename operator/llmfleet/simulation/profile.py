"""The engine profile: what one emulated TensorRT-LLM engine is and how fast it runs (pure).

`profile_for_build` derives it from an engine build (model, GPU, TP, quantisation, KV dtype,
batch and token limits, serving parameters) through the planner's latency model: the sandbox's
emulated backend at model load (from the engine's config.json), `llmfleet simulate` from a plan.
The JSON form (keys in camelCase, as in the CRDs) is for logs and tests. The descriptive keys
(GPU, TP, quantisation, KV dtype) only label the engine; the timing and capacity keys drive it.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from typing import Any

from llmfleet.catalog import Catalog, GpuType, ModelArch, load_catalog
from llmfleet.planner.latency import build_engine, lm_head_flops, prefill_attention_flops, step_seconds
from llmfleet.planner.layout import Layout

MS_PER_SECOND = 1000.0
# The model is not more precise than this, and logged profiles stay readable.
SIGNIFICANT_DIGITS = 6


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


def _ms(seconds: float) -> float:
    return float(f"{seconds * MS_PER_SECOND:.{SIGNIFICANT_DIGITS}g}")


def profile_for_build(model: ModelArch, gpu: GpuType, quantization: str, kv_cache_dtype: str,
                      parallel: Layout | int, max_batch_size: int, max_num_tokens: int,
                      kv_cache_free_gpu_mem_fraction: float, enable_prefix_reuse: bool,
                      catalog: Catalog | None = None, gpus_per_node: int | None = None) -> EngineProfile:
    """The planner's latency model of this engine build on this GPU, linearised for the emulator.

    The planner's step is a roofline per kernel (GEMMs: max(weights, FLOPs)); the emulator's is
    additive. The secants are taken over the engine's own limits (max_batch_size, max_num_tokens), never over
    a workload, so the profile is a function of the engine and its serving parameters only:
    base = the empty step; per sequence = secant of a zero-context decode step from 0 to
    max_batch_size sequences; per KV token = KV bytes per token per GPU over effective
    bandwidth; per prompt token = secant of a prefill step from 0 to max_num_tokens tokens;
    fixed per prompt = the LM head of one prompt. `parallel` and `gpus_per_node` as for the
    planner's `build_engine` (a layout spanning nodes pays its hand-offs over the network).
    """
    catalog = catalog or load_catalog()
    layout = Layout.of(parallel)
    tensor_parallel_size = layout.tensor_parallel_size
    engine = build_engine(
        model, gpu, catalog.quantization(quantization), catalog.kv_cache_dtype(kv_cache_dtype),
        layout, catalog.calibration, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
        kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction, gpus_per_node=gpus_per_node)
    empty_step_s = step_seconds(engine, 0, 0)
    full_batch, full_chunk = engine.max_batch_size, engine.max_num_tokens
    full_batch_step_s = step_seconds(engine, full_batch, 0)
    full_chunk_step_s = step_seconds(engine, 0, 0, full_chunk, prefill_attention_flops(engine.model, full_chunk, 0))
    tokens_per_block = catalog.calibration.tokens_per_block
    kv_blocks = engine.fit.kv_capacity_tokens // tokens_per_block
    if kv_blocks < 1:
        raise ProfileError(f"the engine leaves no KV cache on {gpu.name} x{tensor_parallel_size} with "
                           f"kv_cache_free_gpu_mem_fraction {kv_cache_free_gpu_mem_fraction}")
    profile = EngineProfile(
        gpu_type=gpu.name,
        tensor_parallel_size=tensor_parallel_size,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        prefill_ms_per_token=_ms((full_chunk_step_s - empty_step_s) / full_chunk),
        prefill_fixed_ms=_ms(lm_head_flops(engine.model) / engine.prefill_gemm_flops_per_sec),
        decode_step_base_ms=_ms(empty_step_s),
        decode_step_ms_per_sequence=_ms((full_batch_step_s - empty_step_s) / full_batch),
        decode_step_ms_per_kv_token=_ms(engine.fit.kv_bytes_per_token_per_gpu
                                        / engine.effective_bandwidth_bytes_per_sec),
        kv_block_tokens=tokens_per_block,
        kv_blocks_total=kv_blocks,
        max_batch_size=engine.max_batch_size,
        max_num_tokens=engine.max_num_tokens,
        enable_prefix_reuse=enable_prefix_reuse,
    )
    profile._check_consistency()
    return profile
