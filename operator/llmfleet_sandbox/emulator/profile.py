"""The emulated backend's engine profile, from what a real engine has at model load: its
config.json, the `tensorrt_llm` model's parameters and the GPU it runs on (the node's product
label). The profile itself and its derivation are the product's (llmfleet.simulation.profile),
shared with `llmfleet simulate`.
"""

from __future__ import annotations

from pathlib import Path

from llmfleet.catalog import GpuType, load_catalog
from llmfleet.planner.layout import Layout
from llmfleet.simulation.profile import EngineProfile, ProfileError, profile_for_build
from llmfleet_sandbox.emulator.engine_config import EngineConfig, read_engine_config

# Set by the sandbox's node agent on pods that request GPUs: the node's nvidia.com/gpu.product label.
GPU_PRODUCT_VARIABLE = "LLMFLEET_SANDBOX_GPU_PRODUCT"
# OpenMPI's count of the ranks on the process's own node (the sandbox's mpirun sets it too).
MPI_LOCAL_SIZE_VARIABLE = "OMPI_COMM_WORLD_LOCAL_SIZE"


def gpu_for_product(gpu_product: str | None, variable: str = GPU_PRODUCT_VARIABLE) -> GpuType:
    """The catalog GPU whose GPU Feature Discovery product label is `gpu_product`."""
    catalog = load_catalog()
    known = sorted(gpu.gfd_product for gpu in catalog.gpus.values())
    if not gpu_product:
        raise ProfileError(f"{variable} is not set: the emulated engine needs the node's nvidia.com/gpu.product "
                           f"label to know its speed; known: {known}")
    for gpu in catalog.gpus.values():
        if gpu.gfd_product == gpu_product:
            return gpu
    raise ProfileError(f"{variable}={gpu_product!r} is not a GPU product of the catalog; known: {known}")


def profile_for_engine(config: EngineConfig, gpu: GpuType, kv_cache_free_gpu_mem_fraction: float,
                       enable_prefix_reuse: bool, gpus_per_node: int | None = None) -> EngineProfile:
    """The profile of the engine whose config.json is `config` (`profile_for_build`), in its own
    layout (tp_size x pp_size of its mapping): the planner's step charges its pipeline hand-offs
    over the network between the `gpus_per_node` groups of ranks (the rank group's placement,
    `ranks_per_node`; None: whole nodes of the GPU type)."""
    catalog = load_catalog()
    quantization = config.catalog_quantization(catalog)
    kv_cache_dtype = config.catalog_kv_cache_dtype(catalog)
    return profile_for_build(config.model_arch(), gpu, quantization, kv_cache_dtype,
                             Layout(config.tp_size, config.pp_size), config.max_batch_size, config.max_num_tokens,
                             kv_cache_free_gpu_mem_fraction, enable_prefix_reuse, catalog, gpus_per_node=gpus_per_node)


def ranks_per_node(environ: dict[str, str]) -> int | None:
    """The rank group's ranks on rank 0's node, as OpenMPI tells every rank (its launcher fills each
    host's slots in order); None outside mpirun."""
    local_size = environ.get(MPI_LOCAL_SIZE_VARIABLE)
    if local_size is None:
        return None
    if not local_size.isdigit() or int(local_size) < 1:
        raise ProfileError(f"{MPI_LOCAL_SIZE_VARIABLE}={local_size!r} is not a positive rank count")
    return int(local_size)


def engine_profile(engine_dir: Path, gpu_product: str | None, kv_cache_free_gpu_mem_fraction: float,
                   enable_prefix_reuse: bool) -> EngineProfile:
    """What the emulated backend serves for the engine in `engine_dir` on a `gpu_product` node
    with these `tensorrt_llm` parameters (the same call the backend makes at model load)."""
    return profile_for_engine(read_engine_config(engine_dir), gpu_for_product(gpu_product),
                              kv_cache_free_gpu_mem_fraction, enable_prefix_reuse)
