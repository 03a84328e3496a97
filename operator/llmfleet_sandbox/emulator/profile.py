"""The engine profile: what one emulated TensorRT-LLM engine is and how fast it runs.

`profile_for_engine` derives it, at model load, from what a real engine has at that point: its
config.json, the `tensorrt_llm` model's parameters and the GPU it runs on, through the planner's
latency model. The JSON form (keys in camelCase, as in the CRDs) is for logs and tests. The
descriptive keys (GPU, TP, quantisation, KV dtype) only label the engine; the timing and
capacity keys drive it.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any

from llmfleet.catalog import GpuType, load_catalog
from llmfleet.planner.layout import Layout
from llmfleet.planner.latency import build_engine, lm_head_flops, prefill_attention_flops, step_seconds
from llmfleet_sandbox.emulator.engine_config import EngineConfig, read_engine_config

# Set by the sandbox's node agent on pods that request GPUs: the node's nvidia.com/gpu.product label.
GPU_PRODUCT_VARIABLE = "LLMFLEET_SANDBOX_GPU_PRODUCT"
# OpenMPI's count of the ranks on the process's own node (the sandbox's mpirun sets it too).
MPI_LOCAL_SIZE_VARIABLE = "OMPI_COMM_WORLD_LOCAL_SIZE"
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


def gpu_for_product(gpu_product: str | None, variable: str = GPU_PRODUCT_VARIABLE) -> GpuType:
    """The catalog GPU whose GPU Feature Discovery product label is `gpu_product`."""
    catalog = load_catalog()
    known = sorted(gpu.gfd_product for gpu in catalog.gpus.values())
    if not gpu_product:
        raise ProfileError(f"{variable} is not set: the emulated engine needs the node's nvidia.com/gpu.product "
                           f"label to know its speed; known: {known}")
    for gpu in catalog.gpus.values():
        if gpu.gfd_product == gpu_product:
            return gpu
    raise ProfileError(f"{variable}={gpu_product!r} is not a GPU product of the catalog; known: {known}")


def _ms(seconds: float) -> float:
    return float(f"{seconds * MS_PER_SECOND:.{SIGNIFICANT_DIGITS}g}")


def profile_for_engine(config: EngineConfig, gpu: GpuType, kv_cache_free_gpu_mem_fraction: float,
                       enable_prefix_reuse: bool, gpus_per_node: int | None = None) -> EngineProfile:
    """The planner's latency model of this engine on this GPU, linearised for the emulator.

    The planner's step is a roofline per kernel (GEMMs: max(weights, FLOPs)); the emulator's is
    additive. The secants are taken over the engine's own limits (max_batch_size, max_num_tokens), never over
    a workload, so the profile is a function of the engine and its serving parameters only:
    base = the empty step; per sequence = secant of a zero-context decode step from 0 to
    max_batch_size sequences; per KV token = KV bytes per token per GPU over effective
    bandwidth; per prompt token = secant of a prefill step from 0 to max_num_tokens tokens;
    fixed per prompt = the LM head of one prompt.

    The layout is the engine's own (tp_size x pp_size of its mapping): the planner's step charges
    its pipeline hand-offs, over the network between the `gpus_per_node` groups of ranks (the
    rank group's placement, `ranks_per_node`; None: whole nodes of the GPU type).
    """
    catalog = load_catalog()
    quantization = config.catalog_quantization(catalog)
    kv_cache_dtype = config.catalog_kv_cache_dtype(catalog)
    engine = build_engine(
        config.model_arch(), gpu, catalog.quantization(quantization), catalog.kv_cache_dtype(kv_cache_dtype),
        Layout(config.tp_size, config.pp_size), catalog.calibration, max_batch_size=config.max_batch_size,
        max_num_tokens=config.max_num_tokens, kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction,
        gpus_per_node=gpus_per_node)
    empty_step_s = step_seconds(engine, 0, 0)
    full_batch, full_chunk = engine.max_batch_size, engine.max_num_tokens
    full_batch_step_s = step_seconds(engine, full_batch, 0)
    full_chunk_step_s = step_seconds(engine, 0, 0, full_chunk, prefill_attention_flops(engine.model, full_chunk, 0))
    tokens_per_block = catalog.calibration.tokens_per_block
    kv_blocks = engine.fit.kv_capacity_tokens // tokens_per_block
    if kv_blocks < 1:
        raise ProfileError(f"the engine leaves no KV cache on {gpu.name} x{config.tp_size} with "
                           f"kv_cache_free_gpu_mem_fraction {kv_cache_free_gpu_mem_fraction}")
    profile = EngineProfile(
        gpu_type=gpu.name,
        tensor_parallel_size=config.tp_size,
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


def ranks_per_node(environ: dict[str, str]) -> int | None:
    """The rank group's ranks on rank 0's node, as OpenMPI tells every rank (its launcher fills each
    host's slots in order); None outside mpirun."""
    local_size = environ.get(MPI_LOCAL_SIZE_VARIABLE)
    if local_size is None:
        return None
    if not local_size.isdigit() or int(local_size) < 1:
        raise ProfileError(f"{MPI_LOCAL_SIZE_VARIABLE}={local_size!r} is not a positive rank count")
    return int(local_size)


def engine_profile(engine_dir: Path, gpu_product: str | None, kv_cache_free_gpu_mem_fraction: float,
                   enable_prefix_reuse: bool) -> EngineProfile:
    """What the emulated backend serves for the engine in `engine_dir` on a `gpu_product` node
    with these `tensorrt_llm` parameters (the same call the backend makes at model load)."""
    return profile_for_engine(read_engine_config(engine_dir), gpu_for_product(gpu_product),
                              kv_cache_free_gpu_mem_fraction, enable_prefix_reuse)


def with_faults(profile: EngineProfile, environ: dict[str, str]) -> EngineProfile:
    """The profile with the sandbox's injected faults (llmfleet_sandbox.faults): a slowdown
    multiplies every prefill and decode cost."""
    from llmfleet_sandbox.faults import injected

    factor = injected(environ).slowdown
    if factor == 1.0:
        return profile
    return replace(profile, prefill_ms_per_token=profile.prefill_ms_per_token * factor,
                   prefill_fixed_ms=profile.prefill_fixed_ms * factor,
                   decode_step_base_ms=profile.decode_step_base_ms * factor,
                   decode_step_ms_per_sequence=profile.decode_step_ms_per_sequence * factor,
                   decode_step_ms_per_kv_token=profile.decode_step_ms_per_kv_token * factor)
