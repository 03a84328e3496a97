"""PromQL over one LLMDeployment's serving pods, answered as a `MetricsSnapshot`.

Series carry the pod's target labels (`namespace`, `pod`, and every pod label with
non-alphanumerics turned into '_', as kubernetes SD's labelmap does) plus Triton's `model` and
`version`. Only the `tensorrt_llm` model counts: with Triton's global latency histograms on,
the ensemble would report every request a second time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from requests import RequestException
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util.retry import Retry

from llmfleet.autoscale import MetricsSnapshot, ReplicaObservation
from llmfleet.planner.live import ObservedWorkload
from llmfleet.rollout import RevisionSample, Samples
from llmfleet.render.identity import REVISION_LABEL, selector_labels
from llmfleet.render.layout import TENSORRT_LLM_MODEL, TTFT_HISTOGRAM_BUCKETS_MS

# Six 5 s scrapes: rate() and deriv() need at least two samples; longer windows react slower.
DEFAULT_WINDOW_SECONDS = 30
TTFT_HISTOGRAM = "nv_inference_first_response_histogram_ms"
REQUEST_GAUGE = "nv_trt_llm_request_metrics"
KV_CACHE_GAUGE = "nv_trt_llm_kv_cache_block_metrics"
# Triton's per-model request counters (core metrics), which a canary's analysis compares.
SUCCESS_COUNTER = "nv_inference_request_success"
FAILURE_COUNTER = "nv_inference_request_failure"
# The engine's queue, KV-cache and batch-slot gauges, which the scale-down decision reads.
QUEUE_METRICS = (REQUEST_GAUGE, KV_CACHE_GAUGE)
# The TensorRT-LLM backend's token-length histograms, where the release exports them.
INPUT_LENGTH_HISTOGRAM = "nv_llm_input_token_len"
OUTPUT_LENGTH_HISTOGRAM = "nv_llm_output_token_len"
# Keeps an error message (some quote a whole response body) readable in status.
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class DeploymentQueries:
    """One instant query per `MetricsSnapshot` field; each answers one value or nothing."""

    ttft_p99_ms: str
    waiting_requests: str
    waiting_growth_per_second: str
    kv_cache_utilization: str
    batch_utilization: str
    requests_per_second: str
    newest_sample_unix_seconds: str
    reporting_pods: str


@dataclass(frozen=True)
class ReplicaQueries:
    """Instant queries answering one value per serving pod (by the `pod` label)."""

    ttft_p99_ms: str
    requests_per_second: str


def _prometheus_label_name(kubernetes_label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", kubernetes_label)


def _matchers(labels: dict[str, str]) -> str:
    def quoted(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return ", ".join(f"{name}={quoted(value)}" for name, value in labels.items())


def _deployment_selector(namespace: str, deployment_name: str) -> str:
    pods = {"namespace": namespace, "model": TENSORRT_LLM_MODEL}
    pods.update({_prometheus_label_name(key): value
                 for key, value in selector_labels(deployment_name).items()})
    return _matchers(pods)


def deployment_queries(namespace: str, deployment_name: str,
                       window_seconds: int) -> DeploymentQueries:
    """The PromQL for one LLMDeployment, summed over all its pods and revisions."""
    selector = _deployment_selector(namespace, deployment_name)
    window = f"[{window_seconds}s]"
    waiting = f'{REQUEST_GAUGE}{{{selector}, request_type="waiting"}}'
    # A failed scrape or a lost target ends its series at once (Prometheus' staleness markers).
    pod_series = f'{{__name__=~"{TTFT_HISTOGRAM}_count|{REQUEST_GAUGE}", {selector}}}'
    return DeploymentQueries(
        ttft_p99_ms=(f"histogram_quantile(0.99, sum by (le) "
                     f"(rate({TTFT_HISTOGRAM}_bucket{{{selector}}}{window})))"),
        waiting_requests=f"sum({waiting})",
        waiting_growth_per_second=f"sum(deriv({waiting}{window}))",
        # Used over all blocks of the fleet: the mean across replicas, weighted by capacity.
        kv_cache_utilization=(
            f'sum({KV_CACHE_GAUGE}{{{selector}, kv_cache_block_type="used"}}) / '
            f'sum({KV_CACHE_GAUGE}{{{selector}, kv_cache_block_type="max"}})'),
        # In-flight batch slots in use, averaged over the window: KV use alone misses a
        # fleet whose batches are full while its cache is mostly empty.
        batch_utilization=(
            f'sum(avg_over_time({REQUEST_GAUGE}{{{selector}, request_type="active"}}{window})) / '
            f'sum(avg_over_time({REQUEST_GAUGE}{{{selector}, request_type="max"}}{window}))'),
        # Requests that got a first token: present in sandbox and real mode alike.
        requests_per_second=f"sum(rate({TTFT_HISTOGRAM}_count{{{selector}}}{window}))",
        newest_sample_unix_seconds=f"max(timestamp({pod_series}))",
        reporting_pods=f"count(count by (pod) ({pod_series}))",
    )


def replica_queries(namespace: str, deployment_name: str, window_seconds: int) -> ReplicaQueries:
    """The PromQL for one LLMDeployment, per serving pod."""
    selector = _deployment_selector(namespace, deployment_name)
    window = f"[{window_seconds}s]"
    return ReplicaQueries(
        ttft_p99_ms=(f"histogram_quantile(0.99, sum by (pod, le) "
                     f"(rate({TTFT_HISTOGRAM}_bucket{{{selector}}}{window})))"),
        requests_per_second=f"sum by (pod) (rate({TTFT_HISTOGRAM}_count{{{selector}}}{window}))",
    )


@dataclass(frozen=True)
class RevisionQueries:
    """One revision's requests over a window, for a canary analysis."""

    succeeded: str
    failed: str
    ttft_p99_ms: str
    ttft_mean_ms: str


def _revision_selector(namespace: str, deployment_name: str, revision: str, model: str) -> str:
    pods = {"namespace": namespace, _prometheus_label_name(REVISION_LABEL): revision, "model": model}
    pods.update({_prometheus_label_name(key): value for key, value in selector_labels(deployment_name).items()})
    return _matchers(pods)


def revision_queries(namespace: str, deployment_name: str, revision: str, window_seconds: int,
                     request_model: str = TENSORRT_LLM_MODEL) -> RevisionQueries:
    """The PromQL for one revision of one LLMDeployment, summed over its pods. Requests are
    counted at `request_model`, the model clients call (the engine runtime's ensemble: Triton
    counts no failures of a decoupled Python model, only of the ensemble around it); TTFT is the
    engine's."""
    engine = _revision_selector(namespace, deployment_name, revision, TENSORRT_LLM_MODEL)
    requests = _revision_selector(namespace, deployment_name, revision, request_model)
    window = f"[{window_seconds}s]"
    return RevisionQueries(
        succeeded=f"sum(increase({SUCCESS_COUNTER}{{{requests}}}{window}))",
        failed=f"sum(increase({FAILURE_COUNTER}{{{requests}}}{window}))",
        ttft_p99_ms=(f"histogram_quantile(0.99, sum by (le) "
                     f"(rate({TTFT_HISTOGRAM}_bucket{{{engine}}}{window})))"),
        ttft_mean_ms=(f"sum(rate({TTFT_HISTOGRAM}_sum{{{engine}}}{window})) / "
                      f"sum(rate({TTFT_HISTOGRAM}_count{{{engine}}}{window}))"),
    )


@dataclass(frozen=True)
class WorkloadQueries:
    """One revision's traffic over a window, summed over its pods (`ObservedWorkload`)."""

    requests: str
    requests_per_second: str
    replicas: str
    ttft_p99_ms: str
    input_tokens_mean: str
    output_tokens_mean: str
    prefix_reuse_fraction: str


# Per observed field, the metric families it needs beyond the TTFT histogram.
WORKLOAD_FAMILIES = {"input_tokens_mean": (INPUT_LENGTH_HISTOGRAM,),
                     "output_tokens_mean": (OUTPUT_LENGTH_HISTOGRAM,),
                     "prefix_reuse_fraction": (KV_CACHE_GAUGE, INPUT_LENGTH_HISTOGRAM)}


def workload_queries(namespace: str, deployment_name: str, revision: str, window_seconds: int) -> WorkloadQueries:
    """The PromQL for one revision's observed workload: requests by their first token, lengths
    from the TensorRT-LLM backend's token-length histograms (their sums over their counts), and
    the share of prompt tokens the KV cache reused (its reused-blocks count, a running total in
    TensorRT-LLM's block manager, times tokens per block, over the prompt tokens)."""
    engine = _revision_selector(namespace, deployment_name, revision, TENSORRT_LLM_MODEL)
    window = f"[{window_seconds}s]"
    first_tokens = f"{TTFT_HISTOGRAM}_count{{{engine}}}"

    def mean(histogram: str) -> str:
        return f"sum(rate({histogram}_sum{{{engine}}}{window})) / sum(rate({histogram}_count{{{engine}}}{window}))"
    return WorkloadQueries(
        requests=f"sum(increase({first_tokens}{window}))",
        requests_per_second=f"sum(rate({first_tokens}{window}))",
        replicas=f"count(count by (pod) ({first_tokens}))",
        ttft_p99_ms=f"histogram_quantile(0.99, sum by (le) (rate({TTFT_HISTOGRAM}_bucket{{{engine}}}{window})))",
        input_tokens_mean=mean(INPUT_LENGTH_HISTOGRAM),
        output_tokens_mean=mean(OUTPUT_LENGTH_HISTOGRAM),
        prefix_reuse_fraction=(
            f'sum(increase({KV_CACHE_GAUGE}{{{engine}, kv_cache_block_type="reused"}}{window})) * '
            f'avg({KV_CACHE_GAUGE}{{{engine}, kv_cache_block_type="tokens_per"}}) / '
            f"sum(increase({INPUT_LENGTH_HISTOGRAM}_sum{{{engine}}}{window}))"),
    )


def ttft_attainment_query(namespace: str, deployment_name: str, slo_ttft_ms: float, window_seconds: int) -> str | None:
    """The share of first tokens within the largest histogram bound at or under `slo_ttft_ms`
    over the window (a lower bound on the SLO's attainment when the target falls between
    bounds); None when the target is under the smallest bound."""
    bound = max((le for le in TTFT_HISTOGRAM_BUCKETS_MS if le <= slo_ttft_ms), default=None)
    if bound is None:
        return None
    selector = _deployment_selector(namespace, deployment_name)
    window = f"[{window_seconds}s]"
    # The exporter may write the bound as 500 or 500.0.
    return (f'sum(rate({TTFT_HISTOGRAM}_bucket{{{selector}, le=~"{bound}(\\\\.0*)?"}}{window})) / '
            f'sum(rate({TTFT_HISTOGRAM}_count{{{selector}}}{window}))')


class _QueryFailed(Exception):
    pass


class PrometheusMetrics:
    """Reads a `MetricsSnapshot` from Prometheus' HTTP API. Never raises for Prometheus'
    sake: a failure comes back as `MetricsSnapshot.error`."""

    def __init__(self, url: str, timeout_seconds: float = 5.0):
        # No retries: the next reconcile pass is the retry, and a dead Prometheus must not
        # stall the pass for retries x timeout. Retry(False) also raises the underlying error
        # (refused, timed out) rather than a "max retries exceeded" that hides it.
        self._client = PrometheusConnect(url=url, retry=Retry(total=False),
                                         timeout=timeout_seconds)

    def close(self) -> None:
        self._client.close()

    def snapshot(self, namespace: str, deployment_name: str, window_seconds: int,
                 now: datetime, exported_metrics: Collection[str] = QUEUE_METRICS) -> MetricsSnapshot:
        """Observations over the `window_seconds` before `now`; None fields mean no data.
        `exported_metrics`: the metric families the serving release exports; without the
        engine's queue gauges the snapshot says the queue is not observable."""
        queries = asdict(deployment_queries(namespace, deployment_name, window_seconds))
        per_replica = replica_queries(namespace, deployment_name, window_seconds)
        queue_observable = all(name in exported_metrics for name in QUEUE_METRICS)
        try:
            values = {field: self._value(field, query, now) for field, query in queries.items()}
            replica_ttft = self._by_pod("replica_ttft_p99_ms", per_replica.ttft_p99_ms, now)
            replica_rate = self._by_pod("replica_requests_per_second", per_replica.requests_per_second, now)
        except _QueryFailed as failure:
            return MetricsSnapshot(error=str(failure))
        newest = values.pop("newest_sample_unix_seconds")
        reporting = values.pop("reporting_pods")
        return MetricsSnapshot(
            **values,
            ttft_histogram_top_ms=TTFT_HISTOGRAM_BUCKETS_MS[-1],
            sample_time=None if newest is None else datetime.fromtimestamp(newest, timezone.utc),
            reporting_pods=None if reporting is None else round(reporting),
            queue_observable=queue_observable,
            replicas=tuple(ReplicaObservation(pod, replica_ttft.get(pod), replica_rate.get(pod))
                           for pod in sorted(replica_ttft.keys() | replica_rate.keys())))

    def ttft_attainment(self, namespace: str, deployment_name: str, slo_ttft_ms: float, window_seconds: int,
                        now: datetime) -> float | None:
        """`ttft_attainment_query`'s answer: None without requests, or when Prometheus fails."""
        query = ttft_attainment_query(namespace, deployment_name, slo_ttft_ms, window_seconds)
        try:
            return None if query is None else self._value("ttft_attainment", query, now)
        except _QueryFailed:
            return None

    def observed_workload(self, namespace: str, deployment_name: str, revision: str, window_seconds: int,
                          now: datetime, exported_metrics: Collection[str]) -> ObservedWorkload:
        """The revision's traffic over the window before `now`; lengths and prefix reuse only where
        the release exports them; a failed query comes back as `ObservedWorkload.error`."""
        queries = workload_queries(namespace, deployment_name, revision, window_seconds)
        try:
            values = {field: self._value(field, query, now) for field, query in asdict(queries).items()
                      if all(family in exported_metrics for family in WORKLOAD_FAMILIES.get(field, ()))}
        except _QueryFailed as failure:
            return ObservedWorkload(window_seconds, 0, 0.0, 0, None, error=str(failure))
        return ObservedWorkload(window_seconds, values.pop("requests") or 0.0,
                                values.pop("requests_per_second") or 0.0, round(values.pop("replicas") or 0),
                                **values)

    def revision_samples(self, namespace: str, deployment_name: str, stable_revision: str, canary_revision: str,
                         window_seconds: int, now: datetime, request_model: str = TENSORRT_LLM_MODEL) -> Samples:
        """Both revisions' requests over the same window before `now`; a failed query comes back
        as `Samples.error` (an analysis then holds, never fails)."""
        try:
            stable, canary = (
                RevisionSample(**{field: self._value(field, query, now) for field, query in
                                  asdict(revision_queries(namespace, deployment_name, revision, window_seconds,
                                                          request_model)).items()})
                for revision in (stable_revision, canary_revision))
        except _QueryFailed as failure:
            return Samples(window_seconds=window_seconds, error=str(failure))
        return Samples(stable, canary, window_seconds)

    def _value(self, field: str, query: str, now: datetime) -> float | None:
        """The single value the query answers; None when it answers nothing or NaN (e.g.
        histogram_quantile over a window without requests)."""
        result = self._query(field, query, now)
        return _finite(result[0]["value"][1]) if result else None

    def _by_pod(self, field: str, query: str, now: datetime) -> dict[str, float | None]:
        """The query's value per `pod` label (None where NaN)."""
        result = self._query(field, query, now)
        return {series["metric"]["pod"]: _finite(series["value"][1])
                for series in result if "pod" in series["metric"]}

    def _query(self, field: str, query: str, now: datetime) -> list[dict]:
        try:
            result = self._client.custom_query(query, params={"time": now.timestamp()})
            for series in result:
                float(series["value"][1])  # a malformed answer fails here, as a query failure
        except (RequestException, Urllib3Error, PrometheusApiClientException, ValueError,
                KeyError, IndexError, TypeError) as error:
            message = f"{field}: {type(error).__name__}: {error}"
            raise _QueryFailed(message[:MAX_ERROR_CHARS]) from error
        return result


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None
