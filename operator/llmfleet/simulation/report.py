"""What a simulated run comes to (pure): SLO attainment, latency, replica-seconds, GPU-hours,
cost, and every scaling decision with its reason."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfleet.loadgen.stats import distribution
from llmfleet.simulation.fleet import FleetRun, RequestResult

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1_000_000


@dataclass(frozen=True)
class Costs:
    gpus_per_replica: int
    relative_cost_per_gpu_hour: float  # the catalog's, for the plan's GPU type


def _percent(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 3) if whole else None


def _met(value: float | None, objective_ms: float) -> bool:
    return value is None or value <= objective_ms  # a one-token answer has no TPOT to miss


def summarize(run: FleetRun, slo_ttft_ms: float, slo_tpot_ms: float, costs: Costs) -> dict:
    requests = run.requests
    completed = [request for request in requests if request.failure is None]
    ttft_met = [request for request in completed if request.ttft_ms <= slo_ttft_ms]
    tpot_met = [request for request in completed if _met(request.tpot_ms, slo_tpot_ms)]
    both: list[RequestResult] = [request for request in ttft_met if _met(request.tpot_ms, slo_tpot_ms)]
    replica_seconds = run.replica_seconds()
    gpu_hours = replica_seconds * costs.gpus_per_replica / SECONDS_PER_HOUR
    relative_cost = gpu_hours * costs.relative_cost_per_gpu_hour
    tokens_within_slo = sum(request.arrival.output_tokens for request in both)
    peak_replicas = run.peak_replicas()
    failures: dict[str, int] = {}
    for request in requests:
        if request.failure is not None:
            failures[request.failure] = failures.get(request.failure, 0) + 1
    return {
        "requests": len(requests),
        "completed": len(completed),
        "failed": len(requests) - len(completed),
        **({"failures": failures} if failures else {}),
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms},
        "slo_attainment_percent": {"ttft": _percent(len(ttft_met), len(requests)),
                                   "tpot": _percent(len(tpot_met), len(requests)),
                                   "both": _percent(len(both), len(requests))},
        "ttft_ms": distribution([request.ttft_ms for request in completed]),
        "tpot_ms": distribution([request.tpot_ms for request in completed if request.tpot_ms is not None]),
        "duration_s": round(run.end_s, 3),
        "replica_seconds": round(replica_seconds, 1),
        "peak_replicas": peak_replicas,
        # Against a fleet of the peak replica count for the whole run.
        "replica_seconds_share_of_static_peak": (round(replica_seconds / (peak_replicas * run.end_s), 4)
                                                 if peak_replicas and run.end_s > 0 else None),
        "gpu_hours": round(gpu_hours, 4),
        "relative_cost": round(relative_cost, 4),
        "relative_cost_per_million_output_tokens_within_slo": (
            round(relative_cost / tokens_within_slo * TOKENS_PER_MILLION, 4) if tokens_within_slo else None),
        # Scalings against the previous one within the stabilisation window (flapping).
        "reversals": run.reversals(),
        "scaling": [{"time_s": round(event.time_s, 3), "from_replicas": event.from_replicas,
                     "to_replicas": event.to_replicas, "decision": event.decision.value,
                     "signal": event.signal.value, "reversal": event.reversal, "reason": event.reason}
                    for event in run.scaling],
    }


def format_summary(summary: dict) -> str:
    """The summary as a few lines of text, then the scaling decisions."""
    attainment = summary["slo_attainment_percent"]
    slo = summary["slo"]

    def number(value, unit: str = "") -> str:
        return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:g}{unit}"
    lines = [
        f"requests            {summary['requests']} ({summary['failed']} failed)",
        f"within the SLO      TTFT <= {slo['ttft_ms']:g} ms: {number(attainment['ttft'], ' %')}, "
        f"TPOT <= {slo['tpot_ms']:g} ms: {number(attainment['tpot'], ' %')}, both: {number(attainment['both'], ' %')}",
        f"TTFT p50 / p99      {number(summary['ttft_ms']['p50'], ' ms')} / {number(summary['ttft_ms']['p99'], ' ms')}",
        f"TPOT p50 / p99      {number(summary['tpot_ms']['p50'], ' ms')} / {number(summary['tpot_ms']['p99'], ' ms')}",
        f"replica-seconds     {number(summary['replica_seconds'])} over {number(summary['duration_s'], ' s')} "
        f"(peak {summary['peak_replicas']} replicas; "
        f"{number(summary['replica_seconds_share_of_static_peak'])} of a static fleet at the peak)",
        f"GPU-hours           {number(summary['gpu_hours'])}, relative cost {number(summary['relative_cost'])}, "
        f"per million output tokens within the SLO "
        f"{number(summary['relative_cost_per_million_output_tokens_within_slo'])}",
        f"scaling decisions   {len(summary['scaling'])} ({summary['reversals']} reversals)",
    ]
    lines += [f"  {event['time_s']:>9.1f} s  {event['from_replicas']} -> {event['to_replicas']}  "
              f"[{event['signal']}{', reversal' if event['reversal'] else ''}] {event['reason']}"
              for event in summary["scaling"]]
    return "\n".join(lines)
