"""Operator settings that shape the rendered workload, and render errors."""

from __future__ import annotations

from dataclasses import dataclass


class RenderError(ValueError):
    """The deployment cannot be rendered as asked; the message says what to change."""


@dataclass(frozen=True)
class RenderSettings:
    """How the operator renders workloads; one value per operator process.

    Real mode keeps built engines on a ReadWriteMany PersistentVolumeClaim (the build Job
    writes, serving pods on any node read). The sandbox has no volume provisioner: its node
    agent maps a hostPath into the sandbox's own state directory instead.
    """

    sandbox_mode: bool = False
    # Real mode: PVC (ReadWriteMany, created with the chart) holding <engine cache key>/ dirs.
    engine_cache_claim_name: str = "llmfleet-engine-cache"
    # Sandbox mode: hostPath root of the engine cache (inside the sandbox state directory).
    engine_cache_host_path: str = "/var/lib/llmfleet/engine-cache"
    image_pull_secrets: tuple[str, ...] = ()
    # Where the engine image keeps TensorRT-LLM's quantize.py (to verify per image release).
    quantize_script_path: str = "/app/tensorrt_llm/examples/quantization/quantize.py"
    # Sandbox mode: how long the emulated trtllm-build takes.
    emulated_build_seconds: int = 5
    # Finished and failed build Jobs stay for the reconciler to read: no TTL; a small retry.
    engine_build_backoff_limit: int = 1
    termination_grace_period_seconds: int = 120
