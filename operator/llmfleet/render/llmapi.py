"""The LLM-API runtime: TensorRT-LLM's PyTorch backend behind Triton's `llmapi` python model.

No engine build. A prepare Job fetches the checkpoint (the source's own for BF16, a published
ModelOpt checkpoint for FP8/NVFP4: catalog/releases/llmapi-*.yaml) into the cache; one model,
`tensorrt_llm`, serves text in and text out, its LLM arguments in `model.yaml` beside the
image's `model.py`. Every key written here is checked against the release record in tests.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api import LLMDeploymentSpec, hub_repo_id
from llmfleet.api.spec import SOURCE_REQUIRED_MESSAGE
from llmfleet.catalog import load_catalog
from llmfleet.catalog.release_record import ReleaseRecord
from llmfleet.planner.types import Plan
from llmfleet.render import layout
from llmfleet.render.identity import prefix_reuse_enabled
from llmfleet.render.model_repo import (
    BOOL,
    FP32,
    INT32,
    KV_CACHE_FREE_GPU_MEM_FRACTION,
    STRING,
    UINT64,
    VERSION,
    cpu_instances,
    tensor,
    ttft_histogram,
)
from llmfleet.render.pbtxt import to_pbtxt
from llmfleet.render.settings import RenderError
from llmfleet.render.yaml_text import yaml_text

MODEL_YAML = "model.yaml"
# The image's model code, copied next to model.yaml (the upstream layout, all_models/llmapi).
MODEL_CODE_FILES = ("model.py", "helpers.py")
# Streaming needs a decoupled model; the model takes one prompt per request (no batching).
TRITON_CONFIG = {"max_batch_size": 0, "decoupled": True}
SAMPLING_INPUTS = (("beam_width", INT32), ("temperature", FP32), ("top_k", INT32), ("top_p", FP32),
                   ("frequency_penalty", FP32), ("presence_penalty", FP32), ("max_tokens", INT32),
                   ("seed", UINT64), ("exclude_input_from_output", BOOL))
OUTPUT_FIELDS = (("finish_reason", STRING), ("stop_reason", STRING), ("cumulative_logprob", FP32))


def checkpoint_repo_id(spec: LLMDeploymentSpec, plan: Plan, release: ReleaseRecord) -> str:
    """The hub repo the prepare Job downloads for this plan."""
    source = hub_repo_id(spec.model.source)
    if source is None:
        raise RenderError(SOURCE_REQUIRED_MESSAGE)
    repo = release.checkpoint_repo(source, plan.quantization)
    if repo is None:
        raise RenderError(f"{release.release} has no published {plan.quantization} checkpoint of {source}; "
                          "plan another quantization (the planner does not offer this one)")
    return repo


def model_config(spec: LLMDeploymentSpec) -> dict[str, Any]:
    return {
        "name": layout.TENSORRT_LLM_MODEL,
        "backend": "python",
        # Written here as well as in model.yaml: the server runs with auto-complete disabled,
        # and the model's initialize() reads triton_config.
        "max_batch_size": TRITON_CONFIG["max_batch_size"],
        "model_transaction_policy": {"decoupled": TRITON_CONFIG["decoupled"]},
        "input": [
            tensor("text_input", STRING, [-1]),
            tensor("streaming", BOOL, [1], optional=True),
            *(tensor(f"sampling_param_{name}", data_type, [1], optional=True) for name, data_type in SAMPLING_INPUTS),
            tensor("sampling_param_stop", STRING, [-1], optional=True),
            *(tensor(f"return_{name}", BOOL, [1], optional=True) for name, _ in OUTPUT_FIELDS),
        ],
        "output": [tensor("text_output", STRING, [-1]),
                   *(tensor(name, data_type, [-1]) for name, data_type in OUTPUT_FIELDS)],
        "instance_group": cpu_instances(1),
        "model_metrics": ttft_histogram(spec),
    }


def llm_arguments(spec: LLMDeploymentSpec, plan: Plan, engine_cache_key: str) -> dict[str, Any]:
    """model.yaml: the LLM's arguments from the plan, and the Triton settings."""
    kv_cache_dtype = load_catalog().kv_cache_dtype(plan.kv_cache_dtype).kv_cache_dtype_flag
    return {
        "model": layout.checkpoint_dir(engine_cache_key),
        "backend": "pytorch",
        "tensor_parallel_size": plan.tensor_parallel_size,
        "pipeline_parallel_size": plan.pipeline_parallel_size,
        # EP x expert TP = TP (LlmArgs' moe_*_parallel_size); written only for an MoE layout.
        **({"moe_expert_parallel_size": plan.expert_parallel_size,
            "moe_tensor_parallel_size": plan.tensor_parallel_size // plan.expert_parallel_size}
           if plan.expert_parallel_size > 1 else {}),
        **({"enable_attention_dp": True} if plan.attention_data_parallel else {}),
        "max_batch_size": spec.engine.max_batch_size,
        "max_num_tokens": spec.engine.max_num_tokens,
        # The planner's prefill model chunks long prompts by max_num_tokens.
        "enable_chunked_prefill": True,
        "kv_cache_config": {"free_gpu_memory_fraction": KV_CACHE_FREE_GPU_MEM_FRACTION,
                            "enable_block_reuse": prefix_reuse_enabled(spec)},
        # "auto" keeps the checkpoint's dtype; the planner pairs FP8 only with quantised weights.
        "pytorch_backend_config": {"kv_cache_dtype": kv_cache_dtype or "auto"},
        "triton_config": dict(TRITON_CONFIG),
    }


def model_repository_files(spec: LLMDeploymentSpec, plan: Plan, engine_cache_key: str) -> dict[str, str]:
    """Repository-relative path -> file content: the config and model.yaml of `tensorrt_llm`."""
    name = layout.TENSORRT_LLM_MODEL
    return {
        f"{name}/config.pbtxt": to_pbtxt(model_config(spec)),
        f"{name}/{VERSION}/{MODEL_YAML}": yaml_text(llm_arguments(spec, plan, engine_cache_key)),
    }
