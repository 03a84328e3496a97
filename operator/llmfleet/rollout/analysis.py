"""The metric gate of an analysis step: the canary against the stable revision over the same
window, and both against the spec's own bounds (the p99 TTFT SLO, maxErrorRatePercent), from
what Prometheus answered. A query that failed or found too little data is never a failure: the
rollout holds until the numbers are there. Nor is a stable revision out of its bounds: beside
it a canary can only be judged worse or not, never good enough to promote, so the rollout
holds (docs/rollouts.md, "When the stable revision degrades during a canary")."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from llmfleet.api import Reason, RolloutGates


class Outcome(str, Enum):
    SUCCESSFUL = "Successful"
    FAILED = "Failed"
    INCONCLUSIVE = "Inconclusive"  # too few requests, or a series without data
    ERROR = "Error"  # Prometheus did not answer
    # the stable revision breaches the SLO or the error bound, the canary is no worse: hold
    STABLE_DEGRADED = Reason.STABLE_DEGRADED


@dataclass(frozen=True)
class RevisionSample:
    """One revision's requests over the analysis window; None: no data."""

    succeeded: float | None
    failed: float | None
    ttft_p99_ms: float | None
    ttft_mean_ms: float | None = None

    @property
    def requests(self) -> float | None:
        if self.succeeded is None and self.failed is None:
            return None
        return (self.succeeded or 0.0) + (self.failed or 0.0)

    @property
    def error_rate_percent(self) -> float | None:
        requests = self.requests
        return None if not requests else 100.0 * (self.failed or 0.0) / requests


@dataclass(frozen=True)
class Samples:
    stable: RevisionSample | None = None
    canary: RevisionSample | None = None
    window_seconds: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    message: str


@dataclass(frozen=True)
class HistogramBounds:
    """Each revision's TTFT histogram bounds (render.ttft_buckets): a revision rendered for
    another SLO or target has other bounds, and each p99 is known to within its own buckets."""

    stable_ms: Sequence[float]
    canary_ms: Sequence[float]


def bucket_bounds(value_ms: float, edges_ms: Sequence[float]) -> tuple[float, float]:
    """The histogram bucket a quantile estimate lies in, (lower edge, upper edge]: all that the
    counts say about the quantile; histogram_quantile interpolates within it."""
    index = bisect.bisect_left(edges_ms, value_ms)
    lower = edges_ms[index - 1] if index > 0 else 0.0
    upper = edges_ms[index] if index < len(edges_ms) else float("inf")
    return lower, upper


def _above(value_ms: float, bound_ms: float, edges_ms: Sequence[float]) -> bool:
    """Whether a p99 from the histogram is surely above a bound: its bucket starts at or past it."""
    lowest, _ = bucket_bounds(value_ms, edges_ms)
    return lowest >= bound_ms


def judge(samples: Samples, gates: RolloutGates, ttft_p99_slo_ms: float, bounds: HistogramBounds) -> Verdict:
    """The canary fails when it is worse than stable (error rate, p99 or mean TTFT beyond the
    margins) or, beside a stable revision within the bounds, when it breaks them itself. A
    stable revision out of the bounds holds the rollout unless the canary is worse still."""
    if samples.error is not None:
        return Verdict(Outcome.ERROR, f"Prometheus: {samples.error}")
    stable, canary = samples.stable, samples.canary
    window = f"over {samples.window_seconds} s"
    for name, sample in (("canary", canary), ("stable", stable)):
        count = sample.requests if sample else None
        if count is None or count < gates.min_requests:
            return Verdict(Outcome.INCONCLUSIVE, f"{name}: {count or 0:.0f} requests {window}, "
                                                 f"{gates.min_requests} needed for a verdict")
    errors, stable_errors = canary.error_rate_percent or 0.0, stable.error_rate_percent or 0.0
    stable_erring = stable_errors > gates.max_error_rate_percent
    # Beside a stable revision that fails requests too (a cause both share), only the canary's
    # excess over it counts.
    if errors > gates.max_error_rate_percent and (not stable_erring
                                                   or errors - stable_errors > gates.max_error_rate_percent):
        return Verdict(Outcome.FAILED, f"error rate {errors:.1f}% {window} exceeds maxErrorRatePercent "
                                       f"{gates.max_error_rate_percent:g}% ({canary.failed:.0f} of "
                                       f"{canary.requests:.0f} canary requests failed; stable {stable_errors:.1f}%)")
    if canary.ttft_p99_ms is None or stable.ttft_p99_ms is None or stable.ttft_p99_ms <= 0:
        return Verdict(Outcome.INCONCLUSIVE, f"no p99 TTFT {window} for both revisions yet")
    regression = 100.0 * (canary.ttft_p99_ms - stable.ttft_p99_ms) / stable.ttft_p99_ms
    numbers = (f"p99 TTFT canary {canary.ttft_p99_ms:.0f} ms vs stable {stable.ttft_p99_ms:.0f} ms "
               f"({regression:+.0f}%), error rate canary {errors:.1f}% vs stable {stable_errors:.1f}% {window}")
    # Both p99s are known only to within their histogram buckets: the canary fails only when
    # even the lowest value its bucket allows is above the highest stable's allows, plus the margin.
    canary_lowest, _ = bucket_bounds(canary.ttft_p99_ms, bounds.canary_ms)
    _, stable_highest = bucket_bounds(stable.ttft_p99_ms, bounds.stable_ms)
    if canary_lowest > stable_highest * (1 + gates.max_ttft_p99_regression_percent / 100):
        return Verdict(Outcome.FAILED, f"{numbers}: exceeds maxTtftP99RegressionPercent "
                                       f"{gates.max_ttft_p99_regression_percent:g}% (canary's p99 bucket starts "
                                       f"at {canary_lowest:g} ms, stable's ends at {stable_highest:g} ms)")
    # Within neighbouring buckets the p99s cannot tell; the means (the histogram's sum over its
    # count) are exact.
    if canary.ttft_mean_ms is not None and stable.ttft_mean_ms:
        mean_regression = 100.0 * (canary.ttft_mean_ms - stable.ttft_mean_ms) / stable.ttft_mean_ms
        if mean_regression > gates.max_ttft_mean_regression_percent:
            return Verdict(Outcome.FAILED, f"{numbers}; mean TTFT canary {canary.ttft_mean_ms:.1f} ms vs stable "
                                           f"{stable.ttft_mean_ms:.1f} ms ({mean_regression:+.0f}%) exceeds "
                                           f"maxTtftMeanRegressionPercent {gates.max_ttft_mean_regression_percent:g}%")
    stable_breaches = [f"p99 TTFT above the SLO's {ttft_p99_slo_ms:g} ms"] if _above(stable.ttft_p99_ms, ttft_p99_slo_ms,
                                                                                     bounds.stable_ms) else []
    if stable_erring:
        stable_breaches.append(f"error rate above maxErrorRatePercent {gates.max_error_rate_percent:g}%")
    if stable_breaches:
        return Verdict(Outcome.STABLE_DEGRADED, f"{numbers}: the stable revision breaches its bounds "
                                                f"({', '.join(stable_breaches)}); the canary is no worse, "
                                                "which does not make it good: holding")
    if _above(canary.ttft_p99_ms, ttft_p99_slo_ms, bounds.canary_ms):
        return Verdict(Outcome.FAILED, f"{numbers}: the canary's p99 TTFT is above the SLO's "
                                       f"{ttft_p99_slo_ms:g} ms (its bucket starts at {canary_lowest:g} ms) "
                                       "while stable's is within it")
    return Verdict(Outcome.SUCCESSFUL, numbers)
