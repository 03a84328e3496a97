"""Kubernetes events of a pass: what its steps tell, and one per condition that moved. Normal
for progress and success, Warning for problems: a reader of `kubectl get events` sees warnings
only where something needs a look."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api import ConditionStatus, ConditionType, find_condition
from llmfleet.api.conditions import PROGRESS_REASONS, WARNING_REASONS, Condition

NORMAL, WARNING = "Normal", "Warning"
# Conditions whose True status is bad news.
BAD_WHEN_TRUE = {ConditionType.DEGRADED.value}


@dataclass(frozen=True)
class Event:
    type: str  # NORMAL | WARNING
    reason: str
    message: str

    @classmethod
    def normal(cls, reason: str, message: str) -> Event:
        return cls(NORMAL, reason, message)

    @classmethod
    def warning(cls, reason: str, message: str) -> Event:
        return cls(WARNING, reason, message)


def transition_events(before: list[Condition], after: list[Condition]) -> list[Event]:
    """One event per condition that changed status or reason; several conditions moving to
    the same reason in one pass (a build holds EngineBuilt, Progressing and Ready) tell one
    story, told once, in the words of the first. A reason of progress (Building, RolledOut) is
    Normal whatever the status it sits on, one of WARNING_REASONS a Warning; otherwise the
    status says whether it is bad news."""
    events: dict[tuple[str, str], Event] = {}
    for condition in after:
        previous = find_condition(before, condition.type)
        if previous is not None and previous.status == condition.status and previous.reason == condition.reason:
            continue
        good = condition.reason not in WARNING_REASONS and (
            condition.reason in PROGRESS_REASONS
            or (condition.status == ConditionStatus.TRUE) != (condition.type in BAD_WHEN_TRUE))
        event_type = NORMAL if good else WARNING
        events.setdefault((event_type, condition.reason), Event(event_type, condition.reason, condition.message))
    return list(events.values())
