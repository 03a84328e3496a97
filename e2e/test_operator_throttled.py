"""The operator throttled by the real apiserver: API Priority and Fairness answers its writes
429, it sends them again after the Retry-After (or fails the pass and passes it again after a
back-off), and every deployment still gets its children and its status, with no restart and no
traceback.

Writes must hold their seat long enough to collide, or a one-seat priority level never refuses
anything (a noisy neighbour of Python threads did not make it). So the operator's writes in the
test's namespace are classified into a priority level of one seat that rejects rather than
queues, and a validating admission webhook on the host holds each of them for a second, as a
slow webhook does on a real cluster. Fields as kube-apiserver v1.36.3 (the sandbox's) serves
them: k8s.io/api@v0.36.3:flowcontrol/v1/types.go and admissionregistration/v1/types.go. Zero
nominal shares with nothing lent or borrowed is one seat: a request runs when none does
(k8s.io/apiserver@v0.36.3:pkg/util/flowcontrol/fairqueuing/queueset/queueset.go,
canAccommodateSeatsLocked); a rejection is counted in apiserver_flowcontrol_rejected_requests_total
(pkg/util/flowcontrol/metrics/metrics.go there)."""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import condition, llm_deployment, wait_for
from llmfleet.api import PLURAL
from llmfleet.render.identity import CHILD_KINDS, kubectl_kinds
from llmfleet_sandbox.certs import issue_serving_certificate
from operator_fixtures import OPERATOR_NAMESPACE, SERVICE_ACCOUNT

# Pass failures after the retries are spent are the back-off under test: the checks below
# allow those (and only those) and hold restarts and tracebacks against it.
pytestmark = pytest.mark.disrupts_operator
NAMESPACE = "throttled"
# The priority level, flow schema and webhook configuration, all cluster-scoped: removed after.
THROTTLE = "llmfleet-e2e-throttle"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
WEBHOOK_HOLD_S = 1.0
DEPLOYMENTS = 6
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
# What the operator's own client writes: children, the engine cache claim, status and events.
# Kopf's bookkeeping patches of the LLMDeployment itself stay out: Kopf sends a throttled one
# again after its Retry-After 8 times, then logs a traceback and handles the object again a
# second later (seen here with them in): its behaviour and its log, not the operator's.
THROTTLED_RESOURCES = sorted({kind.plural for kind in CHILD_KINDS}
                             | {"persistentvolumeclaims", "events", f"{PLURAL}/status"})
# What each idle deployment below owns.
EXPECTED_CHILDREN = ["ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service"]


class SlowAdmissionWebhook:
    """An HTTPS validating webhook on the host's loopback (where the sandbox's apiserver runs)
    that admits every request after holding it WEBHOOK_HOLD_S."""

    def __init__(self, sandbox, directory):
        certificate, key = issue_serving_certificate(sandbox.state_dir / "pki", directory / "webhook", THROTTLE,
                                                     ["127.0.0.1"], [])
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls += 1
                time.sleep(WEBHOOK_HOLD_S)
                payload = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                      "response": {"uid": review["request"]["uid"], "allowed": True}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.server_port}/validate"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def throttle_manifests(webhook_url: str, ca_bundle: str) -> list[dict]:
    """One seat for the operator's writes in NAMESPACE, rejecting what does not fit, and the
    webhook that holds each of those writes."""
    return [
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
         "metadata": {"name": THROTTLE},
         "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 0, "lendablePercent": 0,
                                                 "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}},
        # Before the built-in service-accounts schema (9000) that would take the operator's requests.
        {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
         "metadata": {"name": THROTTLE},
         "spec": {"priorityLevelConfiguration": {"name": THROTTLE}, "matchingPrecedence": 1000,
                  "rules": [{"subjects": [{"kind": "ServiceAccount",
                                           "serviceAccount": {"namespace": OPERATOR_NAMESPACE,
                                                              "name": SERVICE_ACCOUNT}}],
                             "resourceRules": [{"verbs": WRITE_VERBS, "apiGroups": ["*"], "resources": THROTTLED_RESOURCES,
                                                "namespaces": [NAMESPACE]}]}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": THROTTLE},
         "webhooks": [{"name": "hold.throttle.llmfleet.io",
                       "clientConfig": {"url": webhook_url, "caBundle": ca_bundle},
                       "rules": [{"operations": ["CREATE", "UPDATE", "DELETE"], "apiGroups": ["*"],
                                  "apiVersions": ["*"], "resources": ["*/*"], "scope": "Namespaced"}],
                       "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                       # The operator's writes alone: the controllers and the node agent run at full speed.
                       "matchConditions": [{"name": "operator",
                                            "expression": f"request.userInfo.username == '{OPERATOR_USER}'"}],
                       "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10,
                       "admissionReviewVersions": ["v1"]}]},
    ]


def flowcontrol_total(sandbox, metric: str) -> float:
    """The apiserver's count of `metric` for the THROTTLE priority level, all series summed."""
    pattern = re.compile(rf'^apiserver_flowcontrol_{metric}\{{[^}}]*priority_level="{THROTTLE}"[^}}]*\}} (\S+)$',
                         flags=re.MULTILINE)
    return sum(float(value) for value in pattern.findall(sandbox.kubectl("get", "--raw", "/metrics")))


@pytest.fixture
def throttled(sandbox, operator, tmp_path):
    """NAMESPACE with the operator's writes throttled; everything removed after, even on failure."""
    webhook = SlowAdmissionWebhook(sandbox, tmp_path)
    ca_bundle = base64.b64encode((sandbox.state_dir / "pki" / "ca.crt").read_bytes()).decode()
    try:
        sandbox.kubectl("create", "namespace", NAMESPACE)
        sandbox.apply(throttle_manifests(webhook.url, ca_bundle))

        def in_effect():
            # A dry-run write as the operator: classified into THROTTLE and held by the webhook
            # once the apiserver has taken in both configurations.
            dispatched, calls = flowcontrol_total(sandbox, "dispatched_requests_total"), webhook.calls
            sandbox.kubectl("--kubeconfig", str(operator.kubeconfig), "create", "configmap", "probe", "-n",
                            NAMESPACE, "--dry-run=server", check=False)
            return flowcontrol_total(sandbox, "dispatched_requests_total") > dispatched and webhook.calls > calls
        wait_for(in_effect, 30, "the priority level and the webhook to take the operator's writes", interval=1)
        yield webhook
    finally:
        for kind in ("validatingwebhookconfiguration", "flowschema", "prioritylevelconfiguration"):
            sandbox.kubectl("delete", kind, THROTTLE, "--ignore-not-found", check=False)
        webhook.stop()
        sandbox.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s", check=False)
        left = sandbox.kubectl("get", f"namespace/{NAMESPACE}", f"validatingwebhookconfiguration/{THROTTLE}",
                               f"flowschema/{THROTTLE}", f"prioritylevelconfiguration/{THROTTLE}",
                               "--ignore-not-found", "-o", "name")
        assert not left.strip(), f"left behind: {left}"


def _idle_deployment(name: str) -> dict:
    # No replicas: children, the engine-cache Job and the status are all writes; no pod serves.
    return llm_deployment(
        name, NAMESPACE, "llama-3.1-8b",
        slo={"ttftP99Ms": 1000, "tpotP99Ms": 40},
        workload={"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64, "outputTokensP99": 128,
                  "peakRequestsPerSecond": 2},
        resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
        plan={"replicas": 0, "liveReplanning": "Off"})


def _unfinished(sandbox) -> list[str]:
    """The deployments not yet planned, built and with one child of each kind, as `name: why`."""
    deployments = {found["metadata"]["name"]: found
                   for found in sandbox.kubectl_json("get", "llmdeployments", "-n", NAMESPACE)["items"]}
    children = sandbox.kubectl_json("get", kubectl_kinds(), "-n", NAMESPACE)["items"]
    unfinished = []
    for name, found in sorted(deployments.items()):
        kinds = sorted(child["kind"] for child in children
                       if child["metadata"].get("labels", {}).get("llmfleet.io/deployment") == name)
        status = found.get("status") or {}
        planned, built = condition(found, "Planned"), condition(found, "EngineBuilt")
        if not (kinds == EXPECTED_CHILDREN and status.get("observedGeneration") == found["metadata"]["generation"]
                and planned and planned["status"] == "True" and built and built["status"] == "True"):
            unfinished.append(f"{name}: children {kinds}, Planned {planned and planned['status']}, "
                              f"EngineBuilt {built and built['status']}")
    return unfinished


def test_a_throttled_operator_sends_writes_again_and_finishes_every_deployment(sandbox, operator, throttled):
    restarts, offset = operator.restarts, operator.log_size()
    rejected = flowcontrol_total(sandbox, "rejected_requests_total")
    started_s = time.monotonic()
    sandbox.apply([_idle_deployment(f"throttled-{index}") for index in range(DEPLOYMENTS)], namespace=NAMESPACE)

    try:
        wait_for(lambda: not _unfinished(sandbox), 300, "every deployment's children and status", interval=2)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}:\n" + "\n".join(_unfinished(sandbox))
                             + f"\n{operator.log_tail()}") from None
    print(f"{DEPLOYMENTS} deployments finished in {time.monotonic() - started_s:.0f} s; "
          f"{throttled.calls} writes held by the webhook")

    refused = flowcontrol_total(sandbox, "rejected_requests_total") - rejected
    logged = operator.log_since(offset)
    sent_again = [line for line in logged.splitlines() if "the apiserver throttled" in line]
    backed_off = [line for line in logged.splitlines() if re.search(r"pass of \S+ failed \(passed again in", line)]
    print(f"the apiserver refused {refused:.0f} requests; the operator sent {len(sent_again)} again and "
          f"backed off {len(backed_off)} passes")
    assert refused > 0, "the apiserver never throttled the operator: the test proves nothing"
    assert sent_again, f"the operator never said it sent a throttled request again:\n{operator.log_tail()}"
    assert operator.restarts == restarts, f"the operator restarted:\n{operator.log_tail()}"
    assert "Traceback (most recent call last)" not in logged, logged[-4000:]
    # A pass may fail only because throttling outlasted the retries; it is passed again later.
    assert all("429" in line for line in backed_off), "\n".join(backed_off[:10])
