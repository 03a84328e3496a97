"""The pass's result: the status it decided, diffed with the stored one, and its events."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from llmfleet.api.conditions import Condition
from llmfleet.api.status import LLMDeploymentStatus
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.events import Event, transition_events


@dataclass
class Outcome:
    # Shared objects the workload needs, created when missing and otherwise left alone.
    ensure: list[dict] = field(default_factory=list)
    apply: list[dict] = field(default_factory=list)
    delete: list[dict] = field(default_factory=list)
    status: dict = field(default_factory=dict)  # a merge patch of the stored status
    # False: the status equals the stored one and is not written.
    status_changed: bool = True
    events: list[Event] = field(default_factory=list)
    # The pass read the revision's traffic from Prometheus (set by `reconcile`).
    observed: bool = False
    # The object changed while the pass ran, so its status was not written (set by `reconcile`):
    # the pass must be made again, from the new version.
    superseded: bool = False


def dump_conditions(conditions: list[Condition]) -> list[dict]:
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in conditions]


def merge_patched(stored: dict, patch: dict) -> dict:
    """`stored` after a JSON merge patch (RFC 7386): None removes, mappings merge, the rest replaces."""
    merged = dict(stored)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patched(merged[key], value)
        else:
            merged[key] = value
    return merged


def _replacing(stored: dict, section: dict) -> dict:
    """A merge patch that turns `stored` into `section`: a merge patch keeps what it does not
    name, so each key `section` dropped is written as None (removed), nested mappings likewise.
    A pass computes each status section it writes whole; merged onto the stored one, a field it
    cleared (a canary's verdict when its step passes, an autoscaler's warmingSince) would stay."""
    patch = {key: None for key in stored if key not in section}
    for key, value in section.items():
        before = stored.get(key)
        patch[key] = _replacing(before, value) if isinstance(value, dict) and isinstance(before, dict) else value
    return patch


def _normalised(status: dict) -> dict:
    try:
        return LLMDeploymentStatus.model_validate(status).model_dump(mode="json", by_alias=True, exclude_none=True)
    except ValidationError:
        return {"unparsable": status}


def outcome(ctx: Context, status: dict, conditions: list[Condition], *, events: list[Event] = (),
            **changes) -> Outcome:
    """The status with its conditions, diffed with the stored one; the events the steps told
    and those of the conditions that moved."""
    status = {**status, "observedGeneration": ctx.generation, "replanRequest": ctx.replan_request,
              "conditions": dump_conditions(conditions)}
    # What this pass leaves out of the status stays; a section it writes is written whole.
    status = {key: value for key, value in _replacing(ctx.raw_status, status).items() if key in status}
    changed = _normalised(merge_patched(ctx.raw_status, status)) != _normalised(ctx.raw_status)
    return Outcome(status=status, status_changed=changed,
                   events=[*events, *transition_events(ctx.conditions_before, conditions)], **changes)
