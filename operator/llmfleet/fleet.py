"""`llmfleet fleet status`: the cluster's GPUs by type and node pool, and every LLMDeployment's plan,
replicas, p99 TTFT and SLO attainment, as text. Pure: the CLI passes the objects it listed and
the attainment it read from Prometheus."""

from __future__ import annotations

from collections.abc import Mapping

from llmfleet.gpu_discovery import GPU_PRODUCT_LABEL
from llmfleet.planner.cluster import gpu_node, gpu_pod, node_gpus
from llmfleet.planner.types import ClusterGpus
from llmfleet.render.identity import DEPLOYMENT_LABEL

NONE = "-"


def gpu_inventory(nodes: list[dict], pods: list[dict]) -> ClusterGpus:
    """The GPU nodes, each with the GPUs no bound, unfinished pod holds."""
    gpu_nodes = [node for node in map(gpu_node, nodes) if node is not None]
    gpu_pods = [pod for pod in (gpu_pod(p, DEPLOYMENT_LABEL) for p in pods) if pod is not None]
    return node_gpus(gpu_nodes, gpu_pods)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in (header, *rows)]


def _condition(deployment: dict, kind: str) -> dict:
    return next((c for c in (deployment.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def _deployment_row(deployment: dict, attainment: float | None) -> tuple[str, ...]:
    metadata, spec, status = deployment["metadata"], deployment.get("spec") or {}, deployment.get("status") or {}
    plan = status.get("plan") or {}
    planned = _condition(deployment, "Planned")
    ttft_p99 = status.get("ttftP99") or (f"{status['ttftP99Ms']:.0f} ms" if status.get("ttftP99Ms") is not None
                                        else NONE)
    target = (spec.get("slo") or {}).get("ttftP99Ms")
    return (f"{metadata['namespace']}/{metadata['name']}",
            (spec.get("resources") or {}).get("priorityClassName") or NONE,
            plan.get("summary") or NONE,
            _gpus(plan),
            f"{status.get('readyReplicas', 0)}/{status.get('replicas', 0)}",
            ttft_p99,
            f"{target} ms" if target is not None else NONE,
            f"{attainment:.1%}" if attainment is not None else NONE,
            f"{planned.get('status', NONE)} {planned.get('reason', '')}".strip(),
            _advice(status.get("recommendation")))


def _gpus(plan: dict) -> str:
    """The plan's GPUs; for replicas spanning nodes also how they sit, e.g. '32 (2 x 2 nodes of 8)'."""
    if not plan.get("summary"):
        return NONE
    total, nodes = plan.get("gpusTotal", NONE), plan.get("nodesPerReplica") or 1
    replicas = plan.get("replicas") or 0
    if nodes == 1 or not replicas or not isinstance(total, int):
        return str(total)
    return f"{total} ({replicas} x {nodes} nodes of {total // (replicas * nodes)})"


def _advice(recommendation: dict | None) -> str:
    """The recommended plan and why, e.g. 'SloAtRisk: H100x2 FP8 x3'."""
    if not recommendation:
        return NONE
    plan = recommendation.get("plan") or {}
    return f"{recommendation['reason']}: {plan.get('summary', NONE)} x{plan.get('replicas', NONE)}"


def fleet_status(gpus: ClusterGpus, deployments: list[dict],
                 attainment: Mapping[tuple[str, str], float | None], window_seconds: int | None) -> str:
    """The report; `attainment` by (namespace, name), over `window_seconds` (None: no
    Prometheus was asked)."""
    lines = ["GPUs (Ready, schedulable nodes; used: held by pods bound to them)"]
    lines += ["  " + line for line in _table(
        ("TYPE", "NODES", "GPUS", "USED", "FREE"),
        [(g.gpu_type, str(g.nodes), str(g.allocatable), str(g.allocatable - g.free), str(g.free))
         for g in gpus.capacities])]
    if not gpus.nodes:
        lines.append(f"  no GPU node (none with the {GPU_PRODUCT_LABEL} label is Ready and schedulable)")
    else:
        # A replica's GPUs share one node: the most free on one node is the largest replica that
        # fits now, whatever the pool's total. A replica spanning nodes takes whole nodes.
        lines += ["", "GPU node pools (POOL: the node-pool label and its value; MAX FREE/NODE: the largest "
                      "replica on one node that fits now; FREE NODES: nodes with every GPU free, one per part "
                      "of a replica spanning nodes)"]
        lines += ["  " + line for line in _table(
            ("TYPE", "POOL", "NODES", "GPUS", "USED", "FREE", "MAX FREE/NODE", "FREE NODES"),
            [(gpu_type, pool, str(g.nodes), str(g.allocatable), str(g.allocatable - g.free), str(g.free),
              str(g.most_free_on_one_node), str(g.nodes_all_free)) for (gpu_type, pool), g in gpus.pools().items()])]
    where = (f"share of first tokens within the SLO's p99 TTFT over the last {window_seconds} s"
             if window_seconds is not None else "no Prometheus URL given")
    lines += ["", f"LLMDeployments (attainment: {where})"]
    ordered = sorted(deployments, key=lambda d: (d["metadata"]["namespace"], d["metadata"]["name"]))
    lines += ["  " + line for line in _table(
        ("NAME", "PRIORITY", "PLAN", "GPUS", "READY", "P99 TTFT", "TARGET", "ATTAINMENT", "PLANNED", "ADVICE"),
        [_deployment_row(d, attainment.get((d["metadata"]["namespace"], d["metadata"]["name"]))) for d in ordered])]
    if not deployments:
        lines.append("  none")
    return "\n".join(lines)
