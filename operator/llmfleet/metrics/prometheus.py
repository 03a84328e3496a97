"""PromQL over one LLMDeployment's serving pods, answered as a `MetricsSnapshot`.

Series carry the pod's target labels (`namespace`, `pod`, and every pod label with
non-alphanumerics turned into '_', as kubernetes SD's labelmap does) plus Triton's `model` and
`version`. Only the `tensorrt_llm` model counts: with Triton's global latency histograms on,
the ensemble would report every request a second time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from requests import RequestException
from requests.exceptions import ConnectionError as RequestsConnectionError
from requests.exceptions import SSLError, Timeout
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util.retry import Retry

from llmfleet.autoscale import MetricsFailure, MetricsSnapshot, ReplicaObservation
from llmfleet.metrics.connection import PrometheusConnection
from llmfleet.metrics.cadence import (
    INTERVAL_LOOKBACK_SECONDS,
    RATE_WINDOW_SCRAPES,
    ScrapeCadence,
    choose_cadence,
    observed_interval,
    trend_window_seconds,
)
from llmfleet.planner.live import ObservedWorkload
from llmfleet.rollout import RevisionSample, Samples
from llmfleet.render.identity import REVISION_LABEL, selector_labels
from llmfleet.render.layout import (
    ACTIVE_REQUESTS,
    FAILURE_COUNTER,
    INPUT_LENGTH_HISTOGRAM,
    KV_CACHE_GAUGE,
    OUTPUT_LENGTH_HISTOGRAM,
    REQUEST_GAUGE,
    REQUEST_TYPE_LABEL,
    SUCCESS_COUNTER,
    TENSORRT_LLM_MODEL,
    TTFT_HISTOGRAM,
)

# The engine's queue, KV-cache and batch-slot gauges, which the scale-down decision reads.
QUEUE_METRICS = (REQUEST_GAUGE, KV_CACHE_GAUGE)
# The +Inf bucket's `le`, as a PromQL regex in a string literal.
INF_BUCKET = "\\\\+Inf"
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
    requests_per_second_peak: str
    requests_per_second_trend: str
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


def _pod_series(selector: str) -> str:
    """The series every serving pod exports from its start, whatever the release."""
    return f'{{__name__=~"{TTFT_HISTOGRAM}_count|{REQUEST_GAUGE}", {selector}}}'


def sample_spacing_query(namespace: str, deployment_name: str) -> str:
    """The raw samples of the deployment's pod series over the lookback: their spacing is the
    scrape interval Prometheus applies to these pods."""
    return f"{_pod_series(_deployment_selector(namespace, deployment_name))}[{INTERVAL_LOOKBACK_SECONDS}s]"


def _duration(seconds: float) -> str:
    """A PromQL duration (whole units only: a 7.5 s scrape interval is 7500ms)."""
    return f"{round(seconds * 1000)}ms"


def _bound_matcher(bounds_ms: Sequence[int], *extra: str) -> str:
    """Selects the buckets at these bounds (the exporter may write 500 as 500.0), and `extra`."""
    numbers = "|".join(str(bound) for bound in bounds_ms)
    return "le=~" + '"' + "|".join((f"({numbers})(\\\\.0*)?", *extra)) + '"'


def deployment_queries(namespace: str, deployment_name: str, window_seconds: int, ttft_bounds_ms: Sequence[int],
                       peak_window_seconds: int = 0, step_seconds: float | None = None) -> DeploymentQueries:
    """The PromQL for one LLMDeployment, summed over all its pods and revisions. The request
    rate's peak over `peak_window_seconds` and its trend are subqueries over the windowed rate,
    evaluated every `step_seconds` (the scrape interval; a quarter of the window when unknown).
    The p99 reads only the buckets at `ttft_bounds_ms`, the bounds every serving revision
    exports (render.ttft_buckets.shared_ttft_bounds_ms)."""
    selector = _deployment_selector(namespace, deployment_name)
    buckets = f"{selector}, {_bound_matcher(ttft_bounds_ms, INF_BUCKET)}"
    window = f"[{window_seconds}s]"
    step = step_seconds or window_seconds / RATE_WINDOW_SCRAPES
    first_token_rate = f"sum(rate({TTFT_HISTOGRAM}_count{{{selector}}}{window}))"
    waiting = f'{REQUEST_GAUGE}{{{selector}, {REQUEST_TYPE_LABEL}="waiting"}}'
    # A failed scrape or a lost target ends its series at once (Prometheus' staleness markers).
    pod_series = _pod_series(selector)
    return DeploymentQueries(
        ttft_p99_ms=(f"histogram_quantile(0.99, sum by (le) "
                     f"(rate({TTFT_HISTOGRAM}_bucket{{{buckets}}}{window})))"),
        waiting_requests=f"sum({waiting})",
        waiting_growth_per_second=f"sum(deriv({waiting}{window}))",
        # Used over all blocks of the fleet: the mean across replicas, weighted by capacity.
        kv_cache_utilization=(
            f'sum({KV_CACHE_GAUGE}{{{selector}, kv_cache_block_type="used"}}) / '
            f'sum({KV_CACHE_GAUGE}{{{selector}, kv_cache_block_type="max"}})'),
        # In-flight batch slots in use, averaged over the window: KV use alone misses a
        # fleet whose batches are full while its cache is mostly empty.
        batch_utilization=(
            f'sum(avg_over_time({REQUEST_GAUGE}{{{selector}, {REQUEST_TYPE_LABEL}="{ACTIVE_REQUESTS}"}}{window})) / '
            f'sum(avg_over_time({REQUEST_GAUGE}{{{selector}, {REQUEST_TYPE_LABEL}="max"}}{window}))'),
        # Requests that got a first token: present in sandbox and real mode alike.
        requests_per_second=first_token_rate,
        requests_per_second_peak=(f"max_over_time({first_token_rate}"
                                  f"[{_duration(max(peak_window_seconds, step))}:{_duration(step)}])"),
        requests_per_second_trend=(f"deriv({first_token_rate}"
                                   f"[{_duration(trend_window_seconds(window_seconds))}:{_duration(step)}])"),
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


def ttft_attainment_query(namespace: str, deployment_name: str, slo_ttft_ms: int, window_seconds: int) -> str:
    """The share of first tokens within `slo_ttft_ms` over the window: the SLO is a bound of
    every revision rendered for it (render.ttft_buckets), so the count is exact. Only pods
    exporting that bound count (a revision rendered for another SLO, during its canary, does
    not measure this one)."""
    selector = _deployment_selector(namespace, deployment_name)
    window = f"[{window_seconds}s]"
    within = f"rate({TTFT_HISTOGRAM}_bucket{{{selector}, {_bound_matcher((slo_ttft_ms,))}}}{window})"
    return (f"sum({within}) / "
            f"sum(rate({TTFT_HISTOGRAM}_count{{{selector}}}{window}) and on (pod) {within})")


class _QueryFailed(Exception):
    def __init__(self, reason: MetricsFailure, message: str):
        super().__init__(message[:MAX_ERROR_CHARS])
        self.reason = reason


# What to check for each failure a user can fix, by the operator's flags (the chart's values
# set them: docs/operator.md).
_FIXES = {
    MetricsFailure.UNAUTHORIZED: "the credential is missing or wrong: check --prometheus-bearer-token-file or "
                                 "--prometheus-basic-auth-username/--prometheus-basic-auth-password-file",
    MetricsFailure.FORBIDDEN: "the credential is not allowed to query: grant its identity read access",
    MetricsFailure.TLS: "TLS verification failed: check --prometheus-ca-file and --prometheus-server-name",
}
_STATUS_CODE = re.compile(r"HTTP Status Code (\d{3})")


def _failure(field: str, error: Exception) -> _QueryFailed:
    """The failure, classified: a wrong credential or CA reads differently from an outage."""
    reason = MetricsFailure.ERROR
    if isinstance(error, SSLError):
        reason = MetricsFailure.TLS
    elif isinstance(error, (RequestsConnectionError, Timeout, Urllib3Error)):
        reason = MetricsFailure.UNREACHABLE
    elif isinstance(error, PrometheusApiClientException) and (code := _STATUS_CODE.search(str(error))):
        reason = {"401": MetricsFailure.UNAUTHORIZED, "403": MetricsFailure.FORBIDDEN}.get(code.group(1), reason)
    fix = _FIXES.get(reason)
    detail = f"{type(error).__name__}: {error}"
    return _QueryFailed(reason, f"{field}: {fix} ({detail})" if fix else f"{field}: {detail}")


class PrometheusMetrics:
    """Reads a `MetricsSnapshot` from Prometheus' HTTP API. Never raises for Prometheus'
    sake: a failure comes back as `MetricsSnapshot.error`."""

    def __init__(self, connection: PrometheusConnection):
        # No retries: the next reconcile pass is the retry, and a dead Prometheus must not
        # stall the pass for retries x timeout. Retry(False) also raises the underlying error
        # (refused, timed out) rather than a "max retries exceeded" that hides it.
        session = connection.session()
        self._client = PrometheusConnect(url=connection.base_url, retry=Retry(total=False), session=session,
                                         auth=connection.auth(), timeout=connection.timeout_seconds)
        # The client mounts a plain adapter on the URL; this one replaces it (server name, no retries).
        session.mount(connection.base_url, connection.adapter())

    def close(self) -> None:
        self._client.close()

    def scrape_cadence(self, namespace: str, deployment_name: str, now: datetime,
                       configured_seconds: float | None = None) -> ScrapeCadence:
        """The interval Prometheus scrapes the deployment's pods at: the configured one, else the
        spacing of their samples. A failed query is left to the queries that follow, which
        report it; the cadence then falls back to the assumed interval."""
        if configured_seconds is not None:
            return choose_cadence(configured_seconds, None)
        try:
            result = self._query("scrape_interval", sample_spacing_query(namespace, deployment_name), now,
                                 key="values")
            spacing = observed_interval([float(sample[0]) for sample in series["values"]] for series in result)
        except _QueryFailed:
            spacing = None
        return choose_cadence(None, spacing)

    def snapshot(self, namespace: str, deployment_name: str, window_seconds: int,
                 now: datetime, exported_metrics: Collection[str] = QUEUE_METRICS,
                 scrape_interval_seconds: float | None = None, peak_window_seconds: int = 0, *,
                 ttft_bounds_ms: Sequence[int]) -> MetricsSnapshot:
        """Observations over the `window_seconds` before `now`; None fields mean no data.
        `ttft_bounds_ms`: the TTFT bounds every serving revision exports, the ones the fleet's
        p99 is read on (render.ttft_buckets.shared_ttft_bounds_ms).
        `exported_metrics`: the metric families the serving release exports; without the
        engine's queue gauges the snapshot says the queue is not observable.
        `scrape_interval_seconds` is passed through for the staleness check and steps the
        subqueries; `peak_window_seconds` is the range of the request rate's peak (the
        scale-down stabilisation window)."""
        queries = asdict(deployment_queries(namespace, deployment_name, window_seconds, ttft_bounds_ms,
                                            peak_window_seconds, scrape_interval_seconds))
        per_replica = replica_queries(namespace, deployment_name, window_seconds)
        queue_observable = all(name in exported_metrics for name in QUEUE_METRICS)
        try:
            values = {field: self._value(field, query, now) for field, query in queries.items()}
            replica_ttft = self._by_pod("replica_ttft_p99_ms", per_replica.ttft_p99_ms, now)
            replica_rate = self._by_pod("replica_requests_per_second", per_replica.requests_per_second, now)
        except _QueryFailed as failure:
            return MetricsSnapshot(error=str(failure), error_reason=failure.reason)
        newest = values.pop("newest_sample_unix_seconds")
        reporting = values.pop("reporting_pods")
        return MetricsSnapshot(
            **values,
            scrape_interval_seconds=scrape_interval_seconds,
            window_seconds=window_seconds,
            peak_window_seconds=peak_window_seconds,
            trend_window_seconds=trend_window_seconds(window_seconds),
            ttft_histogram_top_ms=ttft_bounds_ms[-1],
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

    def _query(self, field: str, query: str, now: datetime, key: str = "value") -> list[dict]:
        """The query's series; `key` is "value" for an instant vector, "values" for a range
        vector (raw samples)."""
        try:
            result = self._client.custom_query(query, params={"time": now.timestamp()})
            for series in result:  # a malformed answer fails here, as a query failure
                for sample in (series[key] if key == "values" else [series[key]]):
                    float(sample[1])
        except (RequestException, Urllib3Error, PrometheusApiClientException, ValueError,
                KeyError, IndexError, TypeError) as error:
            raise _failure(field, error) from error
        return result


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None
