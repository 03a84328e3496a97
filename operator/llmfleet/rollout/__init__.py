"""Canary rollouts: a pure state machine persisted in status.canary."""

from llmfleet.rollout.machine import (
    Command,
    CanaryState,
    Decision,
    Observed,
    Split,
    advance,
    canary_replicas_for,
    supersede,
)

__all__ = ["CanaryState", "Command", "Decision", "Observed", "Split", "advance", "canary_replicas_for", "supersede"]
