"""Kopf wiring only: every trigger runs the same reconcile pipeline.

Triggers: a change of an LLMDeployment (create, update, resume at startup), passed in Kopf's
handler; an event of one of its children, and one operator-wide ticker, which only mark the
deployment in a queue (`workqueue.PassQueue`) that half the executor's workers drain. The ticker
marks every `timer_interval_seconds` the deployments whose decisions depend on time
(`needs_periodic_pass`: autoscaling, a running canary, replicas short of ready;
`observation_due`: live traffic to learn from) and every deployment once per `resync_seconds`
(spread per object over its last quarter). What they keep about each deployment between passes
is one `PassBook` in Kopf's memo; a canary's slow reads (golden prompts, analysis queries) run
on `memo.probes`, off the pass (reconcile/probes.py). There are no
per-object timers: they cost a wake-up per object per tick at any scale, and Kopf guards them
with a finalizer, which it cannot remove once it stops watching a namespace being deleted.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import hashlib
import logging
import time

import kopf

from llmfleet.api import GROUP, KIND, PLURAL, VERSION
from llmfleet.heap import release_free_heap
from llmfleet.k8s import (
    APISERVER_REFUSALS,
    CHILD_KINDS,
    KubeGateway,
    NamespaceTerminating,
    ObjectGone,
    load_api_client,
)
from llmfleet.k8s.kopf_session import bounded_session
from llmfleet.metrics import PrometheusMetrics
from llmfleet.planner.cluster import GPU_POD_FIELD_SELECTOR, cluster_gpus, gpu_node, gpu_pod
from llmfleet.api.status import LearnedSpeed
from llmfleet.catalog import load_catalog
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.passbook import PassBook
from llmfleet.reconcile import AskNow, Fleet, OperatorSettings, Probes, needs_periodic_pass, observation_due, reconcile
from llmfleet.render.identity import DEPLOYMENT_LABEL, MANAGED_BY_LABEL, selector_labels
from llmfleet.state_metrics import EXPOSITION_CONTENT_TYPE, exposition
from llmfleet.workqueue import PassQueue

RESOURCE = (GROUP, VERSION, PLURAL)
# How long the apiserver keeps one watch request open, and how long a watch may go without an
# event before it is taken for dead and opened again (`configure` says why these).
WATCH_SERVER_TIMEOUT_S = 30
WATCH_INACTIVITY_TIMEOUT_S = 45
# How long the operator may take to stop once it has begun (for a signal, or because one of its
# tasks failed) before its process is killed: `configure` says why not Kopf's 10 minutes.
STOP_WITHIN_S = 30
# Threads for the slow reads of canaries (golden prompts, analysis queries): a few hung ones
# delay other canaries' gates, never a pass.
PROBE_WORKERS = 4
log = logging.getLogger(__name__)
def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def filter_watches(settings: kopf.OperatorSettings) -> None:
    """Server-side filters: what no handler reads never reaches the operator. Children carry the
    managed-by label their handlers filter on; only pods bound to a node and not finished hold
    GPUs (planner.cluster.gpu_pod). Each event Kopf receives waits, parsed, in a per-object
    queue until its turn: at the peak of a burst of a thousand deployments nearly every object
    had one (docs/operator.md, memory), Pending build pods included."""
    for child in CHILD_KINDS:
        settings.watching.label_selectors[child.group, child.version, child.plural] = f"{MANAGED_BY_LABEL}=llmfleet"
    settings.watching.field_selectors["", "v1", "pods"] = GPU_POD_FIELD_SELECTOR


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # Kopf keeps its bookkeeping in annotations: status belongs to the CRD's schema.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    # A watch can go silent without closing (a broken load balancer or proxy on the way): Kopf
    # then waits `inactivity_timeout` for an event before it opens a new one, and a change made
    # meanwhile waits with it. The apiserver ends a healthy watch after `server_timeout`, sending
    # a bookmark just before, so a healthy stream never idles that long and the timeout only ever
    # fires on a dead one. 30 s and 45 s bound the delay to 45 s (Kopf 1.45.2's default is 70 s);
    # resuming within the apiserver's 75 s of kept events needs no relist (docs/operator.md).
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.inactivity_timeout = WATCH_INACTIVITY_TIMEOUT_S
    settings.execution.max_workers = 8
    # Kopf stops the operator when one of its own tasks fails (a watcher, an object's queue),
    # but 1.45.2 can hang in that stop, still watching with a closed session and waiting for a
    # login that never comes (docs/operator.md, a failed internal task). The Lease, renewed by
    # its own thread, would stay with a leader that does nothing; Kopf kills its process once a
    # stop has taken this long.
    settings.process.ultimate_exiting_timeout = STOP_WITHIN_S
    filter_watches(settings)
    memo.setdefault("operator_settings", OperatorSettings())
    memo.book = PassBook()
    load_catalog()  # read once here, not by every handler thread that finds the cache cold
    memo.gateway = KubeGateway(load_api_client(memo.get("kubeconfig")))
    prometheus = memo.get("prometheus")
    memo.metrics = PrometheusMetrics(prometheus) if prometheus is not None else None
    if prometheus is None:
        log.warning("no Prometheus URL: autoscaling deployments hold their replicas")


@kopf.on.login()
async def login(logger, settings: kopf.OperatorSettings, **_) -> kopf.KubeContext | None:
    """Kopf's own login, with its requests in flight bounded (k8s/kopf_session.py says why)."""
    info = kopf.login_via_client(logger=logger, settings=settings)
    if info is None:
        return None
    session = bounded_session(info.as_ssl_context(), info.as_http_headers(), info.proxy_url, info.trust_env)
    return kopf.AiohttpSession(server=info.server, default_namespace=info.default_namespace,
                               priority=info.priority, expiration=info.expiration, aiohttp_session=session)


def _controller(body) -> dict | None:
    """The ownerReference of the LLMDeployment that controls a child, if any."""
    return next((ref for ref in body["metadata"].get("ownerReferences") or []
                 if ref.get("kind") == KIND and ref.get("controller")), None)


# Annotations no pass reads, often the bulk of an object: a client's copy of what it applied,
# Kopf's copy of the spec it last handled.
_UNREAD_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration", f"{GROUP}/last-handled-configuration")


LWS_KIND = load_lws_record().kind


def _child_spec_read(kind: str, spec: dict) -> dict | None:
    """The part of a child's spec a pass reads: a serving Deployment's (or LeaderWorkerSet's)
    replicas and GPUs, a build Job's backoff. The rest (pod templates, ports, selectors) is the
    operator's own rendering; a change to it by anyone shows in the child's generation or
    resourceVersion."""
    if kind == "Deployment":
        return {**({"replicas": spec["replicas"]} if "replicas" in spec else {}),
                "template": _template_resources(spec.get("template"))}
    if kind == LWS_KIND:
        group = spec.get("leaderWorkerTemplate") or {}
        return {**({"replicas": spec["replicas"]} if "replicas" in spec else {}),
                "leaderWorkerTemplate": {"size": group.get("size", 1),
                                         "leaderTemplate": _template_resources(group.get("leaderTemplate")),
                                         "workerTemplate": _template_resources(group.get("workerTemplate"))}}
    if kind == "Job" and "backoffLimit" in spec:
        return {"backoffLimit": spec["backoffLimit"]}
    return None


def _template_resources(template: dict | None) -> dict:
    """A pod template cut to its containers' resources."""
    containers = ((template or {}).get("spec") or {}).get("containers") or []
    return {"spec": {"containers": [{"resources": container.get("resources") or {}} for container in containers]}}


def indexed(body, child: bool = False) -> dict:
    """An object as the indexes keep it: what a pass reads. Field ownership (managedFields),
    copies of the spec in annotations, a ConfigMap's files and of a child's spec all but what
    `_child_spec_read` names are left out: at a thousand deployments the full objects were
    most of the operator's memory."""
    unread = ("metadata", "data", "binaryData") if body.get("kind") == "ConfigMap" else ("metadata",)
    kept = {key: value for key, value in dict(body).items() if key not in unread}
    if child and "spec" in kept:
        spec_read = _child_spec_read(body.get("kind"), kept.pop("spec"))
        if spec_read is not None:
            kept["spec"] = spec_read
    kept["metadata"] = {key: value for key, value in body["metadata"].items()
                        if key not in ("managedFields", "annotations")}
    annotations = {key: value for key, value in (body["metadata"].get("annotations") or {}).items()
                   if key not in _UNREAD_ANNOTATIONS}
    if annotations:
        kept["metadata"]["annotations"] = annotations
    return copy.deepcopy(kept)


def _child_by_owner(body, **_) -> dict:
    return {_controller(body)["uid"]: indexed(body, child=True)}


# Children come from one watch stream per kind, indexed by their LLMDeployment's uid: a pass
# reads them from memory instead of listing five kinds on every tick.
for _child in CHILD_KINDS:
    kopf.index(*([_child.group] if _child.group else []), _child.version, _child.plural,
               id=f"children_{_child.plural}", labels={MANAGED_BY_LABEL: "llmfleet"},
               when=lambda body, **_: _controller(body) is not None)(_child_by_owner)


@kopf.index(*RESOURCE, id="llm_deployments")
def _deployment_by_uid(body, **_) -> dict:
    return {body["metadata"]["uid"]: indexed(body)}


# What a new plan may use: the GPU nodes, and the pods holding GPUs (anyone's: GPUs are shared).
# Each keeps only the few fields the count needs. Operators limited to some namespaces see
# only those namespaces' pods, and count GPUs held elsewhere as free.
@kopf.index("", "v1", "nodes", id="gpu_nodes")
def _gpu_node(body, **_) -> dict | None:
    node = gpu_node(body)
    return {None: node} if node is not None else None


@kopf.index("", "v1", "pods", id="gpu_pods")
def _gpu_pod(body, **_) -> dict | None:
    pod = gpu_pod(body, DEPLOYMENT_LABEL)
    return {None: pod} if pod is not None else None


# The namespaces that exist. A watch by namespace pattern stops before it reports the deletion
# of a deleted namespace's objects, so they stay in the other indexes (until a restart lists the
# cluster afresh): deployments and pods in a namespace not here are neither passed nor counted.
@kopf.index("", "v1", "namespaces", id="namespaces")
def _namespace(body, **_) -> dict:
    return {body["metadata"]["name"]: True}


# PriorityClass values by name, and the cluster's default (globalDefault) under None.
@kopf.index("scheduling.k8s.io", "v1", "priorityclasses", id="priority_classes")
def _priority_class(body, **_) -> dict:
    value = body.get("value") or 0
    return {body["metadata"]["name"]: value, **({None: value} if body.get("globalDefault") else {})}


def _priority(body, indexes) -> int:
    """The priority the deployment's pods get: its PriorityClass's value, else the default."""
    name = (((body.get("spec") or {}).get("resources") or {}).get("priorityClassName"))
    return next(iter(indexes["priority_classes"].get(name, ())), 0)


def _cluster_gpus(body, indexes):
    metadata = body["metadata"]

    def gpus():
        pods = [pod for pod in indexes["gpu_pods"].get(None, ()) if pod.namespace in indexes["namespaces"]]
        return cluster_gpus(indexes["gpu_nodes"].get(None, ()), pods, metadata["namespace"],
                            selector_labels(metadata["name"])[DEPLOYMENT_LABEL], _priority(body, indexes))
    return gpus


def _fleet_speeds(indexes):
    """Every deployment's learned speeds, parsed only when a pass plans or learns."""
    def speeds() -> list[LearnedSpeed]:
        return [LearnedSpeed.model_validate(speed) for store in list(indexes["llm_deployments"].values())
                for body in list(store) for speed in ((body.get("status") or {}).get("learnedSpeeds") or ())]
    return speeds


def _children(uid: str, indexes) -> list[dict]:
    return [child for kind in CHILD_KINDS for child in indexes[f"children_{kind.plural}"].get(uid, ())]


def _run(body, memo, indexes) -> None:
    if body["metadata"].get("deletionTimestamp"):
        # Going: the garbage collector removes the children; applying them again would fail
        # in a terminating namespace.
        return
    uid, book = body["metadata"]["uid"], memo.book
    with book.locks[uid]:
        try:
            started_s = time.monotonic()
            outcome = reconcile(dict(body), memo.gateway, memo.operator_settings, utc_now(), memo.metrics,
                                children=_children(uid, indexes),
                                fleet=Fleet(_cluster_gpus(body, indexes), _fleet_speeds(indexes)),
                                may_observe=book.may_observe(uid, memo.operator_settings, started_s),
                                probes=memo.get("probes") or AskNow())
            if outcome.observed:
                book.observed_at_s[uid] = started_s
            (book.superseded.add if outcome.superseded else book.superseded.discard)(uid)
            book.pass_succeeded(uid)
        except NamespaceTerminating as going:
            # The object goes with its namespace (deletion reaches it after its children).
            log.debug("namespace %s is being deleted or gone; not reconciling %s", going, body["metadata"]["name"])
            book.gone.add(uid)
        except ObjectGone as gone:
            log.debug("%s is gone; not reconciling it", gone)
            if uid in indexes["llm_deployments"]:  # else its deletion was seen: nothing to skip
                book.gone.add(uid)
        except Exception:
            # Raised on to the caller, who says why; the ticker passes it again after the back-off.
            book.pass_failed(uid, time.monotonic())
            raise
        finally:
            book.last_pass_s[uid] = time.monotonic()


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE)
@kopf.on.resume(*RESOURCE)
def on_change(body, memo, **kwargs) -> None:
    memo.book.indexes_ready.set()
    try:
        _run(body, memo, kwargs)
    except Exception as error:
        # Not raised to Kopf: it would retry in 60 s besides the ticker's back-off.
        _log_failed_pass(body, memo, error)


def _log_failed_pass(body, memo, error: Exception) -> None:
    """One line when the apiserver refused a write (throttling that outlasted the retries, a
    webhook...): that is the cluster's doing, not the operator's. Anything else has its traceback."""
    metadata = body["metadata"]
    log.error("pass of %s/%s failed (passed again in %.0f s): %r", metadata["namespace"], metadata["name"],
              memo.book.retry_in_s(metadata["uid"], time.monotonic()), error,
              exc_info=not isinstance(error, APISERVER_REFUSALS))


def resync_after_seconds(uid: str, settings: OperatorSettings) -> float:
    """Between 3/4 and all of the resync interval, fixed per object: deployments created in
    one burst are not all passed again in one tick."""
    share = int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return settings.resync_seconds * (0.75 + 0.25 * share)


def _due(book: PassBook, indexes, settings: OperatorSettings, now_s: float, now: datetime.datetime) -> list[dict]:
    """The deployments the ticker passes now."""
    due = []
    for store in list(indexes["llm_deployments"].values()):
        for body in list(store):
            uid = body["metadata"]["uid"]
            if uid in book.gone or body["metadata"]["namespace"] not in indexes["namespaces"]:
                continue
            stale = now_s - book.last_pass_s.get(uid, 0.0) >= resync_after_seconds(uid, settings)
            if (stale or uid in book.superseded or book.retry_due(uid, now_s)
                    or needs_periodic_pass(body, _children(uid, indexes))
                    or (book.may_observe(uid, settings, now_s) and observation_due(body, now, settings))):
                due.append(body)
    return due


@kopf.on.startup()
async def start_passes(memo: kopf.Memo, settings: kopf.OperatorSettings, **indexes) -> None:
    """The ticker and child events mark deployments in `memo.passes`; half the executor's
    workers pass the marked ones, so that a change (Kopf's own handlers, the other half) never
    waits behind a tick's passes. Should the ticker or a worker end, it calls
    `memo.stop_operator(why)` (cli/run.py), which stops the operator."""
    loop = asyncio.get_running_loop()
    memo.passes = PassQueue()
    # A finished probe marks its deployment for the pass that reads the answer.
    memo.probes = Probes(PROBE_WORKERS, lambda uid: loop.call_soon_threadsafe(memo.passes.add, uid))

    async def pass_forever() -> None:
        while True:
            uid = await memo.passes.take()
            body = next(iter(indexes["llm_deployments"].get(uid, ())), None)
            try:
                if body is not None:  # else deleted meanwhile
                    await loop.run_in_executor(settings.execution.executor, _run, body, memo, indexes)
            except Exception as error:  # one deployment's failure never stops the others' passes
                _log_failed_pass(body, memo, error)
            finally:
                memo.passes.done(uid)

    async def tick_forever() -> None:
        interval = memo.operator_settings.timer_interval_seconds
        while not memo.book.indexes_ready.is_set():
            await asyncio.sleep(0.5)
        trimmed_s = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now_s = time.monotonic()
            if now_s - trimmed_s >= memo.operator_settings.heap_release_interval_seconds:
                forget_unindexed(memo, indexes)
                await loop.run_in_executor(None, release_free_heap)
                trimmed_s = now_s
            for body in _due(memo.book, indexes, memo.operator_settings, now_s, utc_now()):
                memo.passes.add(body["metadata"]["uid"])

    stop_operator = memo.stop_operator  # read now: a memo without it fails the start, not a stop

    def stop_operator_when_done(name: str):
        # Each runs for as long as the operator: one that ended would leave Kopf, its liveness
        # probe and the Lease up with no pass done, and nothing would say so.
        def done(task: asyncio.Task) -> None:
            if not task.cancelled():  # cancelled: the operator is stopping already
                error = task.exception()
                why = f"the {name} failed: {error!r}" if error is not None else f"the {name} ended"
                log.error("%s; stopping the operator", why, exc_info=error)
                stop_operator(why)
        return done

    memo.background = [asyncio.create_task(tick_forever(), name="pass ticker"),
                       *(asyncio.create_task(pass_forever(), name="pass worker")
                         for _ in range(max(1, settings.execution.max_workers // 2)))]
    for task in memo.background:
        task.add_done_callback(stop_operator_when_done(task.get_name()))


@kopf.on.startup()
async def serve_state_metrics(memo: kopf.Memo, **indexes) -> None:
    """Every LLMDeployment's state as gauges on `memo.metrics_address`'s /metrics (state_metrics.py),
    read from the index at each scrape, in the event loop that updates it."""
    address = memo.get("metrics_address")
    if not address:
        return
    from aiohttp import web

    async def metrics(_request):
        bodies = (body for store in indexes["llm_deployments"].values() for body in store)
        return web.Response(body=exposition(bodies).encode(), headers={"Content-Type": EXPOSITION_CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    memo.metrics_server = web.AppRunner(app, access_log=None)
    await memo.metrics_server.setup()
    host, _, port = address.rpartition(":")
    await web.TCPSite(memo.metrics_server, host or "0.0.0.0", int(port)).start()


@kopf.on.cleanup()
async def stop_passes(memo: kopf.Memo, **_) -> None:
    for task in memo.get("background") or ():
        task.cancel()
    if memo.get("probes") is not None:
        memo.probes.stop()
    if memo.get("metrics_server") is not None:
        await memo.metrics_server.cleanup()


async def on_child_event(body, event, memo, **_) -> None:
    """A child changed or went (a build Job finished, a Deployment's replicas became ready, a
    Service was deleted by hand): its owner is marked for a pass (workqueue.py says why not
    passed here)."""
    controller = _controller(body)
    if event["type"] in ("MODIFIED", "DELETED") and controller is not None:
        memo.passes.add(controller["uid"])


for _child in CHILD_KINDS:
    kopf.on.event(*([_child.group] if _child.group else []), _child.version, _child.plural,
                  labels={MANAGED_BY_LABEL: "llmfleet"})(on_child_event)


def _forget(memo, uid: str) -> None:
    """Drop what the handlers keep about one deployment."""
    memo.book.forget(uid)
    if memo.get("probes") is not None:
        memo.probes.forget(uid)


def forget_unindexed(memo, indexes) -> None:
    """Forget the deployments the index no longer holds. One that goes with its namespace can
    vanish without `on_delete` being called (an optional handler has no finalizer to wait on),
    and what is kept about it would stay until a restart."""
    indexed = indexes["llm_deployments"]
    for uid in memo.book.known() - set(indexed):
        _forget(memo, uid)


@kopf.on.delete(*RESOURCE, optional=True)
def on_delete(body, memo, **_) -> None:
    # Children carry ownerReferences: the garbage collector removes them.
    _forget(memo, body["metadata"]["uid"])
