"""How one replica spreads a model over its GPUs: tensor (TP), pipeline (PP) and expert (EP)
parallelism, and attention data parallelism (ADP), with TensorRT-LLM's mapping semantics.

- A replica is `pipeline_parallel_size` stages of `tensor_parallel_size` GPUs each; a stage holds
  a contiguous run of layers.
- Within a stage, attention is split by heads over the TP ranks, or (ADP) every rank holds the
  whole attention and serves its own share of the sequences.
- Routed experts are split over the TP ranks as EP x expert-TP = TP: EP ranks hold whole experts,
  expert-TP splits each expert's FFN. EP = 1 is the plain TP split of every expert.
- A stage's TP group stays within one node (its collectives need NVLink); stages are placed node
  after node, so a replica larger than a node spans nodes at stage boundaries only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    attention_data_parallel: bool = False

    def __post_init__(self) -> None:
        tp, pp, ep = self.tensor_parallel_size, self.pipeline_parallel_size, self.expert_parallel_size
        if min(tp, pp, ep) < 1:
            raise ValueError(f"parallel sizes must be at least 1, got TP{tp} PP{pp} EP{ep}")
        if tp % ep:
            raise ValueError(f"EP{ep} must divide TP{tp} (EP x expert TP = TP)")

    @classmethod
    def of(cls, parallel: "Layout | int") -> "Layout":
        """A layout, or a TP size alone (every other dimension 1)."""
        return parallel if isinstance(parallel, Layout) else cls(parallel)

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def attention_tensor_parallel_size(self) -> int:
        """Ranks one layer's attention heads are split over: 1 under ADP (each rank whole)."""
        return 1 if self.attention_data_parallel else self.tensor_parallel_size

    @property
    def sequence_shards(self) -> int:
        """Ranks that hold different sequences' KV: TP under ADP, else 1 (TP ranks share every sequence)."""
        return self.tensor_parallel_size if self.attention_data_parallel else 1

    @property
    def expert_tensor_parallel_size(self) -> int:
        return self.tensor_parallel_size // self.expert_parallel_size

    @property
    def is_tensor_parallel_only(self) -> bool:
        return self.pipeline_parallel_size == 1 and self.expert_parallel_size == 1 and not self.attention_data_parallel

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes one replica spans, a stage's TP group on one node."""
        stages_per_node = max(1, gpus_per_node // self.tensor_parallel_size)
        return math.ceil(self.pipeline_parallel_size / stages_per_node)

    def cross_node_handoffs(self, gpus_per_node: int) -> int:
        """Stage boundaries that cross nodes: one between each pair of consecutive nodes."""
        return self.nodes(gpus_per_node) - 1

    @property
    def label(self) -> str:
        """`TP8`, `TP8 PP2`, `TP8 EP8 ADP`: the dimensions that are not 1."""
        parts = [f"TP{self.tensor_parallel_size}"]
        if self.pipeline_parallel_size > 1:
            parts.append(f"PP{self.pipeline_parallel_size}")
        if self.expert_parallel_size > 1:
            parts.append(f"EP{self.expert_parallel_size}")
        if self.attention_data_parallel:
            parts.append("ADP")
        return " ".join(parts)


def stage_layer_ranges(num_layers: int, pipeline_parallel_size: int) -> list[range]:
    """Contiguous layer ranges per stage, as even as possible, the first stages taking one more
    where the layers do not divide (an assumption: upstream's split was not read)."""
    base, extra = divmod(num_layers, pipeline_parallel_size)
    ranges, start = [], 0
    for stage in range(pipeline_parallel_size):
        size = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges
