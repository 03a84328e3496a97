"""The gateway's translation of apiserver refusals (the writes themselves run against the
sandbox's apiserver in e2e)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ConflictError, api_exception

from llmfleet.k8s import KubeGateway, NamespaceTerminating, ObjectGone, WriteRefused
from llmfleet.k8s.gateway import _refusal_named, _terminating_namespace_named

SERVICE = {"kind": "Service", "metadata": {"name": "chat", "namespace": "serving"}}


def _refusal(status: int, message: str, details: dict | None = None) -> Exception:
    error = ApiException(status=status, reason="Internal Server Error")
    error.body = json.dumps({"kind": "Status", "message": message, **({"details": details} if details else {})})
    return api_exception(error)


def test_a_refused_write_names_the_object_and_quotes_the_apiserver():
    with pytest.raises(WriteRefused, match=r"^Service chat: 500 failed to allocate a serviceIP: range is full$"):
        with _refusal_named(SERVICE):
            raise _refusal(500, "failed to allocate a serviceIP: range is full")


def test_a_conflict_is_left_to_the_caller():
    with pytest.raises(ConflictError):
        with _refusal_named(SERVICE):
            raise _refusal(409, "already exists")


# As the apiserver answers a write into a namespace being deleted, and into one already gone.
TERMINATING = (403, 'configmaps "chat" is forbidden: unable to create new content in namespace serving because it '
               'is being terminated', {"name": "chat", "kind": "configmaps",
                                      "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]})
GONE = (404, 'namespaces "serving" not found', {"name": "serving", "kind": "namespaces"})


@pytest.mark.parametrize("refusal", [TERMINATING, GONE], ids=["terminating", "gone"])
def test_a_write_into_a_namespace_going_or_gone_says_so(refusal):
    with pytest.raises(NamespaceTerminating, match="^serving$"):
        with _refusal_named(SERVICE), _terminating_namespace_named("serving"):
            raise _refusal(*refusal)


def test_a_missing_object_in_a_namespace_that_exists_is_a_refused_write():
    with pytest.raises(WriteRefused):
        with _refusal_named(SERVICE), _terminating_namespace_named("serving"):
            raise _refusal(404, 'services "chat" not found', {"name": "chat", "kind": "services"})


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers every PATCH: 404 for the object named `gone`, else 409."""

    def do_PATCH(self):  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        code = 404 if "/gone/" in self.path else 409
        body = json.dumps({"kind": "Status", "code": code, "message": "answered"}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


@pytest.fixture
def status_endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_port}"
    gateway = object.__new__(KubeGateway)  # only the status path: no discovery
    gateway.custom = client.CustomObjectsApi(client.ApiClient(configuration))
    yield gateway
    server.shutdown()
    server.server_close()


def test_a_status_patch_of_an_object_not_there_says_it_is_gone_and_a_conflict_is_a_stale_copy(status_endpoint):
    with pytest.raises(ObjectGone, match="^serving/gone$"):
        status_endpoint.patch_status("serving", "gone", {"replicas": 1}, "42")
    assert status_endpoint.patch_status("serving", "moved-on", {"replicas": 1}, "42") is False
