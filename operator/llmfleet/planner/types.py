"""Input and result types of the planner (frozen dataclasses, JSON via ``to_json_dict``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfleet.catalog import ModelArch
from llmfleet.catalog.release_record import ReleaseRequirement, ReleaseSupport
from llmfleet.planner.layout import Layout
from llmfleet.planner.placement import group_room, per_node, replica_extent


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
class NodeGpus:
    """One Ready, schedulable GPU node: its GPUs, and of those the ones no other workload holds
    (the deployment's own pods' GPUs count as free: a new plan replaces them)."""

    node: str
    gpu_type: str  # the catalog's name of its GPU Feature Discovery product
    # `label=value` of the first node-pool label it carries (gpu_discovery.NODE_POOL_LABELS), else
    # of its GPU product label: the name says where it comes from.
    pool: str
    allocatable: int
    free: int
    # Of the free GPUs, those the deployment's own pods hold: free for its next plan, not for a
    # pod it adds now.
    own: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.free <= self.allocatable:
            raise ValueError(f"{self.node}: free GPUs ({self.free}) must be within 0..allocatable "
                             f"({self.allocatable})")
        if not 0 <= self.own <= self.free:
            raise ValueError(f"{self.node}: the deployment's own GPUs ({self.own}) must be within 0..free "
                             f"({self.free})")


@dataclass(frozen=True)
class GpuCapacity:
    """The GPUs of one type, or of one node pool of it, summed over its nodes."""

    gpu_type: str
    nodes: int
    allocatable: int
    free: int
    most_free_on_one_node: int  # the largest replica that fits now
    # Nodes with every GPU free: a replica spanning nodes takes a whole node for each part.
    nodes_all_free: int = 0

    @classmethod
    def of_nodes(cls, gpu_type: str, nodes: tuple[NodeGpus, ...]) -> "GpuCapacity":
        return cls(gpu_type, len(nodes), sum(n.allocatable for n in nodes), sum(n.free for n in nodes),
                   max((n.free for n in nodes), default=0),
                   sum(1 for n in nodes if n.allocatable and n.free == n.allocatable))


@dataclass(frozen=True)
class ClusterGpus:
    """The cluster's GPU nodes (GPU Feature Discovery's product label, mapped to the catalog's
    names) with their GPUs; a type without nodes has none."""

    nodes: tuple[NodeGpus, ...] = ()

    def nodes_of(self, gpu_type: str) -> tuple[NodeGpus, ...]:
        return tuple(n for n in self.nodes if n.gpu_type == gpu_type)

    def free_now(self, gpu_type: str) -> tuple[tuple[str, int], ...]:
        """(node, GPUs) of the type that no pod holds now, the deployment's own included: room
        for a pod it adds without re-planning."""
        return tuple((n.node, n.free - n.own) for n in self.nodes_of(gpu_type))

    def of(self, gpu_type: str) -> GpuCapacity:
        return GpuCapacity.of_nodes(gpu_type, self.nodes_of(gpu_type))

    @property
    def capacities(self) -> tuple[GpuCapacity, ...]:
        """Per GPU type, by name."""
        return tuple(self.of(gpu_type) for gpu_type in sorted({n.gpu_type for n in self.nodes}))

    def pools(self) -> dict[tuple[str, str], GpuCapacity]:
        """Per (GPU type, node pool), by type then pool: a pool's nodes of another type are
        another group, as a replica never mixes GPU types."""
        keys = sorted({(n.gpu_type, n.pool) for n in self.nodes})
        return {(gpu_type, pool): GpuCapacity.of_nodes(gpu_type, tuple(
                    n for n in self.nodes if (n.gpu_type, n.pool) == (gpu_type, pool)))
                for gpu_type, pool in keys}

    def describe(self) -> str:
        offered = [f"{c.gpu_type} x{c.allocatable} ({c.free} free, at most {c.most_free_on_one_node} on one node)"
                   for c in self.capacities if c.allocatable]
        return "the cluster has " + (", ".join(offered) if offered else "no schedulable GPU node")


@dataclass(frozen=True)
class CapacityShortfall:
    """The plan that meets the SLO needs more replicas than the free GPUs of its type hold, each
    replica's GPUs on one node, or, for a replica spanning nodes, an equal part on each of
    `nodes_per_replica` nodes."""

    slo_plan: str  # e.g. "4 x H100-SXM-80GB TP2 FP8 KV FP8"
    gpu_type: str
    replicas_needed: int
    gpus_per_replica: int
    replicas_fitting: int  # the replicas the free GPUs hold, whole on one node each
    gpus_free: int
    gpus_in_cluster: int
    free_gpus_by_node: tuple[tuple[str, int], ...]
    nodes_per_replica: int = 1

    @property
    def gpus_needed(self) -> int:
        return self.replicas_needed * self.gpus_per_replica

    @property
    def message(self) -> str:
        more = self.replicas_needed - self.replicas_fitting
        said = (f"meeting the SLO needs {self.slo_plan} ({self.gpus_needed} GPUs, {self.gpus_per_replica} per "
                f"replica {replica_extent(self.gpus_per_replica, self.nodes_per_replica)}) but {self.gpus_free} of the cluster's {self.gpus_in_cluster} "
                f"{self.gpu_type} are free and hold {self.replicas_fitting} replica(s): ")
        if self.nodes_per_replica == 1:
            return said + (f"{more} more replica(s) need {self.gpus_per_replica} free {self.gpu_type} on one node "
                           f"each; free per node: {per_node(self.free_gpus_by_node)}")
        # A group is placed whole or not at all: say which nodes lack how many GPUs of a part.
        part = self.gpus_per_replica // self.nodes_per_replica
        return said + (f"{more} more replica(s) need {self.nodes_per_replica} nodes with {part} free "
                       f"{self.gpu_type} each; "
                       f"{group_room(self.free_gpus_by_node, part, self.replicas_needed * self.nodes_per_replica)}")


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
    # Stages searched where TP alone cannot hold the weights on one node.
    pipeline_parallel_sizes: tuple[int, ...] = (1, 2, 4)
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
    # The longest request (prompt plus output) the deployment admits (spec.engine.maxSeqLen);
    # None: the workload's p99 context. What a release's local-attention limits are judged at.
    max_seq_len: int | None = None
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
    expert_parallel_size: int = 1
    attention_data_parallel: bool = False
    # Nodes one replica spans (its stages placed node after node); rendering more than one is
    # refused until multi-node serving exists.
    nodes_per_replica: int = 1
    # Set when the plan that meets the SLO does not fit the free GPUs: this plan is then the
    # best that fits now (or the SLO plan itself, waiting for GPUs, when nothing fits).
    shortfall: CapacityShortfall | None = None
    # Set when the serving release cannot run the model's architecture: the plan is made and
    # explained all the same, and render refuses it, naming the release it needs.
    release_requirement: ReleaseRequirement | None = None

    @property
    def layout(self) -> Layout:
        return Layout(self.tensor_parallel_size or 1, self.pipeline_parallel_size, self.expert_parallel_size,
                      self.attention_data_parallel)

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
            # Beyond TP and PP only where the layout has them, so TP-only plans read as before.
            **({"expertParallelSize": self.expert_parallel_size} if self.expert_parallel_size > 1 else {}),
            **({"attentionDataParallel": True} if self.attention_data_parallel else {}),
            **({"nodesPerReplica": self.nodes_per_replica} if self.nodes_per_replica > 1 else {}),
            "predicted": self.predicted.to_json_dict() if self.predicted else None,
            "rationale": list(self.rationale),
            "rejected": [r.to_json_dict() for r in self.rejected],
            **({"capacityShortfall": self.shortfall.message} if self.shortfall else {}),
            **({"releaseRequired": release_required_json(self.release_requirement)}
               if self.release_requirement else {}),
        }


def release_required_json(requirement: ReleaseRequirement) -> dict:
    """A plan's release requirement as `status.plan.releaseRequired` spells it."""
    return {
        "tensorrtLlmVersion": requirement.first_served_by,
        "runtime": requirement.first_served_runtime or requirement.runtime,
        "architecture": requirement.architecture,
        "message": requirement.message,
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
