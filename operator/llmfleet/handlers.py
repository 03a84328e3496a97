"""Kopf wiring only: every trigger runs the same reconcile pipeline."""

from __future__ import annotations

import copy
import datetime
import logging
import threading
from collections import defaultdict

import kopf

from llmfleet.api import GROUP, KIND, PLURAL, VERSION
from llmfleet.k8s import CHILD_KINDS, KubeGateway, NamespaceTerminating, load_api_client
from llmfleet.metrics import PrometheusMetrics
from llmfleet.reconcile import OperatorSettings, reconcile
from llmfleet.render.identity import MANAGED_BY_LABEL

RESOURCE = (GROUP, VERSION, PLURAL)
log = logging.getLogger(__name__)
# Change handlers and the timer run in different tasks; one object reconciles at a time.
_object_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # Kopf keeps its bookkeeping in annotations: status belongs to the CRD's schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    settings.execution.max_workers = 8
    memo.setdefault("operator_settings", OperatorSettings())
    memo.gateway = KubeGateway(load_api_client(memo.get("kubeconfig")))
    prometheus_url = memo.get("prometheus_url")
    memo.metrics = PrometheusMetrics(prometheus_url) if prometheus_url else None
    if prometheus_url is None:
        log.warning("no Prometheus URL: autoscaling deployments hold their replicas")


def _controller(body) -> dict | None:
    """The ownerReference of the LLMDeployment that controls a child, if any."""
    return next((ref for ref in body["metadata"].get("ownerReferences") or []
                 if ref.get("kind") == KIND and ref.get("controller")), None)


def _child_by_owner(body, **_) -> dict:
    return {_controller(body)["uid"]: copy.deepcopy(dict(body))}


# Children come from one watch stream per kind, indexed by their LLMDeployment's uid: a pass
# reads them from memory instead of listing five kinds on every tick.
for _child in CHILD_KINDS:
    kopf.index(*([_child.group] if _child.group else []), _child.version, _child.plural,
               id=f"children_{_child.plural}", labels={MANAGED_BY_LABEL: "llmfleet"},
               when=lambda body, **_: _controller(body) is not None)(_child_by_owner)


def _children(uid: str, indexes: dict) -> list[dict]:
    return [child for kind in CHILD_KINDS for child in indexes[f"children_{kind.plural}"].get(uid, ())]


def _run(body, memo, indexes: dict) -> None:
    if body["metadata"].get("deletionTimestamp"):
        # Going: the garbage collector removes the children. Applying them again would fail in
        # a terminating namespace and keep the timer (and so Kopf's finalizer) busy with retries.
        return
    uid = body["metadata"]["uid"]
    with _object_locks[uid]:
        try:
            reconcile(dict(body), memo.gateway, memo.operator_settings, utc_now(), memo.metrics,
                      children=_children(uid, indexes))
        except NamespaceTerminating as going:
            # The object goes with its namespace (deletion reaches it after its children):
            # failing here would put the timer in backoff and hold Kopf's finalizer.
            log.debug("namespace %s is being deleted; not reconciling %s", going, body["metadata"]["name"])


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
@kopf.on.resume(*RESOURCE)
def on_change(body, memo, **kwargs) -> None:
    _run(body, memo, kwargs)


def _timer_interval() -> float:
    return OperatorSettings().timer_interval_seconds


@kopf.timer(*RESOURCE, interval=_timer_interval(), idle=0)
def on_timer(body, memo, **kwargs) -> None:
    _run(body, memo, kwargs)


# A build Job finishing or a serving Deployment becoming ready is a reason to
# reconcile the owner now rather than at the next timer tick.
@kopf.on.event("batch", "v1", "jobs", labels={MANAGED_BY_LABEL: "llmfleet"})
@kopf.on.event("apps", "v1", "deployments", labels={MANAGED_BY_LABEL: "llmfleet"})
def on_child_event(body, event, memo, **kwargs) -> None:
    controller = _controller(body)
    if event["type"] not in ("MODIFIED", "DELETED") or controller is None:
        return
    owner = memo.gateway.get_llm_deployment(body["metadata"]["namespace"], controller["name"])
    if owner is not None and not owner["metadata"].get("deletionTimestamp"):
        _run(owner, memo, kwargs)


@kopf.on.delete(*RESOURCE, optional=True)
def on_delete(body, **_) -> None:
    # Children carry ownerReferences: the garbage collector removes them.
    _object_locks.pop(body["metadata"]["uid"], None)
