"""A request the apiserver throttles (429 from API Priority and Fairness) is sent again after
the Retry-After it names, whatever its verb, as client-go does; a lost answer is not."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from kubernetes import client

from llmfleet.k8s import KubeGateway, WriteRefused, load_api_client
from llmfleet.k8s import gateway as gateway_module
from llmfleet.k8s.gateway import THROTTLED_RETRIES


class Apiserver:
    """Answers 429 (Retry-After: 0) to the first `throttled` requests, then 201 with what was sent."""

    def __init__(self, throttled: int):
        self.throttled, self.requests = throttled, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((self.command, self.path))
                if len(outer.requests) <= outer.throttled:
                    self.send_response(429)
                    self.send_header("Retry-After", "0")
                    payload = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "reason": "TooManyRequests", "code": 429}).encode()
                else:
                    self.send_response(201)
                    payload = body
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_PATCH = do_POST

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, directory) -> str:
        path = directory / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{self.server.server_port}"}}],
            "users": [{"name": "test", "user": {"token": "t"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
        return str(path)


@pytest.fixture
def throttling_apiserver():
    servers = []

    def start(throttled: int) -> Apiserver:
        servers.append(Apiserver(throttled))
        return servers[-1]
    yield start
    for server in servers:
        server.server.shutdown()
        server.server.server_close()


def _create_namespace(api_client) -> None:
    client.CoreV1Api(api_client).create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": "throttled"}})


def test_a_throttled_create_is_sent_again_until_it_passes(throttling_apiserver, tmp_path, caplog):
    apiserver = throttling_apiserver(throttled=3)
    with caplog.at_level(logging.INFO, logger="llmfleet.k8s.gateway"):
        _create_namespace(load_api_client(apiserver.kubeconfig(tmp_path)))
    assert apiserver.requests == [("POST", "/api/v1/namespaces")] * 4
    # An operator slowed by throttling says so, once per request sent again.
    assert [record.getMessage() for record in caplog.records] == [
        f"the apiserver throttled POST /api/v1/namespaces (429, Retry-After: 0 s); sending it again "
        f"({attempt} of {THROTTLED_RETRIES})" for attempt in (1, 2, 3)]


def test_throttling_that_outlasts_the_retries_is_the_callers_error(throttling_apiserver, tmp_path):
    apiserver = throttling_apiserver(throttled=THROTTLED_RETRIES + 5)
    with pytest.raises(client.ApiException) as refused:
        _create_namespace(load_api_client(apiserver.kubeconfig(tmp_path)))
    assert refused.value.status == 429
    assert len(apiserver.requests) == THROTTLED_RETRIES + 1


def test_a_status_write_throttled_past_the_retries_is_a_refusal_that_names_it(throttling_apiserver, tmp_path,
                                                                               monkeypatch):
    """Not a bare ApiException: the failed pass's log line says which write and why."""
    apiserver = throttling_apiserver(throttled=THROTTLED_RETRIES + 5)
    monkeypatch.setattr(gateway_module, "DynamicClient", lambda api_client: None)  # its discovery: not under test
    gateway = KubeGateway(load_api_client(apiserver.kubeconfig(tmp_path)))
    with pytest.raises(WriteRefused, match=r"^status of serving/chat: 429 Too Many Requests$"):
        gateway.patch_status("serving", "chat", {"replicas": 1})
