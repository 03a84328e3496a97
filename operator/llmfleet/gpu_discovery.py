"""How Kubernetes names GPUs: GPU Feature Discovery's node labels and the NVIDIA device
plugin's resource. The planner counts nodes by them, render places pods by them, and the
sandbox puts them on its fake nodes."""

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # the catalog's gfd_product of the GPU type
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
