"""The emulated engine's profile: the planner's latency model, linearised for the emulator.

docs/render.md lists the keys; `llmfleet_sandbox.emulator.profile.EngineProfile` reads them.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api import LLMDeploymentSpec
from llmfleet.catalog import load_catalog
from llmfleet.planner.latency import build_engine, lm_head_flops, prefill_attention_flops, step_seconds
from llmfleet.planner.spec_adapter import model_arch_from_spec
from llmfleet.planner.types import Plan, SearchSpace
from llmfleet.render.identity import prefix_reuse_enabled, require_feasible

MS_PER_SECOND = 1000.0
SIGNIFICANT_DIGITS = 6


def _ms(seconds: float) -> float:
    # A few significant digits: the model is not more precise, and rendered text stays stable.
    return float(f"{seconds * MS_PER_SECOND:.{SIGNIFICANT_DIGITS}g}")
# The planner sized the KV pool with this fraction; config.pbtxt tells the backend the same.
KV_CACHE_FREE_GPU_MEM_FRACTION = SearchSpace.kv_cache_free_gpu_mem_fraction


def emulator_profile(plan: Plan, spec: LLMDeploymentSpec) -> dict[str, Any]:
    """Per-replica timing and capacity of the planned engine, as the emulator reads them.

    Linearised over the engine's own limits (maxBatchSize, maxNumTokens), never over the
    workload, so the profile changes only with the revision.
    """
    require_feasible(plan)
    catalog = load_catalog()
    engine_spec = spec.engine
    engine = build_engine(
        model_arch_from_spec(spec.model, context_window_tokens=engine_spec.max_seq_len, catalog=catalog),
        catalog.gpu(plan.gpu_type), catalog.quantization(plan.quantization),
        catalog.kv_cache_dtype(plan.kv_cache_dtype), plan.tensor_parallel_size, catalog.calibration,
        max_batch_size=engine_spec.max_batch_size, max_num_tokens=engine_spec.max_num_tokens,
        kv_cache_free_gpu_mem_fraction=KV_CACHE_FREE_GPU_MEM_FRACTION)
    empty_step_s = step_seconds(engine, 0, 0)
    full_batch = engine.max_batch_size
    full_chunk = engine.max_num_tokens
    full_batch_step_s = step_seconds(engine, full_batch, 0)
    full_chunk_step_s = step_seconds(engine, 0, 0, full_chunk,
                                     prefill_attention_flops(engine.model, full_chunk, 0))
    tokens_per_block = catalog.calibration.tokens_per_block
    return {
        "gpuType": plan.gpu_type,
        "tensorParallelSize": plan.tensor_parallel_size,
        "quantization": plan.quantization,
        "kvCacheDtype": plan.kv_cache_dtype,
        "prefillMsPerToken": _ms((full_chunk_step_s - empty_step_s) / full_chunk),
        "prefillFixedMs": _ms(lm_head_flops(engine.model) / engine.prefill_gemm_flops_per_sec),
        "decodeStepBaseMs": _ms(empty_step_s),
        "decodeStepMsPerSequence": _ms((full_batch_step_s - empty_step_s) / full_batch),
        "decodeStepMsPerKvToken": _ms(engine.fit.kv_bytes_per_token_per_gpu / engine.effective_bandwidth_bytes_per_sec),
        "kvBlockTokens": tokens_per_block,
        "kvBlocksTotal": engine.fit.kv_capacity_tokens // tokens_per_block,
        "maxBatchSize": engine.max_batch_size,
        "maxNumTokens": engine.max_num_tokens,
        "enablePrefixReuse": prefix_reuse_enabled(spec),
    }
