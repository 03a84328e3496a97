"""Kopf wiring only: every trigger runs the same reconcile pipeline."""

from __future__ import annotations

import datetime
import logging
import threading
from collections import defaultdict

import kopf

from llmfleet.api import GROUP, PLURAL, VERSION
from llmfleet.k8s import KubeGateway, load_api_client
from llmfleet.reconcile import OperatorSettings, reconcile

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


def _run(body, memo) -> None:
    with _object_locks[body["metadata"]["uid"]]:
        reconcile(dict(body), memo.gateway, memo.operator_settings, utc_now())


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
@kopf.on.resume(*RESOURCE)
def on_change(body, memo, **_) -> None:
    _run(body, memo)


def _timer_interval() -> float:
    return OperatorSettings().timer_interval_seconds


@kopf.timer(*RESOURCE, interval=_timer_interval(), idle=0)
def on_timer(body, memo, **_) -> None:
    _run(body, memo)


@kopf.on.delete(*RESOURCE, optional=True)
def on_delete(body, **_) -> None:
    # Children carry ownerReferences: the garbage collector removes them.
    _object_locks.pop(body["metadata"]["uid"], None)
