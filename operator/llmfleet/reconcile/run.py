"""One pass: observe, decide, then write through the k8s gateway, status only on change."""

from __future__ import annotations

import logging
from datetime import datetime

from llmfleet.api import ConditionStatus, ConditionType, Reason
from llmfleet.api.status import LLMDeploymentStatus
from llmfleet.k8s import WriteRefused
from llmfleet.reconcile.context import Context
from llmfleet.reconcile.decide import decide
from llmfleet.reconcile.events import WARNING
from llmfleet.reconcile.observations import Fleet
from llmfleet.reconcile.observe import observe
from llmfleet.reconcile.probes import AskNow, Asks
from llmfleet.reconcile.status import Outcome, merge_patch, wire
from llmfleet.settings import OperatorSettings

log = logging.getLogger(__name__)
# Room in a condition message for the apiserver's words about a refused write.
MAX_REFUSAL_CHARS = 900


def refused_write_patch(ctx: Context, decided: dict, message: str) -> dict:
    """The patch to the status a pass decided, with Degraded saying which write the apiserver
    refused."""
    status = LLMDeploymentStatus.model_validate(decided)
    degraded = ctx.condition(status.conditions or [], ConditionType.DEGRADED, ConditionStatus.TRUE,
                             Reason.CHILD_WRITE_REFUSED, f"the apiserver refused {message[:MAX_REFUSAL_CHARS]}; retrying")
    return merge_patch(ctx.raw_status, wire(status.model_copy(update={"conditions": degraded})))


def reconcile(body: dict, kube, settings: OperatorSettings, now: datetime, metrics=None,
              children: list[dict] = (), fleet: Fleet | None = None, may_observe: bool = True,
              probes: Asks = AskNow()) -> Outcome:
    """Bring the cluster to the state `decide` wants for this LLMDeployment. `children` are the
    objects it owns and `fleet` what the operator's indexes know of the others; `metrics` a
    PrometheusMetrics or None; `may_observe` the caller's pacing of traffic observations;
    `probes` who answers the slow questions (the operator's run off the pass)."""
    ctx = Context.of(body, children, settings, now)
    observations = observe(ctx, kube, metrics, fleet or Fleet(), may_observe, probes)
    result = decide(ctx, observations)
    result.observed = observations.workload is not None
    live = {(child["kind"], child["metadata"]["name"]): child for child in ctx.children.all}
    try:
        for manifest in result.ensure:
            kube.ensure(manifest)
        for manifest in result.apply:
            kube.apply(manifest, live.get((manifest["kind"], manifest["metadata"]["name"])))
        for child, replicas in result.scale:
            kube.scale(child, replicas)
    except WriteRefused as refused:
        # The pass is passed again after a back-off; until then only status can tell the user why
        # nothing changes.
        kube.patch_status(ctx.namespace, ctx.name, refused_write_patch(ctx, result.status, str(refused)),
                          ctx.metadata.get("resourceVersion"))
        kube.emit_event(body, WARNING, Reason.CHILD_WRITE_REFUSED, str(refused))
        raise
    for child in result.delete:
        kube.delete(child)
    # Only from the version this pass read: a pass that started from a stale copy (one handler
    # ran just before with news) must not write its decisions over the newer ones, nor tell
    # them again in events.
    if result.status_changed and not kube.patch_status(ctx.namespace, ctx.name, result.status_patch,
                                                       ctx.metadata.get("resourceVersion")):
        log.debug("%s/%s changed while it was reconciled; the next pass starts from the new version",
                  ctx.namespace, ctx.name)
        result.superseded = True
        return result
    for event in result.events:
        kube.emit_event(body, event.type, event.reason, event.message)
    return result
