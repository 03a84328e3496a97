"""An LLMDeployment and its plan as the fleet the simulator runs (pure): each replica's engine as
the operator would build and serve it, the replicas the operator would start with, and the
query window its metrics would use at a scrape interval."""

from __future__ import annotations

from llmfleet.api import LLMDeploymentSpec
from llmfleet.autoscale import target_ttft_p99_ms
from llmfleet.catalog import Catalog
from llmfleet.metrics.cadence import choose_cadence, rate_window
from llmfleet.planner.capacity import replica_capacity
from llmfleet.metrics.prometheus import QUEUE_METRICS
from llmfleet.planner.spec_adapter import model_arch_from_spec, plan_request_from_spec, serving_release
from llmfleet.planner.types import Plan
from llmfleet.render.identity import prefix_reuse_enabled
from llmfleet.render.layout import REQUEST_GAUGE, REQUEST_TYPE_LABEL
from llmfleet.render.model_repo import KV_CACHE_FREE_GPU_MEM_FRACTION
from llmfleet.simulation.fleet import Engine, Fleet
from llmfleet.simulation.profile import profile_for_build


def engine_for(spec: LLMDeploymentSpec, plan: Plan, catalog: Catalog) -> Engine:
    """The engine one replica of a feasible plan serves with: the spec's build limits, the
    plan's GPU, TP and formats, the rendered KV-cache share (as the sandbox's emulator derives
    it at model load)."""
    model = model_arch_from_spec(spec.model, context_window_tokens=spec.engine.max_seq_len, catalog=catalog)
    profile = profile_for_build(model, catalog.gpus[plan.gpu_type], plan.quantization, plan.kv_cache_dtype,
                                plan.layout, spec.engine.max_batch_size, spec.engine.max_num_tokens,
                                KV_CACHE_FREE_GPU_MEM_FRACTION, prefix_reuse_enabled(spec), catalog)
    return Engine(profile, spec.engine.max_input_len, spec.engine.max_seq_len)


def fleet_for(spec: LLMDeploymentSpec, plan: Plan, catalog: Catalog) -> Fleet:
    """The fleet as the operator runs it: the plan's replicas, or with autoscaling the plan's
    replicas within minReplicas..maxReplicas (the first pass's count) and the policy after, told
    the capacity of a replica as the operator computes it before any speed is learned (the
    simulated engine runs at the model's own speed)."""
    autoscaling = spec.autoscaling if spec.autoscaling.enabled else None
    replicas, capacity = plan.replicas, None
    if autoscaling is not None:
        replicas = min(max(replicas, autoscaling.min_replicas), autoscaling.max_replicas)
        capacity = replica_capacity(plan_request_from_spec(spec, catalog=catalog), plan,
                                    lambda floor_ms: target_ttft_p99_ms(autoscaling, spec.slo.ttft_p99_ms, floor_ms),
                                    spec.engine.max_input_len, catalog)
    return Fleet(engine_for(spec, plan, catalog), replicas, spec.slo.ttft_p99_ms, autoscaling, capacity)


def exported_queue_series(spec: LLMDeploymentSpec) -> dict[str, bool]:
    """FleetSettings' `queue_observable` and `waiting_observable` for the spec's serving release,
    as its record says and the sandbox's emulator exports them."""
    metrics = serving_release(spec).metrics
    request_types = (metrics[REQUEST_GAUGE].labels.get(REQUEST_TYPE_LABEL) or ()) if REQUEST_GAUGE in metrics else ()
    return {"queue_observable": all(name in metrics for name in QUEUE_METRICS),
            "waiting_observable": "waiting" in request_types}


def query_window_seconds(scrape_interval_seconds: float) -> int:
    """The autoscaler's p99 and rate window at a configured scrape interval."""
    return rate_window(choose_cadence(scrape_interval_seconds, None)).seconds
