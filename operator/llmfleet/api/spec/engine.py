"""`spec.engine`: the serving runtime, its image and the engine limits."""

from pydantic import Field

from llmfleet.api.base import ApiModel, CelRule
from llmfleet.api.enums import Runtime


class EngineSpec(ApiModel):
    """The serving runtime, its Triton + TensorRT-LLM image and the engine limits."""

    runtime: Runtime = Field(
        default=Runtime.LLMAPI,
        description="How TensorRT-LLM serves the model: llmapi (its PyTorch backend behind "
        "Triton's LLM-API model; the checkpoint is fetched, no engine build) or engine "
        "(trtllm-build engines behind the tensorrtllm backend). The image's release decides "
        "which are valid.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Triton Inference Server image with TensorRT-LLM "
        "(<registry>/nvidia/tritonserver:<yy.mm>-trtllm-python-py3); its tag must be a pinned "
        "release that has the runtime. Omit for the runtime's pinned image.",
    )
    revision: str = Field(
        default="1",
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Engine revision. Changing it rebuilds the engine and rolls out a new "
        "revision even when nothing else changed.",
    )
    max_batch_size: int = Field(
        default=256,
        ge=1,
        le=4096,
        description="trtllm-build --max_batch_size: most requests in one in-flight batch.",
    )
    max_input_len: int = Field(
        default=4096,
        ge=1,
        le=1048576,
        description="trtllm-build --max_input_len: longest prompt, in tokens. Must cover "
        "spec.workload.inputTokensP99.",
    )
    max_seq_len: int = Field(
        default=8192,
        ge=2,
        le=1048576,
        description="trtllm-build --max_seq_len: longest prompt plus output, in tokens. Must "
        "cover spec.workload.inputTokensP99 + outputTokensP99.",
    )
    max_num_tokens: int = Field(
        default=8192,
        ge=1,
        le=1048576,
        description="trtllm-build --max_num_tokens: most tokens (prefill chunks plus decode "
        "steps) processed in one engine iteration.",
    )

    cel_rules = (
        CelRule(
            rule="self.maxSeqLen > self.maxInputLen",
            message="spec.engine.maxSeqLen must be greater than maxInputLen (it counts the "
            "prompt plus at least one output token)",
            holds=lambda e: e.max_seq_len > e.max_input_len,
            field_path=".maxSeqLen",
        ),
    )
