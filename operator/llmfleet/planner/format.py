"""Plain-text tables of plans and estimates for the CLI."""

from __future__ import annotations

from llmfleet.planner.types import Estimate, Plan


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)


def format_plan_table(plan: Plan) -> str:
    rows = [
        ("feasible", "yes" if plan.feasible else "NO"),
        ("plan", f"{plan.summary} x{plan.replicas} replicas ({plan.gpus_total} GPUs)"),
        ("gpuType", str(plan.gpu_type)),
        ("tensorParallelSize", str(plan.tensor_parallel_size)),
        ("pipelineParallelSize", str(plan.pipeline_parallel_size)),
        ("quantization", str(plan.quantization)),
        ("kvCacheDtype", str(plan.kv_cache_dtype)),
    ]
    if plan.shortfall:
        rows.append(("capacity", plan.shortfall.message))
    if plan.predicted:
        p = plan.predicted
        rows += [
            ("p99 TTFT", f"{p.ttft_p99_ms:.0f} ms"),
            ("p99 TPOT", f"{p.tpot_p99_ms:.1f} ms"),
            ("KV bytes/token", f"{p.kv_bytes_per_token}"),
            ("KV capacity", f"{p.kv_capacity_tokens} tokens per replica"),
            ("max concurrent", f"{p.max_concurrent_requests} requests per replica at p99 context"),
            ("max throughput", f"{p.max_throughput_tokens_per_sec:.0f} output tokens/s per replica"),
        ]
    lines = [_table(rows), "", "rationale:"]
    lines += [f"  - {line}" for line in plan.rationale]
    if plan.rejected:
        lines += ["", "rejected:"]
        width = max(len(r.option) for r in plan.rejected)
        lines += [f"  {r.option.ljust(width)}  {r.reason}" for r in plan.rejected]
    return "\n".join(lines)


def format_estimate_table(estimate: Estimate) -> str:
    return _table([
        ("KV bytes/token", f"{estimate.kv_bytes_per_token}"),
        ("KV capacity", f"{estimate.kv_capacity_tokens} tokens"),
        ("max concurrent", f"{estimate.max_concurrent_requests} requests"),
        ("max throughput", f"{estimate.max_throughput_tokens_per_sec:.0f} output tokens/s (one replica)"),
        ("TTFT", f"{estimate.ttft_ms:.1f} ms"),
        ("TPOT", f"{estimate.tpot_ms:.2f} ms"),
    ])
