"""What the autoscaler remembers between passes (persisted in status.autoscaler).

Recommendations are kept as change points of a step function: each entry is the
recommendation in force from its time until the next entry's time. Consecutive equal
recommendations therefore collapse into one entry, which keeps the history short.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from llmfleet.api.status import ScalingDecision

# Bound on the persisted history; enough for a change every 15 s pass over a 15 min window.
MAX_RECOMMENDATIONS = 64


@dataclass(frozen=True)
class Recommendation:
    time: datetime
    replicas: int


@dataclass(frozen=True)
class AutoscalerState:
    last_scale_time: datetime | None = None  # last change of desired replicas, for the cooldown
    warming_since: datetime | None = None  # since when some replicas are not ready
    recommendations: tuple[Recommendation, ...] = ()  # change points, oldest first
    last_scale_direction: ScalingDecision | None = None  # of the last change, for reversals
    reversals: int = 0  # changes opposite to the previous one within the stabilisation window


def record(history: tuple[Recommendation, ...], recommendation: Recommendation,
           keep_seconds: float) -> tuple[Recommendation, ...]:
    """`history` with `recommendation` appended as a change point, less the entries no longer in
    force during the last `keep_seconds`; at most MAX_RECOMMENDATIONS, the oldest dropped."""
    if not history or history[-1].replicas != recommendation.replicas:
        history = (*history, recommendation)
    horizon = recommendation.time - timedelta(seconds=keep_seconds)
    # Entry i is in force at the horizon (and must stay) unless entry i+1 started by then.
    first_kept = 0
    while first_kept + 1 < len(history) and history[first_kept + 1].time <= horizon:
        first_kept += 1
    return history[first_kept:][-MAX_RECOMMENDATIONS:]


def in_force(history: tuple[Recommendation, ...], window_seconds: float,
             now: datetime) -> tuple[list[int], bool]:
    """Replica counts recommended at any time during the last `window_seconds`, and whether
    the history reaches back to the start of the window."""
    start = now - timedelta(seconds=window_seconds)
    replicas = [entry.replicas for index, entry in enumerate(history)
                if index + 1 == len(history) or history[index + 1].time > start]
    covers_window = bool(history) and history[0].time <= start
    return replicas, covers_window
