"""Replica autoscaling on observed p99 TTFT and the request rate at the modelled capacity: a
pure policy (no I/O, no clock).

`decide` turns a `MetricsSnapshot` (from llmfleet.metrics) and the remembered
`AutoscalerState` into a `Decision`; the caller persists `Decision.state`.
"""

from llmfleet.autoscale.capacity import ReplicaCapacity, forecast_requests_per_second
from llmfleet.autoscale.policy import (
    DEFAULT_TUNING,
    Decision,
    PolicyTuning,
    decide,
    describe_ttft_p99,
    display_round,
    target_ttft_p99_ms,
)
from llmfleet.autoscale.snapshot import MetricsFailure, MetricsSnapshot, ReplicaObservation
from llmfleet.autoscale.state import MAX_RECOMMENDATIONS, AutoscalerState, Recommendation

__all__ = [
    "DEFAULT_TUNING",
    "MAX_RECOMMENDATIONS",
    "AutoscalerState",
    "Decision",
    "MetricsFailure",
    "MetricsSnapshot",
    "PolicyTuning",
    "Recommendation",
    "ReplicaCapacity",
    "ReplicaObservation",
    "decide",
    "describe_ttft_p99",
    "display_round",
    "forecast_requests_per_second",
    "target_ttft_p99_ms",
]
