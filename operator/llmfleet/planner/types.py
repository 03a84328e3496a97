"""Input and result types of the planner (frozen dataclasses, JSON via ``to_json_dict``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfleet.catalog import ModelArch
from llmfleet.catalog.release_record import ReleaseSupport


@dataclass(frozen=True)
class Workload:
    input_tokens_mean: float
    input_tokens_p99: float
    output_tokens_mean: float
    output_tokens_p99: float
    peak_requests_per_sec: float
    prefix_sharing_fraction: float = 0.0

    def __post_init__(self) -> None:
        if min(self.input_tokens_mean, self.output_tokens_mean, self.peak_requests_per_sec) <= 0:
            raise ValueError("token lengths and peak_requests_per_sec must be positive")
        if self.input_tokens_p99 < self.input_tokens_mean or self.output_tokens_p99 < self.output_tokens_mean:
            raise ValueError("p99 token lengths must be at least the means")
        if not 0.0 <= self.prefix_sharing_fraction < 1.0:
            raise ValueError("prefix_sharing_fraction must be in [0, 1)")


@dataclass(frozen=True)
class SloTargets:
    ttft_p99_ms: float
    tpot_p99_ms: float
    max_quality_loss_percent: float | None = None

    def __post_init__(self) -> None:
        if self.ttft_p99_ms <= 0 or self.tpot_p99_ms <= 0:
            raise ValueError("SLO targets must be positive")


@dataclass(frozen=True)
class GpuCapacity:
    """One GPU type in the cluster: GPUs on schedulable nodes, and of those the ones no other
    workload holds (the deployment's own pods' GPUs count as free: a new plan replaces them)."""

    gpu_type: str
    allocatable: int
    free: int

    def __post_init__(self) -> None:
        if not 0 <= self.free <= self.allocatable:
            raise ValueError(f"{self.gpu_type}: free GPUs ({self.free}) must be within 0..allocatable "
                             f"({self.allocatable})")


@dataclass(frozen=True)
class ClusterGpus:
    """The GPU types a cluster offers (GPU Feature Discovery's product label, mapped to the
    catalog's names) and how many of each; a type it lacks has none."""

    capacities: tuple[GpuCapacity, ...] = ()

    def of(self, gpu_type: str) -> GpuCapacity:
        return next((c for c in self.capacities if c.gpu_type == gpu_type), GpuCapacity(gpu_type, 0, 0))

    def describe(self) -> str:
        offered = [f"{c.gpu_type} x{c.allocatable} ({c.free} free)" for c in self.capacities if c.allocatable]
        return "the cluster has " + (", ".join(offered) if offered else "no schedulable GPU node")


@dataclass(frozen=True)
class CapacityShortfall:
    """The plan that meets the SLO needs more GPUs of its type than are free now."""

    slo_plan: str  # e.g. "4 x H100-SXM-80GB TP2 FP8 KV FP8"
    gpu_type: str
    gpus_needed: int
    gpus_free: int
    gpus_in_cluster: int

    @property
    def message(self) -> str:
        return (f"meeting the SLO needs {self.slo_plan} ({self.gpus_needed} GPUs) but {self.gpus_free} of the "
                f"cluster's {self.gpus_in_cluster} {self.gpu_type} are free: {self.gpus_needed - self.gpus_free} "
                f"more {self.gpu_type} needed")


@dataclass(frozen=True)
class SpeedFactor:
    """How much faster (above 1) or slower than the calibrated model one GPU type and weight
    format of the planned model ran in live traffic, and from how many requests that was learned
    (`planner.live`)."""

    gpu_type: str
    quantization: str
    factor: float
    requests: int

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"speed factor must be positive, got {self.factor}")


@dataclass(frozen=True)
class SearchSpace:
    gpu_types: tuple[str, ...]
    tensor_parallel_sizes: tuple[int, ...] = (1, 2, 4, 8)
    quantizations: tuple[str, ...] = ("BF16", "FP8")
    kv_cache_dtypes: tuple[str, ...] = ("BF16", "FP8")
    gpu_budget: int | None = None
    pinned_gpu_type: str | None = None
    pinned_tensor_parallel_size: int | None = None
    pinned_quantization: str | None = None
    pinned_kv_cache_dtype: str | None = None
    pinned_replicas: int | None = None
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    kv_cache_free_gpu_mem_fraction: float = 0.9
    # The serving release's limits (GPU types, formats, KV pairings), with its name for
    # reasons; None: any combination the GPU supports.
    release: str | None = None
    release_support: ReleaseSupport | None = None
    # The cluster's GPUs; None: not known (planning offline), any GPU type may be chosen.
    cluster_gpus: ClusterGpus | None = None
    # Learned from live metrics; a configuration without one is taken as the model says.
    speed_factors: tuple[SpeedFactor, ...] = ()
    # Plan as if every engine ran this share slower than learned (or modelled): the hysteresis
    # of a re-plan to fewer GPUs.
    speed_margin: float = 0.0

    def speed_factor(self, gpu_type: str, quantization: str) -> SpeedFactor | None:
        """The factor learned for this GPU type and format; else, conservatively, the best known
        one of the same GPU type in another format (a model error seen in one format is likely in
        the others, and an unobserved format must not look better for being unobserved)."""
        same_gpu = [s for s in self.speed_factors if s.gpu_type == gpu_type]
        exact = next((s for s in same_gpu if s.quantization == quantization), None)
        return exact or max(same_gpu, key=lambda s: s.requests, default=None)


@dataclass(frozen=True)
class PlanRequest:
    model: ModelArch
    workload: Workload
    slo: SloTargets
    space: SearchSpace


@dataclass(frozen=True)
class Predicted:
    ttft_p99_ms: float
    tpot_p99_ms: float
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    max_concurrent_requests: int
    max_throughput_tokens_per_sec: float

    def to_json_dict(self) -> dict:
        return {
            "ttftP99Ms": round(self.ttft_p99_ms, 1),
            "tpotP99Ms": round(self.tpot_p99_ms, 2),
            "kvBytesPerToken": self.kv_bytes_per_token,
            "kvCapacityTokens": self.kv_capacity_tokens,
            "maxConcurrentRequests": self.max_concurrent_requests,
            "maxThroughputTokensPerSec": round(self.max_throughput_tokens_per_sec, 1),
        }


@dataclass(frozen=True)
class RejectedOption:
    option: str
    reason: str

    def to_json_dict(self) -> dict:
        return {"option": self.option, "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """A chosen (or, when infeasible, the closest) configuration with its predictions.

    Predictions are per replica (one TP group); the fleet total is ``replicas`` times that.
    """

    feasible: bool
    gpu_type: str | None
    tensor_parallel_size: int | None
    quantization: str | None
    kv_cache_dtype: str | None
    replicas: int
    predicted: Predicted | None
    rationale: tuple[str, ...]
    rejected: tuple[RejectedOption, ...] = field(default_factory=tuple)
    pipeline_parallel_size: int = 1
    # Set when the plan that meets the SLO does not fit the free GPUs: this plan is then the
    # best that fits now (or the SLO plan itself, waiting for GPUs, when nothing fits).
    shortfall: CapacityShortfall | None = None

    @property
    def gpus_total(self) -> int:
        if self.tensor_parallel_size is None:
            return 0
        return self.replicas * self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def summary(self) -> str:
        """Short form for printer columns, e.g. ``H100x2 FP8``."""
        if self.gpu_type is None:
            return "none"
        gpus_per_replica = (self.tensor_parallel_size or 0) * self.pipeline_parallel_size
        return f"{self.gpu_type.split('-')[0]}x{gpus_per_replica} {self.quantization}"

    def to_json_dict(self) -> dict:
        return {
            "feasible": self.feasible,
            "gpuType": self.gpu_type,
            "tensorParallelSize": self.tensor_parallel_size,
            "pipelineParallelSize": self.pipeline_parallel_size,
            "quantization": self.quantization,
            "kvCacheDtype": self.kv_cache_dtype,
            "replicas": self.replicas,
            "gpusTotal": self.gpus_total,
            "predicted": self.predicted.to_json_dict() if self.predicted else None,
            "rationale": list(self.rationale),
            "rejected": [r.to_json_dict() for r in self.rejected],
            **({"capacityShortfall": self.shortfall.message} if self.shortfall else {}),
        }


@dataclass(frozen=True)
class Estimate:
    """What-if numbers for one replica of one fixed configuration."""

    kv_bytes_per_token: int
    kv_capacity_tokens: int
    max_concurrent_requests: int
    max_throughput_tokens_per_sec: float
    ttft_ms: float
    tpot_ms: float

    def to_json_dict(self) -> dict:
        return {
            "kvBytesPerToken": self.kv_bytes_per_token,
            "kvCapacityTokens": self.kv_capacity_tokens,
            "maxConcurrentRequests": self.max_concurrent_requests,
            "maxThroughputTokensPerSec": round(self.max_throughput_tokens_per_sec, 1),
            "ttftMs": round(self.ttft_ms, 2),
            "tpotMs": round(self.tpot_ms, 3),
        }
