"""Pure planner: capacity and latency model, and the search for the cheapest plan meeting the SLO.

Imports only the standard library and the catalog; no I/O, no clock. `spec_adapter` (not
re-exported here) also imports the pure API models, to translate spec -> PlanRequest and
Plan -> status.plan.
"""

from llmfleet.planner.format import format_estimate_table, format_plan_table
from llmfleet.planner.memory import (
    decode_tokens_per_sec,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_cache_bytes,
    request_latency_ms,
    tensor_parallel_problem,
    weight_bytes_per_gpu,
)
from llmfleet.planner.search import estimate, plan
from llmfleet.planner.types import (
    Estimate,
    Plan,
    PlanRequest,
    Predicted,
    RejectedOption,
    SearchSpace,
    SloTargets,
    Workload,
)

__all__ = [
    "Estimate", "Plan", "PlanRequest", "Predicted", "RejectedOption", "SearchSpace", "SloTargets", "Workload",
    "decode_tokens_per_sec", "estimate", "format_estimate_table", "format_plan_table", "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu", "kv_cache_bytes", "plan", "request_latency_ms", "tensor_parallel_problem",
    "weight_bytes_per_gpu",
]
