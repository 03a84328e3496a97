"""Canary rollouts: a pure state machine persisted in status.canary, and its metric gate."""

from llmfleet.rollout.analysis import HistogramBounds, Outcome, RevisionSample, Samples, Verdict, judge
from llmfleet.rollout.machine import (
    CanaryState,
    Command,
    Decision,
    Observed,
    Split,
    advance,
    analysis_due,
    replicas_overdue,
    canary_replicas_for,
    supersede,
)

__all__ = ["CanaryState", "Command", "Decision", "HistogramBounds", "Observed", "Outcome", "RevisionSample",
           "Samples", "Split", "Verdict", "advance", "analysis_due", "canary_replicas_for", "judge", "replicas_overdue",
           "supersede"]
