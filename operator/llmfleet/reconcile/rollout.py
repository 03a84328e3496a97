"""The roll-out and prune step: which revision is stable, and which children go."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api.status import CanaryPhase
from llmfleet.reconcile.build import BuildState
from llmfleet.reconcile.canary import CanaryStep
from llmfleet.reconcile.context import BUILD_COMPONENT, Context, labels, object_key, ready_replicas
from llmfleet.render.identity import COMPONENT_LABEL, REVISION_LABEL


@dataclass(frozen=True)
class Rollout:
    revision: str
    stable_revision: str | None
    ready: int  # ready replicas of the current revision
    ready_anywhere: int  # ready replicas of every revision that still serves
    delete: list[dict]

    @property
    def rolled_out(self) -> bool:
        return self.stable_revision == self.revision


def roll_out(ctx: Context, revision: str, build: BuildState, desired: int, manifests: list[dict],
             canary: CanaryStep) -> Rollout:
    """Without canary steps a new revision surges beside the stable one and becomes stable once
    all its replicas are ready; with them, once the canary is promoted. Then the older
    revisions go. A revision that completed once stays stable when replicas are later lost or
    added (that is Degraded or a scale-up, not a rollout)."""
    serving = ctx.children.serving
    ready = ctx.children.ready(revision)
    stable = ctx.stored.stable_revision
    if canary.split is not None:
        if canary.state.phase == CanaryPhase.PROMOTED:
            stable = revision
    elif stable != revision and build.finished and revision in serving and ready >= desired:
        stable = revision
    rolled_out = stable == revision
    wanted = {object_key(m) for m in manifests}
    # Components an older revision keeps while it still serves: never its build Job, and its
    # own Service only while routing is on (switched off, every revision's Service goes).
    kept_components = {labels(m).get(COMPONENT_LABEL) for m in manifests} - {BUILD_COMPONENT}
    delete = []
    for child in ctx.children.all:
        if object_key(child) in wanted:
            continue
        child_revision = labels(child).get(REVISION_LABEL)
        # Until the new revision is stable only the stable one keeps serving (every older one
        # while no stable revision is recorded, as for objects of an older operator).
        keep_serving = (not rolled_out and child_revision in serving and child_revision != revision
                        and (child_revision == stable or ctx.stored.stable_revision is None)
                        and labels(child).get(COMPONENT_LABEL) in kept_components)
        if not keep_serving:
            delete.append(child)
    ready_anywhere = sum(ready_replicas(d) for rev, d in serving.items() if rev == revision or not rolled_out)
    return Rollout(revision, stable, ready, ready_anywhere, delete)
