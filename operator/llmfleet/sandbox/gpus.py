"""GPU Feature Discovery labels for the sandbox's fake GPU nodes."""

from __future__ import annotations

# GFD's `nvidia.com/gpu.product` is the device name with spaces replaced by
# dashes, and `nvidia.com/gpu.memory` is the per-GPU memory in MiB as NVML
# reports it. Values as GFD publishes them on real nodes of each type.
GFD_PRODUCT_AND_MEMORY_MIB = {
    "H100-SXM-80GB": ("NVIDIA-H100-80GB-HBM3", 81559),
    "H200-SXM-141GB": ("NVIDIA-H200", 143771),
    "B200-180GB": ("NVIDIA-B200", 183359),
    "A100-SXM-80GB": ("NVIDIA-A100-SXM4-80GB", 81920),
    "L40S-48GB": ("NVIDIA-L40S", 46068),
}


def gfd_labels(gpu_type: str, gpu_count: int) -> dict[str, str]:
    if gpu_type not in GFD_PRODUCT_AND_MEMORY_MIB:
        known = ", ".join(sorted(GFD_PRODUCT_AND_MEMORY_MIB))
        raise ValueError(f'unknown GPU type "{gpu_type}"; choose one of: {known}')
    product, memory_mib = GFD_PRODUCT_AND_MEMORY_MIB[gpu_type]
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(gpu_count),
    }
