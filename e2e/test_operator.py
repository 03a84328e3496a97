"""The operator against the real sandbox: admission, planning, children,
serving, revisions, garbage collection and restarts."""

from __future__ import annotations

import datetime
import json
import queue
import re
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import condition, llm_deployment, no_pods_in_ending_namespaces, service_target, temporary_namespace, wait_for
from llmfleet.render.identity import kubectl_kinds
from operator_fixtures import REPO_ROOT

NAMESPACE = "serving"
CHILD_KINDS = kubectl_kinds()


def chat_deployment(name: str, tpot_p99_ms: int) -> dict:
    return llm_deployment(
        name, NAMESPACE, "llama-3.1-8b",
        # The engine runtime: these tests stream through its ensemble and read its build Job.
        engine={"runtime": "engine"},
        slo={"ttftP99Ms": 1000, "tpotP99Ms": tpot_p99_ms, "quality": {"allowedQuantizations": ["BF16", "FP8"]}},
        workload={"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64, "outputTokensP99": 128,
                  "peakRequestsPerSecond": 2},
        resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8, "allowedKvCacheDtypes": ["BF16", "FP8"]},
        # These tests count the operator's writes; live re-planning writes what it observes
        # of their requests (test_live_replanning.py).
        plan={"liveReplanning": "Off"})


@pytest.fixture(scope="module", autouse=True)
def serving_namespace(sandbox, operator):
    no_pods_in_ending_namespaces(sandbox)  # its TP8 revision needs a whole node
    with temporary_namespace(sandbox, NAMESPACE):
        # Every rendered pod must pass the restricted Pod Security Standard, enforced by the apiserver.
        sandbox.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        yield NAMESPACE


def _get(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", name, "-n", NAMESPACE)


def _children(sandbox, name: str) -> list[dict]:
    return sandbox.kubectl_json("get", CHILD_KINDS, "-n", NAMESPACE, "-l",
                                f"llmfleet.io/deployment={name}")["items"]


def _stream_tokens(address: str, prompt: str, max_tokens: int) -> list[str]:
    """Stream through the ensemble as a TensorRT-LLM client does: batch-shaped [1, 1]
    inputs, stream=true, tokens until the final-response flag."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    inputs = []
    for name, datatype, value in (("text_input", "BYTES", np.array([[prompt.encode()]], dtype=np.object_)),
                                  ("max_tokens", "INT32", np.array([[max_tokens]], dtype=np.int32)),
                                  ("stream", "BOOL", np.array([[True]]))):
        tensor = grpcclient.InferInput(name, [1, 1], datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
    tokens = []
    while True:
        result = results.get(timeout=30)
        assert not isinstance(result, Exception), result
        response = result.get_response()
        if response.outputs:
            tokens.append(result.as_numpy("text_output").ravel()[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return tokens


def test_invalid_manifests_are_rejected_by_the_apiserver(sandbox, operator):
    for path in sorted((REPO_ROOT / "examples" / "invalid").glob("*.yaml")):
        header = dict(re.findall(r"^# ([a-z-]+): (.*)$", path.read_text(), flags=re.MULTILINE))
        expected = header.get("apiserver-message") or header["message"]
        output = sandbox.kubectl("apply", "--dry-run=server", "-n", NAMESPACE, "-f", str(path),
                                 check=False)
        assert "is invalid" in output or "Invalid value" in output or "Unsupported value" in output \
            or "Required value" in output, f"{path.name} was accepted: {output}"
        assert expected in output, f"{path.name}: expected {expected!r} in {output!r}"


def test_apply_plans_creates_children_and_serves(sandbox, operator):
    sandbox.apply([chat_deployment("chat", tpot_p99_ms=40)], namespace=NAMESPACE)

    def planned():
        found = condition(_get(sandbox, "chat"), "Planned")
        return found if found and found["status"] == "True" else None
    wait_for(planned, 30, "Planned=True")
    plan = _get(sandbox, "chat")["status"]["plan"]
    assert (plan["gpuType"], plan["tensorParallelSize"], plan["quantization"]) == ("H100-SXM-80GB", 1, "FP8")
    kinds = sorted(child["kind"] for child in _children(sandbox, "chat"))
    assert kinds == ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service"]
    owner_uid = _get(sandbox, "chat")["metadata"]["uid"]
    for child in _children(sandbox, "chat"):
        assert [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == [owner_uid]

    def ready():
        obj = _get(sandbox, "chat")
        found = condition(obj, "Ready")
        return obj if found and found["status"] == "True" else None
    obj = wait_for(ready, 120, f"Ready=True\n{operator.log_tail()}")
    assert obj["status"]["readyReplicas"] == obj["status"]["replicas"] == 1
    assert condition(obj, "EngineBuilt")["status"] == "True"
    tokens = _stream_tokens(service_target(sandbox, "chat", NAMESPACE), "tell me about the sandbox", max_tokens=8)
    assert len(tokens) == 8


def test_slo_update_makes_a_new_revision(sandbox, operator):
    before = _get(sandbox, "chat")["status"]["currentRevision"]
    sandbox.kubectl("patch", "llmdeployment", "chat", "-n", NAMESPACE, "--type=merge",
                    "-p", '{"spec": {"slo": {"tpotP99Ms": 6}}}')

    def new_revision():
        status = _get(sandbox, "chat")["status"]
        return status if status.get("currentRevision") not in (None, before) else None
    status = wait_for(new_revision, 30, "a new revision")
    assert status["plan"]["tensorParallelSize"] == 8

    def rolled_out():
        obj = _get(sandbox, "chat")
        found = condition(obj, "Ready")
        deployments = [c for c in _children(sandbox, "chat") if c["kind"] == "Deployment"]
        return found and found["status"] == "True" and len(deployments) == 1 and deployments
    deployments = wait_for(rolled_out, 180, f"the new revision to replace the old\n{operator.log_tail()}")
    assert deployments[0]["metadata"]["labels"]["llmfleet.io/revision"] == status["currentRevision"]


def test_a_network_policy_selects_the_serving_pods_and_goes_when_removed(sandbox, operator):
    """The apiserver accepts the rendered NetworkPolicy and it selects exactly this deployment's
    serving pods. (That the sandbox enforces it is e2e/test_network_policy.py's.)"""
    def namespace_named(name: str) -> dict:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}
    policy = {"clients": [namespace_named("gateways")], "metricsScrapers": [namespace_named("monitoring")]}
    sandbox.kubectl("patch", "llmdeployment", "chat", "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"networkPolicy": policy}}))

    def policies() -> list[dict]:
        return sandbox.kubectl_json("get", "networkpolicies", "-n", NAMESPACE, "-l",
                                    "llmfleet.io/deployment=chat")["items"]
    (network_policy,) = wait_for(policies, 30, "the NetworkPolicy")
    assert network_policy["spec"]["ingress"][1]["from"] == [namespace_named("monitoring")]
    selector = ",".join(f"{k}={v}" for k, v in network_policy["spec"]["podSelector"]["matchLabels"].items())

    def pod_names(labels: str) -> list[str]:
        return sorted(p["metadata"]["name"] for p in sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                                                          labels)["items"])
    serving = pod_names("llmfleet.io/deployment=chat,app.kubernetes.io/component=server")
    assert serving and pod_names(selector) == serving
    # A changed policy is carried to the object.
    sandbox.kubectl("patch", "llmdeployment", "chat", "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"networkPolicy": {"metricsScrapers": [namespace_named("prometheus")]}}}))
    wait_for(lambda: [p["spec"]["ingress"][1]["from"] for p in policies()] == [[namespace_named("prometheus")]],
             30, "the NetworkPolicy to let the new scrapers in")
    sandbox.kubectl("patch", "llmdeployment", "chat", "-n", NAMESPACE, "--type=json",
                    "-p", '[{"op": "remove", "path": "/spec/networkPolicy"}]')
    wait_for(lambda: not policies(), 30, "the NetworkPolicy to be deleted")


def _audited(sandbox, since: datetime.datetime, verb: str, resource: str, subresource: str | None = None) -> list:
    """The apiserver's audit events (its own log) for `verb` on `resource` in this namespace."""
    events = []
    for line in (sandbox.state_dir / "logs" / "kube-apiserver-audit.log").read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        received = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if (event["verb"], ref.get("resource"), ref.get("subresource"), ref.get("namespace")) == (
                verb, resource, subresource, NAMESPACE) and received >= since:
            events.append(event["requestURI"])
    return events


def test_a_settled_deployment_is_neither_listed_nor_rewritten_on_timer_ticks(sandbox, operator):
    """Children come from the operator's watch-fed indexes, and neither a status equal to the
    stored one nor an unchanged child is written again: over several 5 s timer ticks the
    apiserver's audit log shows no PATCH, and at most the one LIST per kind with which a watch is
    re-established (the old per-tick listing made one per tick, the old apply five PATCHes)."""
    wait_for(lambda: (condition(_get(sandbox, "chat"), "Ready") or {}).get("status") == "True", 120, "Ready")
    time.sleep(6)  # the pass that follows the last child change
    since = datetime.datetime.now(datetime.timezone.utc)
    time.sleep(22)
    # A request the audit log must show in this window, or the empty lists below prove nothing.
    sandbox.kubectl("get", "llmdeployments", "-n", NAMESPACE)
    assert _audited(sandbox, since, "list", "llmdeployments")
    assert len(_audited(sandbox, since, "list", "poddisruptionbudgets")) <= 1
    assert _audited(sandbox, since, "patch", "llmdeployments", "status") == [], operator.log_tail()
    for kind in ("configmaps", "services", "deployments", "jobs", "poddisruptionbudgets"):
        assert _audited(sandbox, since, "patch", kind) == [], f"{kind} re-applied while nothing changed"


def test_operator_restart_creates_no_duplicates_and_restores_what_went_while_it_was_down(sandbox, operator):
    before = sorted((c["kind"], c["metadata"]["name"], c["metadata"]["uid"]) for c in _children(sandbox, "chat"))
    service = next(c for c in _children(sandbox, "chat") if c["kind"] == "Service")
    operator.stop(signal.SIGKILL)
    sandbox.kubectl("delete", "service", service["metadata"]["name"], "-n", NAMESPACE)
    operator.start()
    restored = wait_for(lambda: next((c for c in _children(sandbox, "chat") if c["kind"] == "Service"), None),
                        60, f"the deleted Service back\n{operator.log_tail()}")
    assert restored["metadata"]["uid"] != service["metadata"]["uid"]
    time.sleep(12)  # more passes (timer ticks) must change nothing else
    after = sorted((c["kind"], c["metadata"]["name"], c["metadata"]["uid"]) for c in _children(sandbox, "chat"))
    assert after == sorted([entry for entry in before if entry[0] != "Service"]
                           + [("Service", restored["metadata"]["name"], restored["metadata"]["uid"])])


def test_a_200_character_name_is_served(sandbox, operator):
    """Valid for a custom resource, too long for a label value or a Service: children get cut
    names with a digest, and selection goes through the same identity labels."""
    name = ("a-very-long-deployment-name-" * 8)[:199] + "x"
    sandbox.apply([chat_deployment(name, tpot_p99_ms=40)], namespace=NAMESPACE)
    ready = wait_for(lambda: (condition(_get(sandbox, name), "Ready") or {}).get("status") == "True"
                     and _get(sandbox, name), 180, f"Ready=True\n{operator.log_tail()}")
    assert ready["status"]["readyReplicas"] == 1
    owner = ready["metadata"]["uid"]
    children = [c for c in sandbox.kubectl_json("get", CHILD_KINDS, "-n", NAMESPACE)["items"]
                if [ref["uid"] for ref in c["metadata"].get("ownerReferences") or []] == [owner]]
    assert sorted(c["kind"] for c in children) == ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget",
                                                    "Service"]
    assert all(len(c["metadata"]["name"]) <= 63 for c in children)
    tokens = _stream_tokens(service_target(sandbox, name, NAMESPACE), "a long name", max_tokens=4)
    assert len(tokens) == 4
    sandbox.kubectl("delete", "llmdeployment", name, "-n", NAMESPACE)


def test_infeasible_spec_reports_and_creates_nothing_while_others_serve(sandbox, operator):
    impossible = chat_deployment("impossible", tpot_p99_ms=1)
    sandbox.apply([impossible], namespace=NAMESPACE)

    def not_planned():
        found = condition(_get(sandbox, "impossible"), "Planned")
        return found if found and found["status"] == "False" else None
    not_planned_condition = wait_for(not_planned, 30, "Planned=False")
    assert not_planned_condition["reason"] == "PlanInfeasible"
    assert "closest" in not_planned_condition["message"]
    assert _children(sandbox, "impossible") == []
    assert condition(_get(sandbox, "chat"), "Ready")["status"] == "True"
    sandbox.kubectl("delete", "llmdeployment", "impossible", "-n", NAMESPACE)


def test_delete_garbage_collects_children(sandbox, operator):
    sandbox.kubectl("delete", "llmdeployment", "chat", "-n", NAMESPACE)
    wait_for(lambda: not _children(sandbox, "chat"), 60, "children to be garbage-collected")
    wait_for(lambda: not sandbox.kubectl_json("get", "pods", "-n", NAMESPACE)["items"], 60,
             "pods to be gone")


def test_a_namespace_with_llm_deployments_is_deleted_promptly(sandbox, operator):
    """The operator keeps no finalizer (no per-object timers), so nothing holds the namespace
    Terminating, even under the namespace pattern this operator watches with."""
    with temporary_namespace(sandbox, "short-lived"):
        body = chat_deployment("doomed", tpot_p99_ms=40)
        body["metadata"]["namespace"] = "short-lived"
        sandbox.apply([body], namespace="short-lived")
        planned = wait_for(lambda: (condition(stored := sandbox.kubectl_json("get", "llmdeployment", "doomed", "-n",
                                                                               "short-lived"), "Planned") or {}
                                    ).get("status") == "True" and stored, 60, "Planned=True")
        assert not planned["metadata"].get("finalizers")

    def gone() -> bool:
        return "NotFound" in sandbox.kubectl("get", "namespace", "short-lived", check=False)
    try:
        wait_for(gone, 90, "the namespace to go")
    except AssertionError:
        namespace = sandbox.kubectl("get", "namespace", "short-lived", "-o", "jsonpath={.status.conditions}",
                                    check=False)
        left = sandbox.kubectl("get", "all,pvc,llmdeployments", "-n", "short-lived", check=False)
        raise AssertionError(f"namespace still there: {namespace}\n{left}") from None
