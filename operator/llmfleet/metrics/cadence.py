"""How often Prometheus scrapes a deployment's pods, and the query windows that follow from it.

Pure: the interval comes in as data (a configured value, or sample timestamps Prometheus
answered) and every query window is derived from it; the autoscaler's staleness limit is a
number of these intervals. Nothing else in the operator assumes a scrape interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

# rate(), increase() and deriv() need two samples in their window; four survive a failed scrape
# and the window's edges cutting one off (Prometheus' own guidance for range selectors).
RATE_WINDOW_SCRAPES = 4
# The p99 window is never shorter than this, whatever the interval: shorter windows hold too
# few requests for a p99 at a few requests per second.
MIN_RATE_WINDOW_SECONDS = 30
# The request rate's trend (the autoscaler's forecast) is its least-squares slope over this many
# rate windows: one window's rates overlap, so a shorter fit follows Poisson noise.
RATE_TREND_WINDOWS = 2
# How far back the interval is read from sample spacing: three samples at a 60 s interval.
INTERVAL_LOOKBACK_SECONDS = 300
# Until two samples exist and no interval is configured: kube-prometheus-stack's global default,
# the most common in clusters (the chart's PodMonitor default is 15 s: assuming longer is safe).
ASSUMED_INTERVAL_SECONDS = 30.0


class CadenceSource(str, Enum):
    CONFIGURED = "configured"  # the operator's --prometheus-scrape-interval-seconds
    OBSERVED = "observed"  # the median spacing of the deployment's samples
    ASSUMED = "assumed"  # neither: ASSUMED_INTERVAL_SECONDS


@dataclass(frozen=True)
class ScrapeCadence:
    interval_seconds: float
    source: CadenceSource

    def describe(self) -> str:
        return f"scrape interval {self.interval_seconds:g} s ({self.source.value})"

    @property
    def shortest_window_seconds(self) -> int:
        """The shortest range a rate over this cadence may use."""
        return math.ceil(RATE_WINDOW_SCRAPES * self.interval_seconds)


@dataclass(frozen=True)
class QueryWindow:
    """A range-selector length, and the length asked for when it had to be widened."""

    seconds: int
    widened_from: int | None = None

    def widening(self, what: str, cadence: ScrapeCadence) -> str | None:
        """A sentence for a condition when the window was widened, else None."""
        if self.widened_from is None:
            return None
        return (f"{what} of {self.widened_from} s holds fewer than {RATE_WINDOW_SCRAPES} scrapes at the "
                f"{cadence.describe()}: widened to {self.seconds} s")


def observed_interval(series_sample_times: Iterable[Sequence[float]]) -> float | None:
    """The median spacing of consecutive samples over all series (unix seconds, ascending); None
    when no series has two samples. Rounded to a tenth of a second: samples are stamped with a few
    milliseconds of jitter, and intervals are configured in whole seconds."""
    gaps = [later - earlier for times in series_sample_times for earlier, later in zip(times, times[1:])
            if later > earlier]
    return round(statistics.median(gaps), 1) if gaps else None


def choose_cadence(configured_seconds: float | None, observed_seconds: float | None) -> ScrapeCadence:
    """A configured interval wins (the operator was told); then the observed one."""
    if configured_seconds is not None:
        return ScrapeCadence(configured_seconds, CadenceSource.CONFIGURED)
    if observed_seconds is not None:
        return ScrapeCadence(observed_seconds, CadenceSource.OBSERVED)
    return ScrapeCadence(ASSUMED_INTERVAL_SECONDS, CadenceSource.ASSUMED)


def rate_window(cadence: ScrapeCadence, requested_seconds: int | None = None) -> QueryWindow:
    """The window of the autoscaler's p99 and rate queries: the one asked for, widened to hold
    RATE_WINDOW_SCRAPES scrapes; by default the shortest such window, and at least
    MIN_RATE_WINDOW_SECONDS."""
    shortest = cadence.shortest_window_seconds
    if requested_seconds is None:
        return QueryWindow(max(MIN_RATE_WINDOW_SECONDS, shortest))
    return at_least(requested_seconds, shortest)


def at_least(requested_seconds: int, shortest_seconds: int) -> QueryWindow:
    if requested_seconds >= shortest_seconds:
        return QueryWindow(requested_seconds)
    return QueryWindow(shortest_seconds, widened_from=requested_seconds)


@dataclass(frozen=True)
class MetricsWindows:
    """Every window one pass queries with, for one deployment's cadence."""

    cadence: ScrapeCadence
    rate: QueryWindow  # the autoscaler's p99, rates and queue growth
    observation: QueryWindow  # live re-planning's observed workload

    def analysis_seconds(self, step_elapsed_seconds: int) -> int:
        """A canary analysis compares the revisions since its step began, over at least a rate
        window: a step younger than that has too few scrapes of its own."""
        return max(self.rate.seconds, step_elapsed_seconds)


def metrics_windows(cadence: ScrapeCadence, observation_requested_seconds: int) -> MetricsWindows:
    return MetricsWindows(cadence, rate_window(cadence),
                          at_least(observation_requested_seconds, cadence.shortest_window_seconds))


def trend_window_seconds(rate_window_seconds: int) -> int:
    """The range the request rate's trend is fitted over."""
    return RATE_TREND_WINDOWS * rate_window_seconds
