"""Token-length distributions for prompts and outputs (pure).

Syntax of `--input-tokens` / `--output-tokens`:

    128  or  fixed:128           always 128
    uniform:64:256               uniform whole numbers from 64 to 256 inclusive
    lognormal:512:2048           log-normal with mean 512 and 99th percentile 2048, as the
                                 LLMDeployment's `inputTokensMean` / `inputTokensP99`

Samples are whole numbers of at least 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmfleet.planner.latency import MAX_LOGNORMAL_P99_OVER_MEAN, Z_P99, lognormal_cv


class LengthError(ValueError):
    """A length distribution that cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class FixedLength:
    tokens: int

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return np.full(count, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class UniformLength:
    low_tokens: int
    high_tokens: int  # inclusive

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens, size=count, endpoint=True)


@dataclass(frozen=True)
class LognormalLength:
    mean_tokens: int
    p99_tokens: int

    def sample(self, rng: np.random.Generator, count: int) -> np.ndarray:
        mu, sigma = self.normal_parameters()
        return np.maximum(1, np.rint(rng.lognormal(mu, sigma, size=count))).astype(np.int64)

    def normal_parameters(self) -> tuple[float, float]:
        """(mu, sigma) of the underlying normal, fitted to the mean and p99 as the planner does."""
        sigma = math.sqrt(math.log1p(lognormal_cv(self.mean_tokens, self.p99_tokens) ** 2))
        return math.log(self.mean_tokens) - sigma ** 2 / 2, sigma


LengthDistribution = FixedLength | UniformLength | LognormalLength


def _whole(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise LengthError(f"{what} {text!r} is not a whole number") from None
    if value < 1:
        raise LengthError(f"{what} must be at least 1, got {value}")
    return value


def parse_length_distribution(spec: str) -> LengthDistribution:
    kind, *values = spec.strip().split(":")
    if not values:
        return FixedLength(_whole(kind, "length"))
    if kind == "fixed" and len(values) == 1:
        return FixedLength(_whole(values[0], "length"))
    if kind == "uniform" and len(values) == 2:
        low, high = _whole(values[0], "low"), _whole(values[1], "high")
        if high < low:
            raise LengthError(f"uniform:{low}:{high}: high must be at least low")
        return UniformLength(low, high)
    if kind == "lognormal" and len(values) == 2:
        mean, p99 = _whole(values[0], "mean"), _whole(values[1], "p99")
        if p99 < mean:
            raise LengthError(f"lognormal:{mean}:{p99}: the p99 must be at least the mean")
        # Beyond this ratio no log-normal has that mean and p99 (the fit has no real root).
        if p99 > mean * MAX_LOGNORMAL_P99_OVER_MEAN:
            raise LengthError(f"lognormal:{mean}:{p99}: a log-normal's p99 can be at most "
                              f"{MAX_LOGNORMAL_P99_OVER_MEAN:.2f} x its mean (exp(z99^2/2), z99 = {Z_P99:.3f})")
        return LognormalLength(mean, p99)
    raise LengthError(f"{spec!r} is not a length distribution; use N, fixed:N, uniform:LOW:HIGH "
                      "or lognormal:MEAN:P99")
