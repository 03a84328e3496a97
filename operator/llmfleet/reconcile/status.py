"""The pass's result: the new status built as a typed value from the stored one and the fields
the pass computed, validated once, diffed once with the stored status; its events."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmfleet.api.conditions import Condition
from llmfleet.api.status import LLMDeploymentStatus
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.events import Event, transition_events


@dataclass
class Outcome:
    # Shared objects the workload needs, created when missing and otherwise left alone.
    ensure: list[dict] = field(default_factory=list)
    apply: list[dict] = field(default_factory=list)
    # (child, replicas): a child whose replica count alone changes (the stable revision's
    # Deployment while a canary runs, which this pass does not render).
    scale: list[tuple[dict, int]] = field(default_factory=list)
    delete: list[dict] = field(default_factory=list)
    status: dict = field(default_factory=dict)  # the new status, as the apiserver stores it
    # The JSON merge patch turning the stored status into `status`: empty when nothing changed.
    status_patch: dict = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    # The pass read the revision's traffic from Prometheus (set by `reconcile`).
    observed: bool = False
    # The object changed while the pass ran, so its status was not written (set by `reconcile`):
    # the pass must be made again, from the new version.
    superseded: bool = False

    @property
    def status_changed(self) -> bool:
        return bool(self.status_patch)


def wire(status: LLMDeploymentStatus) -> dict:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def merge_patch(stored: dict, wanted: dict) -> dict:
    """The JSON merge patch (RFC 7386) turning `stored` into `wanted`: what changed, None for
    what went; nested mappings patched key by key, lists replaced whole."""
    patch: dict = {key: None for key in stored if key not in wanted}
    for key, value in wanted.items():
        before = stored.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif value != before:
            patch[key] = value
    return patch


def outcome(ctx: Context, changes: dict, conditions: list[Condition], *, events: list[Event] = (),
            **writes) -> Outcome:
    """`changes` are the status fields (by their Python names) the pass computed; a field it
    leaves out stays as stored, one it sets is replaced whole (a verdict a canary step cleared
    goes)."""
    status = LLMDeploymentStatus.model_validate({
        **dict(ctx.stored), **changes, "observed_generation": ctx.generation,
        "replan_request": ctx.replan_request, "conditions": conditions})
    wanted = wire(status)
    return Outcome(status=wanted, status_patch=merge_patch(ctx.raw_status, wanted),
                   events=[*events, *transition_events(ctx.conditions_before, conditions)], **writes)
