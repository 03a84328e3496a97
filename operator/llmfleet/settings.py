"""The operator's settings (`llmfleet run` sets them), kept apart from the reconcile pipeline
so that the command line can show their defaults without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfleet.render.settings import RenderSettings


@dataclass(frozen=True)
class OperatorSettings:
    render: RenderSettings = field(default_factory=RenderSettings)
    # How often deployments whose decisions depend on time (`needs_periodic_pass`) are passed.
    timer_interval_seconds: float = 5.0
    # How often the ticker gives freed heap back to the system (llmfleet/heap.py).
    heap_release_interval_seconds: float = 15.0
    # Every deployment is passed at least this often, whatever happened: a safety net for an
    # event missed or a change no watch shows.
    resync_seconds: float = 300.0
    # How often Prometheus scrapes the serving pods; None: read from the spacing of their samples
    # (llmfleet.metrics.cadence derives every query window from it).
    scrape_interval_seconds: float | None = None
    # How long added replicas may take to become ready (engine load, warm-up) before missing
    # ones count as Degraded rather than as a scale-up in progress.
    replica_start_grace_seconds: float = 600.0
    # Live re-planning: how often a settled revision's traffic is observed, over what window,
    # and how many requests a speed fit needs (fewer leave the p99 to a handful of requests).
    observation_interval_seconds: float = 300.0
    observation_window_seconds: int = 300  # widened to hold four scrapes where shorter
    observation_min_requests: int = 200
