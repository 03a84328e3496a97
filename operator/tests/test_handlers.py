"""The Kopf wiring's own parts: what the in-memory indexes keep of an object, Kopf's login, a
child's news marking its owner."""

from __future__ import annotations

import asyncio
import datetime
import copy
import logging
import time

import kopf
import pytest
import kubernetes.config
import yaml

from llmfleet import handlers
from llmfleet.handlers import filter_watches, indexed, login, on_child_event, resync_after_seconds
from llmfleet.k8s import CHILD_KINDS, ObjectGone, WriteRefused
from llmfleet.passbook import PassBook
from llmfleet.planner.cluster import GPU_POD_FIELD_SELECTOR, gpu_node, gpu_pod
from llmfleet.render.identity import DEPLOYMENT_LABEL, MANAGED_BY_LABEL
from llmfleet.reconcile import OperatorSettings
from llmfleet.workqueue import PassQueue
from cluster_builders import node, pod

MANAGED_FIELDS = [{"manager": "llmfleet", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]


def child(kind: str, **top) -> dict:
    return {"apiVersion": "v1", "kind": kind,
            "metadata": {"name": "chat-abc", "namespace": "serving", "uid": "u1", "generation": 3,
                         "resourceVersion": "42", "labels": {"llmfleet.io/revision": "abc"},
                         "ownerReferences": [{"kind": "LLMDeployment", "uid": "owner", "controller": True}],
                         "managedFields": MANAGED_FIELDS,
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}",
                                         "llmfleet.io/last-handled-configuration": "{...}",
                                         "llmfleet.io/rollout-command": "promote/1"}},
            **top}


def test_the_index_keeps_what_a_pass_reads_and_drops_the_bulk():
    deployment = child("Deployment", spec={"replicas": 2}, status={"readyReplicas": 1})
    kept = indexed(deployment)
    assert kept["spec"] == {"replicas": 2} and kept["status"] == {"readyReplicas": 1}
    assert {key: kept["metadata"][key] for key in ("name", "namespace", "uid", "generation", "resourceVersion",
                                                   "labels", "ownerReferences")} == {
        key: deployment["metadata"][key] for key in ("name", "namespace", "uid", "generation", "resourceVersion",
                                                     "labels", "ownerReferences")}
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {"llmfleet.io/rollout-command": "promote/1"}

    config_map = indexed(child("ConfigMap", data={"config.pbtxt": "x" * 10_000}, binaryData={"b": "eA=="}))
    assert "data" not in config_map and "binaryData" not in config_map
    assert "data" in indexed(child("Secret", data={"token": "eA=="}))  # only a ConfigMap's files go


def test_the_index_holds_a_copy_not_the_watch_events_object():
    deployment = child("Deployment", spec={"replicas": 2})
    original = copy.deepcopy(deployment)
    kept = indexed(deployment)
    kept["spec"]["replicas"] = 5
    kept["metadata"]["labels"]["x"] = "y"
    assert deployment == original


def test_a_burst_of_deployments_is_resynced_spread_over_the_last_quarter_of_the_interval():
    settings = OperatorSettings(resync_seconds=300)
    after = [resync_after_seconds(f"uid-{index}", settings) for index in range(1000)]
    assert all(225 <= seconds <= 300 for seconds in after)
    assert max(after) - min(after) > 70  # spread, not one tick for all
    assert resync_after_seconds("uid-7", settings) == after[7]  # fixed per object


def _decisions(outcome) -> tuple:
    return (outcome.apply, outcome.ensure, sorted((c["kind"], c["metadata"]["name"]) for c in outcome.delete),
            outcome.status, outcome.status_changed, outcome.events)


def _lifecycle():
    """(body, children, now) at every step of a deployment's life that the reconcile and
    rollout tests walk: first pass, built, serving, replicas lost, a new revision beside the
    old, a canary warming and promoted."""
    import reconcile_builders as r

    first = r.decide_pass(r.body(), [], r.SETTINGS, r.NOW)
    built = r.finished_job(r.by_kind(first.apply, "Job"))
    second = r.decide_pass(r.body(status=first.status), [built], r.SETTINGS, r.NOW)
    serving = r.ready_deployment(r.by_kind(second.apply, "Deployment"), second.status["replicas"])
    extras = [r.by_kind(first.apply, kind) for kind in ("ConfigMap", "Service", "PodDisruptionBudget")]
    retrying = copy.deepcopy(r.by_kind(first.apply, "Job"))
    retrying["status"] = {"failed": 1, "active": 1}
    yield r.body(status=first.status), [retrying, *extras], r.NOW
    yield r.body(status=first.status), [built, *extras], r.NOW
    yield r.body(status=second.status), [built, serving, *extras], r.NOW
    yield r.body(status=second.status), [built, r.ready_deployment(serving, 0), *extras], r.NOW
    yield r.body(tpot_p99_ms=6, status=second.status), [built, serving, *extras], r.NOW
    stable, warming, children = r.canary_started()
    yield r.manifest_with_steps("v2", 2, warming.status), children, r.NOW
    promoted = r.manifest_with_steps("v2", 2, warming.status)
    promoted["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "promote/1"}
    yield promoted, children, r.NOW


def test_a_pass_decides_the_same_from_the_indexed_children_as_from_the_full_ones():
    from llmfleet.reconcile import OperatorSettings
    from reconcile_builders import decide_pass

    settings = OperatorSettings()
    steps = list(_lifecycle())
    assert len(steps) == 7
    for body, children, now in steps:
        full = decide_pass(body, children, settings, now)
        kept = decide_pass(body, [indexed(child, child=True) for child in children], settings, now)
        assert _decisions(kept) == _decisions(full)
    serving = next(c for c in steps[2][1] if c["kind"] == "Deployment")
    assert indexed(serving, child=True)["spec"] == {
        "replicas": serving["spec"]["replicas"],
        "template": {"spec": {"containers": [{"resources": c.get("resources") or {}}
                                             for c in serving["spec"]["template"]["spec"]["containers"]]}}}
    assert "spec" not in indexed(next(c for c in steps[1][1] if c["kind"] == "Service"), child=True)


def _kubeconfig(tmp_path, monkeypatch) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "serving"}}]}))
    # The client library reads $KUBECONFIG once, at import.
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))


def test_kopf_logs_in_as_it_would_itself_with_its_requests_bounded(tmp_path, monkeypatch):
    _kubeconfig(tmp_path, monkeypatch)

    async def log_in() -> kopf.KubeContext:
        context = await login(logger=logging.getLogger("test"), settings=kopf.OperatorSettings())
        await context.aiohttp_session.close()
        return context
    context = asyncio.run(log_in())
    assert isinstance(context, kopf.AiohttpSession)
    kopfs_own = kopf.login_via_client(logger=logging.getLogger("test"), settings=kopf.OperatorSettings())
    assert [getattr(context, field) for field in ("server", "priority", "default_namespace", "expiration")] == \
        [getattr(kopfs_own, field) for field in ("server", "priority", "default_namespace", "expiration")]
    assert context.aiohttp_session.headers["Authorization"] == "Bearer secret-token"
    assert len(context.aiohttp_session._middlewares) == 1  # the bound: tests/test_kopf_session.py


def test_a_childs_change_or_deletion_marks_its_owner_and_nothing_else_does():
    memo = kopf.Memo(passes=PassQueue())
    for event_type in ("ADDED", "MODIFIED", "DELETED", "MODIFIED"):
        asyncio.run(on_child_event(body=child("Job"), event={"type": event_type}, memo=memo))
    orphan = child("Job")
    orphan["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "uid": "other", "controller": True}]
    asyncio.run(on_child_event(body=orphan, event={"type": "MODIFIED"}, memo=memo))

    async def marked() -> list[str]:
        uids = []
        while len(memo.passes):
            uids.append(await memo.passes.take())
        return uids
    assert asyncio.run(marked()) == ["owner"]


def _resource(group: str, version: str, plural: str, kind: str) -> kopf.Resource:
    return kopf.Resource(group=group, version=version, plural=plural, kind=kind, namespaced=True)


def test_watches_are_filtered_on_the_server_to_what_the_handlers_read():
    settings = kopf.OperatorSettings()
    filter_watches(settings)
    for child in CHILD_KINDS:
        resource = _resource(child.group, child.version, child.plural, child.kind)
        assert settings.watching.label_selectors.collect(resource) == [f"{MANAGED_BY_LABEL}=llmfleet"]
        assert settings.watching.field_selectors.collect(resource) == []
    pods = _resource("", "v1", "pods", "Pod")
    assert settings.watching.field_selectors.collect(pods) == [GPU_POD_FIELD_SELECTOR]
    assert settings.watching.label_selectors.collect(pods) == []  # anyone's pods hold GPUs
    llm = _resource("llmfleet.io", "v1alpha1", "llmdeployments", "LLMDeployment")
    assert settings.watching.label_selectors.collect(llm) == settings.watching.field_selectors.collect(llm) == []


def test_the_ticker_passes_no_deployment_found_gone_or_whose_namespace_went():
    deployment = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
                  "metadata": {"name": "chat", "namespace": "serving", "uid": "chat-uid"}, "spec": {}}
    indexes = {"llm_deployments": {"chat-uid": [deployment]}, "namespaces": {"serving": [True]},
               **{f"children_{kind.plural}": {} for kind in CHILD_KINDS}}
    settings, book = OperatorSettings(), PassBook()
    now = datetime.datetime(2026, 12, 5, tzinfo=datetime.timezone.utc)
    never_passed_s = settings.resync_seconds * 10  # its resync is due
    assert handlers._due(book, indexes, settings, never_passed_s, now) == [deployment]
    assert handlers._due(book, {**indexes, "namespaces": {}}, settings, never_passed_s, now) == []
    book.gone.add("chat-uid")
    assert handlers._due(book, indexes, settings, never_passed_s, now) == []


def test_a_pass_whose_status_write_lost_to_a_newer_version_is_passed_again_at_the_next_tick(monkeypatch):
    from llmfleet.reconcile import Outcome

    deployment = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
                  "metadata": {"name": "chat", "namespace": "serving", "uid": "lost-uid"}, "spec": {}}
    indexes = {"llm_deployments": {"lost-uid": [deployment]}, "namespaces": {"serving": [True]},
               **{f"children_{kind.plural}": {} for kind in CHILD_KINDS}}
    settings = OperatorSettings()
    memo = kopf.Memo(gateway=None, operator_settings=settings, metrics=None, book=PassBook())
    now = datetime.datetime(2026, 12, 5, tzinfo=datetime.timezone.utc)
    outcomes = iter([Outcome(superseded=True), Outcome()])
    monkeypatch.setattr(handlers, "reconcile", lambda *args, **kwargs: next(outcomes))
    handlers._run(deployment, memo, indexes)  # lost its write: due although just passed
    assert handlers._due(memo.book, indexes, settings, time.monotonic(), now) == [deployment]
    handlers._run(deployment, memo, indexes)  # written: due no more
    assert handlers._due(memo.book, indexes, settings, time.monotonic(), now) == []


def test_a_failed_pass_is_passed_again_after_a_back_off_that_doubles_and_resets_on_success(monkeypatch):
    from llmfleet.passbook import FAILED_PASS_BACKOFF_BASE_S, FAILED_PASS_BACKOFF_MAX_S
    from llmfleet.reconcile import Outcome

    deployment = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
                  "metadata": {"name": "chat", "namespace": "serving", "uid": "failed-uid"}, "spec": {}}
    indexes = {"llm_deployments": {"failed-uid": [deployment]}, "namespaces": {"serving": [True]},
               **{f"children_{kind.plural}": {} for kind in CHILD_KINDS}}
    settings = OperatorSettings()
    memo = kopf.Memo(gateway=None, operator_settings=settings, metrics=None, book=PassBook())
    now = datetime.datetime(2026, 12, 5, tzinfo=datetime.timezone.utc)
    throttled = RuntimeError("(429) Too Many Requests")
    outcomes = iter([throttled, throttled, Outcome()])

    def reconcile(*_, **__):
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    backoffs = []
    for _ in range(2):
        with pytest.raises(RuntimeError):
            handlers._run(deployment, memo, indexes)
        failed_s = time.monotonic()
        backoffs.append(memo.book.retry_in_s("failed-uid", failed_s))
        # Settled (no periodic pass) and just passed: only the retry makes it due, and not before its time.
        assert handlers._due(memo.book, indexes, settings, failed_s, now) == []
        assert handlers._due(memo.book, indexes, settings, failed_s + backoffs[-1] + 0.1, now) == [deployment]
    assert backoffs == pytest.approx([FAILED_PASS_BACKOFF_BASE_S, 2 * FAILED_PASS_BACKOFF_BASE_S], abs=0.05)
    handlers._run(deployment, memo, indexes)
    assert handlers._due(memo.book, indexes, settings, time.monotonic() + FAILED_PASS_BACKOFF_MAX_S, now) == []
    assert memo.book.failures == {}


@pytest.mark.parametrize("error, traceback_logged", [
    (WriteRefused("ConfigMap chat-model-repo: 429 Too Many Requests"), False),
    (KeyError("plan"), True),
])
def test_a_failed_change_pass_is_left_to_the_back_off_not_raised_to_kopf(monkeypatch, caplog, error,
                                                                          traceback_logged):
    """Raised to Kopf, it would log a traceback and retry in 60 s besides the ticker's back-off.
    A refusal by the apiserver is the cluster's doing: one line; anything else keeps its traceback."""
    deployment = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
                  "metadata": {"name": "chat", "namespace": "serving", "uid": "failed-uid"}, "spec": {}}
    indexes = {"llm_deployments": {"failed-uid": [deployment]}, "namespaces": {"serving": [True]},
               **{f"children_{kind.plural}": {} for kind in CHILD_KINDS}}
    memo = kopf.Memo(gateway=None, operator_settings=OperatorSettings(), metrics=None, book=PassBook())

    def refused(*_, **__):
        raise error

    monkeypatch.setattr(handlers, "reconcile", refused)
    with caplog.at_level(logging.ERROR, logger="llmfleet.handlers"):
        handlers.on_change(deployment, memo, **indexes)
    (record,) = caplog.records
    assert record.getMessage().startswith(f"pass of serving/chat failed (passed again in 2 s): {error!r}")
    assert bool(record.exc_info) == traceback_logged
    assert memo.book.retry_due("failed-uid", time.monotonic() + 2.1)


def test_a_pass_that_finds_its_deployment_gone_stops_the_ticker_marking_it(monkeypatch):
    deployment = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
                  "metadata": {"name": "chat", "namespace": "gone", "uid": "gone-uid"}, "spec": {}}
    indexes = {"llm_deployments": {"gone-uid": [deployment]}, **{f"children_{kind.plural}": {} for kind in CHILD_KINDS}}
    memo = kopf.Memo(gateway=None, operator_settings=OperatorSettings(), metrics=None, book=PassBook())

    def status_patch_refused(*_, **__):
        raise ObjectGone("gone/chat")  # as the gateway says a 404 on the status patch

    monkeypatch.setattr(handlers, "reconcile", status_patch_refused)
    handlers._run(deployment, memo, indexes)
    assert "gone-uid" in memo.book.gone
    memo.book.gone.discard("gone-uid")
    # Its deletion already seen (no longer indexed): nothing is kept about it.
    handlers._run(deployment, memo, {**indexes, "llm_deployments": {}})
    assert "gone-uid" not in memo.book.gone


def test_what_is_kept_about_a_deployment_goes_when_the_index_no_longer_holds_it():
    kept = {"metadata": {"name": "chat", "namespace": "serving", "uid": "kept-uid"}}
    indexes = {"llm_deployments": {"kept-uid": [kept]}}
    memo = kopf.Memo(book=PassBook())
    book = memo.book
    for uid in ("kept-uid", "went-uid"):
        book.last_pass_s[uid] = book.observed_at_s[uid] = 1.0
        book.gone.add(uid)
        book.superseded.add(uid)
        assert book.locks[uid]
    handlers.forget_unindexed(memo, indexes)
    for kept_about_one in (book.last_pass_s, book.observed_at_s, book.gone, book.superseded, book.locks):
        assert "went-uid" not in kept_about_one and "kept-uid" in kept_about_one


def test_pods_in_a_namespace_that_went_hold_no_gpus_for_a_plan():
    nodes = [gpu_node(node("n1", "NVIDIA-H100-80GB-HBM3", gpus=8))]
    pods = [gpu_pod(pod("gone", "n1", 4, deployment="batch"), DEPLOYMENT_LABEL),
            gpu_pod(pod("serving", "n1", 2, deployment="other"), DEPLOYMENT_LABEL)]
    indexes = {"gpu_nodes": {None: nodes}, "gpu_pods": {None: pods}, "priority_classes": {},
               "namespaces": {"serving": [True], "gone": [True]}}
    body = {"metadata": {"name": "chat", "namespace": "serving", "uid": "chat-uid"}, "spec": {}}
    assert [c.free for c in handlers._cluster_gpus(body, indexes)().capacities] == [2]
    indexes["namespaces"] = {"serving": [True]}
    assert [c.free for c in handlers._cluster_gpus(body, indexes)().capacities] == [6]


def test_the_state_metrics_endpoint_serves_the_indexed_deployments_and_stops_with_the_operator():
    import socket
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    body = {"metadata": {"namespace": "team-a", "name": "chat", "uid": "u1"},
            "spec": {"slo": {"ttftP99Ms": 500}}, "status": {"replicas": 2}}
    memo = kopf.Memo(metrics_address=f"127.0.0.1:{port}")
    indexes = {"llm_deployments": {"u1": [body]}}

    async def scrape_while_serving() -> tuple[str, str]:
        await handlers.serve_state_metrics(memo=memo, **indexes)
        def get():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.headers["Content-Type"], response.read().decode()
        answer = await asyncio.get_running_loop().run_in_executor(None, get)
        await handlers.stop_passes(memo=memo)
        return answer

    content_type, text = asyncio.run(scrape_while_serving())
    assert content_type.startswith("text/plain; version=0.0.4")
    assert 'llmfleet_deployment_replicas{namespace="team-a",llmfleet_io_deployment="chat"} 2' in text
    assert 'llmfleet_deployment_slo_ttft_bucket{namespace="team-a",llmfleet_io_deployment="chat",le="500"} 1' in text
    with socket.socket() as probe:  # nothing listens any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0
