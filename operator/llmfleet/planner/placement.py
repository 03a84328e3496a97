"""Whole replicas onto nodes. A replica's GPUs share one node (its collectives run over NVLink,
and the engine's MPI group is one pod), unless the replica is larger than a node: then its
pipeline stages fill whole nodes, one part of the replica per node (planner.layout). Pure: nodes come as (name, GPUs) pairs, the GPUs being whatever the caller counts (free or
schedulable).

Replicas of one plan are of one size, so the bin packing is exact without search: a node with
`g` GPUs holds `g // gpus_per_replica` of them whichever order the scheduler binds them in (it
binds a replica wherever one fits until no node has room, leaving each node less than a
replica), and no packing holds more.
"""

from __future__ import annotations

from collections.abc import Iterable

# Nodes named in a message before the rest are summed up: a status line must stay short on a
# cluster of hundreds of nodes.
MAX_NODES_NAMED = 8


def replicas_per_node(gpus_by_node: Iterable[tuple[str, int]], gpus_per_replica: int) -> list[tuple[str, int]]:
    """How many replicas each node holds, for the nodes that hold one, most first."""
    if gpus_per_replica < 1:
        raise ValueError(f"a replica needs at least one GPU, got {gpus_per_replica}")
    held = [(node, gpus // gpus_per_replica) for node, gpus in gpus_by_node if gpus >= gpus_per_replica]
    return sorted(held, key=lambda item: (-item[1], item[0]))


def replicas_that_fit(gpus_by_node: Iterable[tuple[str, int]], gpus_per_replica: int,
                      nodes_per_replica: int = 1) -> int:
    """Replicas the nodes hold; one spanning `nodes_per_replica` nodes takes an equal part of each."""
    if nodes_per_replica == 1:
        return sum(replicas for _, replicas in replicas_per_node(gpus_by_node, gpus_per_replica))
    part = gpus_per_replica // nodes_per_replica
    return sum(1 for _, gpus in gpus_by_node if gpus >= part) // nodes_per_replica


def replica_extent(gpus_per_replica: int, nodes_per_replica: int) -> str:
    """Where one replica's GPUs are: "on one node", or "over 2 nodes of 8" for one spanning nodes."""
    if nodes_per_replica == 1:
        return "on one node"
    return f"over {nodes_per_replica} nodes of {gpus_per_replica // nodes_per_replica}"


def group_room(gpus_by_node: Iterable[tuple[str, int]], part: int, nodes_needed: int) -> str:
    """Where the nodes stand for groups whose every pod takes `part` GPUs of its own node, e.g.
    "4 nodes with 8 free are needed and 3 have them (n1 8, n2 8, n4 8); lacking per node: n3 4, n5 8".
    The scheduler binds each pod of a group on its own, so GPUs spread over nodes are no part."""
    holding, lacking = _holding_and_lacking(gpus_by_node, part)
    text = (f"{nodes_needed} nodes with {part} free are needed and {len(holding)} have them"
            + (f" ({per_node(holding)})" if holding else ""))
    return text + (f"; lacking per node: {per_node(lacking)}" if lacking else "")


def part_room(gpus_by_node: Iterable[tuple[str, int]], part: int) -> str:
    """Which nodes hold one pod of `part` GPUs, e.g. "1 node has 8 free (n2 8); lacking per
    node: n1 8, n3 4"."""
    holding, lacking = _holding_and_lacking(gpus_by_node, part)
    text = (f"{len(holding)} node(s) have {part} free ({per_node(holding)})" if holding
            else f"no node has {part} free")
    return text + (f"; lacking per node: {per_node(lacking)}" if lacking else "")


def _holding_and_lacking(gpus_by_node: Iterable[tuple[str, int]], part: int
                         ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The nodes with `part` GPUs, with their GPUs, and the others with the GPUs they lack."""
    nodes = list(gpus_by_node)
    return ([(node, gpus) for node, gpus in nodes if gpus >= part],
            [(node, part - gpus) for node, gpus in nodes if gpus < part])


def per_node(counts_by_node: Iterable[tuple[str, int]]) -> str:
    """`n1 4, n2 4`: most first, then by name; past MAX_NODES_NAMED the rest as a count and range."""
    ordered = sorted(counts_by_node, key=lambda item: (-item[1], item[0]))
    if not ordered:
        return "no node"
    named = ", ".join(f"{node} {count}" for node, count in ordered[:MAX_NODES_NAMED])
    rest = [count for _, count in ordered[MAX_NODES_NAMED:]]
    if not rest:
        return named
    spread = f"{min(rest)}-{max(rest)}" if min(rest) != max(rest) else str(max(rest))
    return f"{named} and {len(rest)} more nodes with {spread} each"
