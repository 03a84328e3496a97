"""What a pass reads beyond its object and children, as one value: the metrics, what the pods
say, the canary's answers, the fleet's GPUs and learned speeds. `decide` takes the context and
these observations, nothing else; `observe` gathers them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from llmfleet.api.status import LearnedSpeed
from llmfleet.autoscale import MetricsSnapshot
from llmfleet.planner.live import ObservedWorkload
from llmfleet.planner.types import ClusterGpus
from llmfleet.rollout import Samples
from llmfleet.rollout.quality import GoldenAnswers


class Fleet:
    """What the operator's indexes know beyond this deployment, read only by the steps that need
    it (planning anew, learning) and at most once a pass: at a thousand deployments either read
    costs more than the rest of the pass."""

    def __init__(self, cluster_gpus: Callable[[], ClusterGpus] | None = None,
                 learned_speeds: Callable[[], list[LearnedSpeed]] | None = None) -> None:
        self._cluster_gpus = cluster_gpus
        self._learned_speeds = learned_speeds

    @cached_property
    def gpus(self) -> ClusterGpus | None:
        """The cluster's GPUs, free and taken; None: unknown, any type the spec allows."""
        return self._cluster_gpus() if self._cluster_gpus else None

    @cached_property
    def speeds(self) -> list[LearnedSpeed]:
        """The speeds every deployment learned."""
        return self._learned_speeds() if self._learned_speeds else []


@dataclass(frozen=True)
class Observations:
    # The deployment's serving metrics when it autoscales (None: no Prometheus configured, which
    # the autoscaler treats like an outage: hold).
    snapshot: MetricsSnapshot | None = None
    # The canary and stable revisions' requests when an analysis step is due.
    samples: Samples | None = None
    # Both revisions' answers to the golden prompts when the quality gate is due.
    golden: GoldenAnswers | None = None
    # Why the current revision's (or an overdue canary's) pods are not ready, when they say.
    not_ready_reason: str | None = None
    # Whether one of those pods is of a group the scheduler found no node for.
    group_unschedulable: bool = False
    # What the current revision's failed build pod printed last.
    build_failure: str | None = None
    # The settled revision's traffic, when an observation for live re-planning was due.
    workload: ObservedWorkload | None = None
    fleet: Fleet = field(default_factory=Fleet)
