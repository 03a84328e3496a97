"""`spec.engine`: the serving runtime, its image, the engine limits and the calibration set."""

import re

from pydantic import Field

from llmfleet.api.base import MAX_URI_LENGTH, URI_PATTERN, URI_WITH_CREDENTIALS_PATTERN, ApiModel, CelRule, no_uri_credentials_rule
from llmfleet.api.enums import Runtime
from llmfleet.api.spec.model import (
    HUB_DATASET_PREFIX,
    HUB_REPO_PATTERN,
    OBJECT_STORE_URI_PATTERN,
    VOLUME_URI_PATTERN,
)

# Where a calibration set can come from: the schemes of spec.model.source, a hub *dataset* repo.
CALIBRATION_DATASET_PATTERN = f"^(hf://datasets/{HUB_REPO_PATTERN}|{VOLUME_URI_PATTERN}|{OBJECT_STORE_URI_PATTERN})$"
CALIBRATION_DATASET_SOURCES = (f"{HUB_DATASET_PREFIX}<org>/<name> (a Hugging Face hub dataset repo), "
                               "pvc://<claim>/<path> (a directory on a PersistentVolumeClaim in the namespace) "
                               "or s3://<bucket>/<prefix> (a prefix in the weights' object store)")
# What quantize.py reads from a local directory (catalog/releases/engine-24.12.yaml,
# quantize.calibration.local_directory: datasets.load_dataset(<dir>, split="train")["text"]).
CALIBRATION_DATASET_FORMAT = ("data files datasets.load_dataset reads (JSON lines, CSV, Parquet or text) "
                              "whose train split has a text column")
# TensorRT-LLM 0.16's quantize.py loads any --calib_dataset containing this from the Hub
# (quantize.calibration.hub_dataset_marker), before it looks for a local directory.
HUB_CALIBRATION_MARKER = "cnn_dailymail"
CALIBRATION_DATASET_FIELD = "spec.engine.calibrationDataset"


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
    calibration_dataset: str | None = Field(
        default=None,
        max_length=MAX_URI_LENGTH,
        pattern=URI_PATTERN,
        description="The calibration set quantize.py runs through the model when the engine "
        "build calibrates: FP8, INT8 SmoothQuant and INT4 AWQ weights, and any FP8 or INT8 KV "
        "cache (BF16, FP16 and INT8 weight-only builds with a BF16/FP16 KV cache read none). "
        f"{CALIBRATION_DATASET_SOURCES}; fetched the way the weights are: the hub repo with "
        "huggingface-cli (the hub token of spec.model.secretRef, when the weights come from the "
        "hub), the claim mounted read-only, the prefix synced with spec.model.objectStore and "
        "secretRef (so s3:// needs an s3:// spec.model.source). quantize.py (TensorRT-LLM 0.16) "
        "reads the directory with datasets.load_dataset(<dir>, split=\"train\") and takes its "
        f"\"text\" column, so it must hold {CALIBRATION_DATASET_FORMAT}. Unset: the build "
        "downloads cnn_dailymail from the Hugging Face hub at build time, which is rendered only "
        "for hf:// weights; with pvc:// or s3:// weights (a cluster that may have no hub egress) "
        "a calibrating build is refused (Planned=False, RenderFailed) until this is set. Engine "
        "runtime only: the llmapi runtime serves published checkpoints and calibrates nothing.",
    )

    cel_rules = (
        no_uri_credentials_rule("calibrationDataset", "calibration_dataset", CALIBRATION_DATASET_FIELD),
        # A URI with credentials gets only the rule above, which says what to do instead.
        CelRule(
            rule="!has(self.calibrationDataset) || "
            f"self.calibrationDataset.matches('{URI_WITH_CREDENTIALS_PATTERN}') || "
            f"self.calibrationDataset.matches('{CALIBRATION_DATASET_PATTERN}')",
            message=f"{CALIBRATION_DATASET_FIELD} must be {CALIBRATION_DATASET_SOURCES}, a directory holding "
            f"{CALIBRATION_DATASET_FORMAT}",
            holds=lambda e: e.calibration_dataset is None
            or re.match(URI_WITH_CREDENTIALS_PATTERN, e.calibration_dataset) is not None
            or re.match(CALIBRATION_DATASET_PATTERN, e.calibration_dataset) is not None,
            field_path=".calibrationDataset",
        ),
        CelRule(
            rule=f"!has(self.calibrationDataset) || !self.calibrationDataset.contains('{HUB_CALIBRATION_MARKER}')",
            message=f"{CALIBRATION_DATASET_FIELD} must not contain '{HUB_CALIBRATION_MARKER}': TensorRT-LLM "
            f"0.16's quantize.py loads any such --calib_dataset from the Hugging Face hub (config 3.0.0, "
            "column article) before it looks for a local directory; rename the directory or repo. To "
            f"calibrate on the hub's {HUB_CALIBRATION_MARKER}, leave the field unset and take the weights "
            "from hf://",
            holds=lambda e: e.calibration_dataset is None or HUB_CALIBRATION_MARKER not in e.calibration_dataset,
            field_path=".calibrationDataset",
        ),
        CelRule(
            rule=f"!has(self.calibrationDataset) || self.runtime == '{Runtime.ENGINE.value}'",
            message=f"{CALIBRATION_DATASET_FIELD} applies only to runtime: {Runtime.ENGINE.value} (the "
            f"{Runtime.LLMAPI.value} runtime serves published checkpoints and calibrates nothing); remove it "
            f"or set spec.engine.runtime: {Runtime.ENGINE.value}",
            holds=lambda e: e.calibration_dataset is None or e.runtime == Runtime.ENGINE,
            field_path=".calibrationDataset",
        ),
        CelRule(
            rule="self.maxSeqLen > self.maxInputLen",
            message="spec.engine.maxSeqLen must be greater than maxInputLen (it counts the "
            "prompt plus at least one output token)",
            holds=lambda e: e.max_seq_len > e.max_input_len,
            field_path=".maxSeqLen",
        ),
    )
