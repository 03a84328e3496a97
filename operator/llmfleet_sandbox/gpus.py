"""GPU Feature Discovery labels for the sandbox's fake GPU nodes, from the catalog."""

from __future__ import annotations

from llmfleet.catalog import load_catalog
from llmfleet.gpu_discovery import GPU_COUNT_LABEL, GPU_MEMORY_LABEL, GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL


def gfd_labels(gpu_type: str, gpu_count: int) -> dict[str, str]:
    catalog = load_catalog()
    known = sorted(catalog.gpus)
    if gpu_type not in known:
        raise ValueError(f'unknown GPU type "{gpu_type}"; choose one of: {", ".join(known)}')
    gpu = catalog.gpu(gpu_type)
    return {
        GPU_PRESENT_LABEL: "true",
        GPU_PRODUCT_LABEL: gpu.gfd_product,
        GPU_MEMORY_LABEL: str(gpu.memory_mib),
        GPU_COUNT_LABEL: str(gpu_count),
    }
