"""Closed value sets of the LLMDeployment API.

Values are the exact strings users write in manifests; they also key the catalog.
"""

from enum import Enum


class Quantization(str, Enum):
    """Weight (and activation) precision of the built engine."""

    BF16 = "BF16"
    FP16 = "FP16"
    FP8 = "FP8"
    INT8_WEIGHT_ONLY = "INT8WeightOnly"
    INT4_AWQ = "INT4AWQ"
    INT8_SMOOTH_QUANT = "INT8SmoothQuant"
    NVFP4 = "NVFP4"


class Runtime(str, Enum):
    """How TensorRT-LLM serves the model behind Triton."""

    # TensorRT-LLM's PyTorch backend behind Triton's LLM-API python model: checkpoints load
    # directly, no engine build.
    LLMAPI = "llmapi"
    # TensorRT engines built by trtllm-build, served by the tensorrtllm backend's
    # inflight_batcher_llm ensemble.
    ENGINE = "engine"


class KvCacheDtype(str, Enum):
    """Element type of the paged KV cache."""

    BF16 = "BF16"
    FP16 = "FP16"
    FP8 = "FP8"
    INT8 = "INT8"


class GpuType(str, Enum):
    """GPU models the operator knows how to plan for (keys of the GPU catalog)."""

    H100_SXM_80GB = "H100-SXM-80GB"
    H200_SXM_141GB = "H200-SXM-141GB"
    B200_180GB = "B200-180GB"
    A100_SXM_80GB = "A100-SXM-80GB"
    L40S_48GB = "L40S-48GB"


class CatalogModel(str, Enum):
    """Model architectures shipped in the catalog, selectable by name."""

    LLAMA_3_1_8B = "llama-3.1-8b"
    LLAMA_3_1_70B = "llama-3.1-70b"
    LLAMA_3_1_405B = "llama-3.1-405b"
    MISTRAL_7B = "mistral-7b"
    MIXTRAL_8X7B = "mixtral-8x7b"
    QWEN2_5_72B = "qwen2.5-72b"
    DEEPSEEK_V3 = "deepseek-v3"
    DEEPSEEK_R1 = "deepseek-r1"
    QWEN3_235B_A22B = "qwen3-235b-a22b"
    QWEN3_30B_A3B = "qwen3-30b-a3b"
    QWEN3_32B = "qwen3-32b"
    LLAMA_4_SCOUT = "llama-4-scout"
    LLAMA_4_MAVERICK = "llama-4-maverick"
    GPT_OSS_20B = "gpt-oss-20b"
    GPT_OSS_120B = "gpt-oss-120b"


class LocalAttentionKind(str, Enum):
    """How a local-attention layer bounds the tokens it attends to."""

    SLIDING_WINDOW = "SlidingWindow"  # the last windowTokens tokens (gpt-oss, Gemma 3, Mistral 7B v0.1)
    CHUNKED = "Chunked"  # the tokens of its own windowTokens-long chunk (Llama 4)


class EndpointPickerFailureMode(str, Enum):
    """What the gateway does with a request when the endpoint picker does not answer."""

    FAIL_OPEN = "FailOpen"  # route it to any pod of the pool
    FAIL_CLOSE = "FailClose"  # refuse it


class LiveReplanning(str, Enum):
    """What the operator does with what live metrics teach it about the plan."""

    OFF = "Off"  # observe nothing beyond what the autoscaler reads; plan with no learned speed
    RECOMMEND = "Recommend"  # learn speeds, write status.recommendation and an event
    AUTOMATIC = "Automatic"  # and serve the recommended plan, rolled out as spec.rollout says


class ConditionStatus(str, Enum):
    """metav1.Condition status values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


# Tensor-parallel sizes that fit one NVLink domain and divide common head counts.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
