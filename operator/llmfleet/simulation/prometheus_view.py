"""What Prometheus would hold of a simulated fleet, and the `MetricsSnapshot` the operator would
read from it (pure).

Each serving pod is scraped every interval from when it is ready until it is deleted; each
scrape keeps the pod's TTFT histogram (cumulative counts per bucket, the deployment's bounds
as render.ttft_buckets gives them) and its engine gauges. A snapshot evaluates the same expressions as
llmfleet.metrics.prometheus's queries, with PromQL's semantics: `rate` extrapolated to the
window's edges, `histogram_quantile` interpolated within the bucket, `deriv` by least squares,
`avg_over_time` the mean of the window's samples, instant selectors the newest sample of each
pod still scraped (a deleted pod's series ends at once, as its staleness marker ends it), and a
subquery `expr[range:step]` as `expr` at every multiple of the step within the range.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from llmfleet.autoscale import MetricsSnapshot, ReplicaObservation
from llmfleet.metrics.cadence import trend_window_seconds

P99 = 0.99


@dataclass(frozen=True)
class Sample:
    time_s: float
    ttft_cumulative: tuple[int, ...]  # per bucket bound, then +Inf (the request count)
    waiting_requests: int
    active_requests: int
    batch_slots: int
    kv_blocks_used: int
    kv_blocks_total: int


@dataclass
class PodSeries:
    pod: str
    samples: list[Sample] = field(default_factory=list)
    scraped: bool = True  # False once the pod is deleted: its series ends


class TtftHistogram:
    """A pod's TTFT histogram as Triton exports it: counts of first tokens at or under each bound."""

    def __init__(self, bounds_ms: Sequence[float]):
        self.bounds_ms = tuple(bounds_ms)
        self._counts = [0] * (len(self.bounds_ms) + 1)  # per bucket, not cumulative; the last is +Inf

    def observe(self, ttft_ms: float) -> None:
        self._counts[bisect.bisect_left(self.bounds_ms, ttft_ms)] += 1

    def cumulative(self) -> tuple[int, ...]:
        total, out = 0, []
        for count in self._counts:
            total += count
            out.append(total)
        return tuple(out)


def extrapolated_rate(points: Sequence[tuple[float, float]], start_s: float, end_s: float) -> float | None:
    """PromQL `rate` of a counter over (start_s, end_s]: the increase between the first and last
    sample, extrapolated towards the window's edges (by at most half a sample interval where the
    series starts or ends inside the window, and never below zero), per second. None with fewer
    than two samples."""
    if len(points) < 2:
        return None
    (first_s, first), (last_s, last) = points[0], points[-1]
    increase = last - first
    sampled_s = last_s - first_s
    average_gap_s = sampled_s / (len(points) - 1)
    to_start_s, to_end_s = first_s - start_s, end_s - last_s
    threshold_s = average_gap_s * 1.1
    if to_start_s >= threshold_s:
        to_start_s = average_gap_s / 2
    if increase > 0 and first >= 0:
        to_start_s = min(to_start_s, sampled_s * first / increase)  # a counter does not go below 0
    if to_end_s >= threshold_s:
        to_end_s = average_gap_s / 2
    return increase * (sampled_s + to_start_s + to_end_s) / sampled_s / (end_s - start_s)


def histogram_quantile(quantile: float, bounds: Sequence[float], cumulative_rates: Sequence[float]) -> float | None:
    """PromQL `histogram_quantile` over bucket rates (the finite bounds, then +Inf): linear
    within the bucket the rank falls in; the top finite bound when it falls in +Inf; None
    without observations."""
    total = cumulative_rates[-1]
    if not total > 0:
        return None
    rank = quantile * total
    index = next(i for i, count in enumerate(cumulative_rates) if count >= rank)
    if index == len(bounds):
        return float(bounds[-1])
    lower = bounds[index - 1] if index > 0 else 0.0
    below = cumulative_rates[index - 1] if index > 0 else 0.0
    in_bucket = cumulative_rates[index] - below
    return lower + (bounds[index] - lower) * (rank - below) / in_bucket


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """PromQL `deriv`: the slope of the least-squares line, per second; None under two samples."""
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread if spread else None


def _window(series: PodSeries, start_s: float, end_s: float) -> list[Sample]:
    return [sample for sample in series.samples if start_s < sample.time_s <= end_s]


def _sum(values) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


@dataclass(frozen=True)
class ScrapeSettings:
    interval_seconds: float
    window_seconds: int  # the autoscaler's rate window (llmfleet.metrics.cadence.rate_window)
    queue_observable: bool = True  # the release exports the engine's queue and KV gauges
    # The request gauge has the `waiting` type (TensorRT-LLM backend v0.18 on): without it the
    # operator's query finds no series, and KV and batch-slot use stand in for the queue.
    waiting_observable: bool = True
    peak_window_seconds: int = 0  # the request rate's peak range (the scale-down stabilisation window)


def _rate(samples: list[Sample], value, start_s: float, end_s: float) -> float | None:
    return extrapolated_rate([(sample.time_s, value(sample)) for sample in samples], start_s, end_s)


def _first_token_rate(pods: Sequence[PodSeries], window_seconds: int, at_s: float) -> float | None:
    """`sum(rate(first tokens[window]))` evaluated at `at_s`."""
    start_s = at_s - window_seconds
    return _sum(_rate(_window(pod, start_s, at_s), lambda sample: sample.ttft_cumulative[-1], start_s, at_s)
                for pod in pods)


def _subquery(pods: Sequence[PodSeries], window_seconds: int, now_s: float, range_seconds: float,
              step_seconds: float) -> list[tuple[float, float]]:
    """(time, fleet first-token rate) at each multiple of the step in (now - range, now]."""
    first = math.floor((now_s - range_seconds) / step_seconds) + 1
    times = [index * step_seconds for index in range(first, math.floor(now_s / step_seconds + 1e-9) + 1)]
    points = [(time_s, _first_token_rate(pods, window_seconds, time_s)) for time_s in times]
    return [(time_s, rate) for time_s, rate in points if rate is not None]


def snapshot(pods: Sequence[PodSeries], settings: ScrapeSettings, now_s: float, epoch: datetime,
             bounds_ms: Sequence[float]) -> MetricsSnapshot:
    """The `MetricsSnapshot` PrometheusMetrics.snapshot would answer at `now_s`."""
    start_s = now_s - settings.window_seconds
    windows = {pod.pod: _window(pod, start_s, now_s) for pod in pods}
    live = [pod for pod in pods if pod.scraped and pod.samples]

    def rate(samples: list[Sample], value) -> float | None:
        return _rate(samples, value, start_s, now_s)

    def bucket_rates(samples_by_pod: Sequence[list[Sample]]) -> list[float] | None:
        rates = [[rate(samples, lambda sample, i=i: sample.ttft_cumulative[i]) for i in range(len(bounds_ms) + 1)]
                 for samples in samples_by_pod if len(samples) >= 2]
        return [sum(column) for column in zip(*rates)] if rates else None

    def p99(samples_by_pod: Sequence[list[Sample]]) -> float | None:
        rates = bucket_rates(samples_by_pod)
        return None if rates is None else histogram_quantile(P99, bounds_ms, rates)

    def requests_per_second(samples_by_pod: Sequence[list[Sample]]) -> float | None:
        return _sum(rate(samples, lambda sample: sample.ttft_cumulative[-1]) for samples in samples_by_pod)

    def newest(pod: PodSeries) -> Sample:
        return pod.samples[-1]

    def avg_over_time(value) -> float | None:
        return _sum(sum(value(sample) for sample in samples) / len(samples)
                    for samples in windows.values() if samples)

    observable = settings.queue_observable
    waiting = observable and settings.waiting_observable
    waiting_now = _sum(newest(pod).waiting_requests for pod in live) if waiting else None
    growth = (_sum(least_squares_slope([(sample.time_s, sample.waiting_requests) for sample in samples])
                   for samples in windows.values()) if waiting else None)
    kv_total = _sum(newest(pod).kv_blocks_total for pod in live)
    slots = avg_over_time(lambda sample: sample.batch_slots)
    kv_use = (_sum(newest(pod).kv_blocks_used for pod in live) / kv_total
              if observable and kv_total else None)
    batch_use = (avg_over_time(lambda sample: sample.active_requests) / slots
                 if observable and slots else None)
    step_s, trend_s = settings.interval_seconds, trend_window_seconds(settings.window_seconds)
    peak_points = _subquery(pods, settings.window_seconds, now_s, max(settings.peak_window_seconds, step_s), step_s)
    return MetricsSnapshot(
        ttft_p99_ms=p99(list(windows.values())),
        ttft_histogram_top_ms=float(bounds_ms[-1]),
        waiting_requests=waiting_now,
        waiting_growth_per_second=growth,
        kv_cache_utilization=kv_use,
        batch_utilization=batch_use,
        requests_per_second=requests_per_second(list(windows.values())),
        requests_per_second_peak=max((rate for _, rate in peak_points), default=None),
        requests_per_second_trend=least_squares_slope(
            _subquery(pods, settings.window_seconds, now_s, trend_s, step_s)),
        peak_window_seconds=settings.peak_window_seconds,
        trend_window_seconds=trend_s,
        sample_time=(epoch + timedelta(seconds=max(newest(pod).time_s for pod in live))) if live else None,
        scrape_interval_seconds=settings.interval_seconds,
        window_seconds=settings.window_seconds,
        reporting_pods=len(live) if live else None,
        queue_observable=observable,
        replicas=tuple(ReplicaObservation(name, p99([samples]), requests_per_second([samples]))
                       for name, samples in sorted(windows.items()) if len(samples) >= 2),
    )
