"""`sandbox up --prometheus-auth`: which modes there are, where Prometheus and its bearer-token
proxy listen, what `sandbox env` and `sandbox demo` hand out, and the proxy's HTTP handling.
The proxy's reviews against a real apiserver are e2e/test_prometheus_bearer_token.py's."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import asdict

import pytest

from llmfleet import cli
from llmfleet_sandbox import certs, manager, prometheus, rbacproxy
from llmfleet_sandbox.cli import _config
from llmfleet_sandbox.config import (
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_READER,
    PROMETHEUS_SERVICE,
    Ports,
    SandboxConfig,
)


def test_bearer_is_a_mode_and_an_unknown_one_is_refused_naming_the_modes(tmp_path):
    assert SandboxConfig(state_dir=tmp_path, prometheus_auth="bearer").prometheus_auth == "bearer"
    with pytest.raises(ValueError, match="prometheus_auth must be one of none, basic, bearer, got 'oauth'"):
        SandboxConfig(state_dir=tmp_path, prometheus_auth="oauth")


def test_the_command_line_takes_bearer_and_refuses_another_mode(tmp_path, capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["sandbox", "--state-dir", str(tmp_path), "up", "--prometheus-auth", "bearer"])
    assert _config(args).prometheus_auth == "bearer"
    with pytest.raises(SystemExit):
        parser.parse_args(["sandbox", "up", "--prometheus-auth", "token"])
    assert "invalid choice: 'token' (choose from 'none', 'basic', 'bearer')" in capsys.readouterr().err


def test_behind_the_proxy_prometheus_listens_on_loopback_and_the_proxy_at_its_url(tmp_path):
    none, basic, bearer = (SandboxConfig(state_dir=tmp_path, instance=1, prometheus_auth=mode)
                           for mode in ("none", "basic", "bearer"))
    assert (none.prometheus_url, basic.prometheus_url, bearer.prometheus_url) == (
        "http://10.245.0.1:19190", "https://10.245.0.1:19190", "https://10.245.0.1:19190")
    assert none.prometheus_listen_address == basic.prometheus_listen_address == ("10.245.0.1", 19190)
    assert bearer.prometheus_listen_address == ("127.0.0.1", 19192)
    assert manager.components(bearer) == (*manager.components(none)[:-1], "prometheus-proxy", "object-store")
    assert "prometheus-proxy" not in manager.components(basic)


def test_a_settings_file_from_before_the_upstream_port_gets_its_instances(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, instance=2, prometheus_auth="bearer")
    data = json.loads(json.dumps(config.to_dict()))
    del data["ports"]["prometheus_upstream"]
    assert SandboxConfig.from_dict(data).ports == config.ports == Ports.for_instance(2)
    assert SandboxConfig.from_dict(data).ports.prometheus_upstream == 19292


def test_sandbox_env_exports_the_url_ca_and_the_readers_token_file(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, prometheus_auth="bearer")
    assert prometheus.client_environment(config) == {
        "LLMFLEET_PROMETHEUS_URL": "https://10.244.0.1:19090",
        "LLMFLEET_PROMETHEUS_CA_FILE": str(tmp_path / "pki" / "ca.crt"),
        "LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE": str(tmp_path / "prometheus-proxy" / "token")}


def test_the_proxy_reviews_exactly_what_the_readers_role_grants(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, prometheus_auth="bearer", prometheus_ip="127.0.0.1")
    certs.generate_pki(config.pki_dir, ["127.0.0.1"], [])
    argv = rbacproxy.argv(config, "python3")
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert (flags["--namespace"], flags["--service"]) == (PROMETHEUS_NAMESPACE, PROMETHEUS_SERVICE)
    assert flags["--listen"] == "127.0.0.1:19090" and flags["--upstream"] == "http://127.0.0.1:19092"
    kinds = {(obj["kind"], obj["metadata"]["name"]): obj for obj in rbacproxy.access_manifests()}
    role = kinds[("Role", PROMETHEUS_READER)]
    assert role["metadata"]["namespace"] == PROMETHEUS_NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["services/proxy"],
                              "resourceNames": [PROMETHEUS_SERVICE], "verbs": ["get", "create"]}]
    assert {rbacproxy.VERBS["GET"], rbacproxy.VERBS["POST"]} == set(role["rules"][0]["verbs"])
    delegator = kinds[("ClusterRoleBinding", certs.PROMETHEUS_PROXY.common_name)]
    assert delegator["roleRef"]["name"] == "system:auth-delegator"
    # Its own identity for the reviews, not the admin's.
    kubeconfig = rbacproxy.kubeconfig(config).read_text()
    assert "prometheus-proxy.crt" in kubeconfig and "admin" not in kubeconfig


def test_demo_binds_the_operators_service_account_to_the_reader_role_and_mounts_the_ca(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, prometheus_auth="bearer")
    certs.generate_pki(config.pki_dir, ["127.0.0.1"], [])
    objects = manager.operator_prerequisites(config, "llmfleet-system", release="fleet")
    kinds = [obj["kind"] for obj in objects]
    assert kinds == ["Namespace", "RoleBinding", "ConfigMap"]
    binding = objects[1]
    assert binding["metadata"]["namespace"] == PROMETHEUS_NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fleet-operator", "namespace": "llmfleet-system"}]
    values = manager.operator_chart_values(config)
    assert "prometheus.bearerToken.serviceAccountToken=true" in values
    assert f"prometheus.tls.ca.name={manager.PROMETHEUS_CA_CONFIG_MAP}" in values


@pytest.mark.parametrize(("header", "token"), [("Bearer abc.def", "abc.def"), ("bearer  abc", "abc"),
                                               ("Bearer ", None), ("Basic dXNlcjpwdw==", None), (None, None)])
def test_only_a_bearer_token_is_taken(header, token):
    assert rbacproxy.bearer_token(header) == token


class _TokenNamedReviewer:
    """Allows the token `reader`, forbids `stranger`, refuses anything else: the proxy's HTTP
    handling alone (the real reviews need an apiserver: e2e)."""

    def decide(self, authorization, method):
        token = rbacproxy.bearer_token(authorization)
        if token == "reader":
            return rbacproxy.Decision(200, "reader")
        if token == "stranger":
            return rbacproxy.Decision(403, f"Forbidden (user=stranger, verb={rbacproxy.VERBS[method]})")
        return rbacproxy.Decision(401, "Unauthorized")


@pytest.fixture
def proxied(tmp_path):
    """The proxy over TLS in front of an upstream that records what reaches it."""
    seen = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, dict(self.headers), body))
            answer = json.dumps({"status": "success", "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    certs.generate_pki(tmp_path / "pki", ["127.0.0.1"], [])
    certificate, key = certs.issue_serving_certificate(tmp_path / "pki", tmp_path / "tls", "prometheus",
                                                       ["127.0.0.1"], [])
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certificate, key)
    proxy = rbacproxy.RbacProxy(("127.0.0.1", 0), f"http://127.0.0.1:{upstream.server_address[1]}",
                                _TokenNamedReviewer(), tls)
    for server in (upstream, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    context = ssl.create_default_context(cafile=str(tmp_path / "pki" / "ca.crt"))

    def request(token=None, method="GET", data=None):
        req = urllib.request.Request(f"https://127.0.0.1:{proxy.server_address[1]}/api/v1/query?query=up",
                                     data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, context=context, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    yield request, seen
    for server in (proxy, upstream):
        server.shutdown()
        server.server_close()


def test_the_proxy_answers_401_and_403_itself_and_passes_the_rest_without_the_token(proxied):
    request, seen = proxied
    status, headers, body = request()
    assert (status, body) == (401, b"Unauthorized\n") and headers["WWW-Authenticate"].startswith("Bearer")
    assert request("stranger")[0:3:2] == (403, b"Forbidden (user=stranger, verb=get)\n")
    assert seen == []
    status, headers, body = request("reader", "POST", b"query=up")
    assert (status, json.loads(body)) == (200, {"status": "success", "path": "/api/v1/query?query=up"})
    method, path, upstream_headers, upstream_body = seen[-1]
    assert (method, upstream_body) == ("POST", b"query=up")
    assert "Authorization" not in upstream_headers, "the token went on to Prometheus"


def test_ports_of_every_instance_stay_apart_with_the_upstream_port():
    used = [port for instance in range(10) for port in asdict(Ports.for_instance(instance)).values()]
    assert len(used) == len(set(used))
