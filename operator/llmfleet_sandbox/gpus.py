"""GPU Feature Discovery labels for the sandbox's fake GPU nodes, from the catalog."""

from __future__ import annotations

from llmfleet.catalog import load_catalog


def gfd_labels(gpu_type: str, gpu_count: int) -> dict[str, str]:
    catalog = load_catalog()
    known = sorted(catalog.gpus)
    if gpu_type not in known:
        raise ValueError(f'unknown GPU type "{gpu_type}"; choose one of: {", ".join(known)}')
    gpu = catalog.gpu(gpu_type)
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu.gfd_product,
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.count": str(gpu_count),
    }
