"""What the metrics adapter observed for one LLMDeployment: the autoscaler's only input signal."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from llmfleet.api.conditions import Reason


class MetricsFailure(str, Enum):
    """Why Prometheus gave no answer: the MetricsAvailable condition's reason."""

    UNAUTHORIZED = Reason.PROMETHEUS_UNAUTHORIZED  # 401: a missing or wrong credential
    FORBIDDEN = Reason.PROMETHEUS_FORBIDDEN  # 403: a credential without read access
    TLS = Reason.PROMETHEUS_TLS_ERROR  # the server's certificate is not trusted, or names another host
    UNREACHABLE = Reason.PROMETHEUS_UNREACHABLE  # refused, timed out, no route
    ERROR = Reason.PROMETHEUS_ERROR  # any other failed query or malformed answer


@dataclass(frozen=True)
class ReplicaObservation:
    """One serving pod's share of the fleet's requests over the window."""

    pod: str
    ttft_p99_ms: float | None  # None: no request got a first token there in the window
    requests_per_second: float | None


@dataclass(frozen=True)
class MetricsSnapshot:
    """Fleet-wide observations of one LLMDeployment's serving pods.

    None means "no data" (no series, NaN, a failed query), never zero: an empty query result
    must not read as an idle fleet.
    """

    ttft_p99_ms: float | None = None
    # The TTFT histogram's top finite bucket edge: Prometheus answers it for a p99 beyond it,
    # so a p99 there is only a lower bound.
    ttft_histogram_top_ms: float | None = None
    waiting_requests: float | None = None  # summed over replicas
    waiting_growth_per_second: float | None = None  # of the summed queue
    kv_cache_utilization: float | None = None  # used blocks / all blocks, 0..1
    batch_utilization: float | None = None  # active sequences / batch slots over the window, 0..1
    requests_per_second: float | None = None  # requests that got their first token
    # That rate's highest value over the last `peak_window_seconds` (the scale-down stabilisation
    # window), and its least-squares slope over the last `trend_window_seconds`, per second per
    # second: what a scale-down must leave room for, and where a ramp is heading.
    requests_per_second_peak: float | None = None
    requests_per_second_trend: float | None = None
    peak_window_seconds: int | None = None
    trend_window_seconds: int | None = None
    sample_time: datetime | None = None  # newest sample behind the observations
    # How often Prometheus scrapes these pods (llmfleet.metrics.cadence), and the window the
    # rates and the p99 cover: staleness is counted in scrapes.
    scrape_interval_seconds: float | None = None
    window_seconds: int | None = None
    # Serving pods (of any revision) with series in Prometheus now: fewer than are ready means
    # the sums above miss some replicas (a pod Prometheus lost, a failing scrape).
    reporting_pods: int | None = None
    # False when the serving release exports no queue, KV-cache or batch metrics at all (the
    # llmapi runtime's model): their absence is then no sign of anything.
    queue_observable: bool = True
    # Per serving pod, for telling a fleet short of capacity from one whose requests pile up at
    # some replicas while others idle.
    replicas: tuple[ReplicaObservation, ...] = ()
    error: str | None = None  # why Prometheus gave no answer
    error_reason: MetricsFailure = MetricsFailure.ERROR  # its kind, when `error` is set
