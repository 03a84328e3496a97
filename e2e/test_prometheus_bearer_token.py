"""Prometheus behind Kubernetes bearer tokens, as OpenShift's Thanos querier or kube-rbac-proxy
serve it: `sandbox up --prometheus-auth bearer`. The session's sandbox asks for basic auth, so
these tests start a small sandbox of their own beside it (one GPU node, about 15 s) and take it
down again, checking that nothing of the proxy is left.

The proxy's decisions are the sandbox apiserver's: TokenReview for who a token is, a
SubjectAccessReview of get (POST: create) on services/proxy `prometheus` in namespace
`monitoring` for whether it may read. A pod with the chart's kind of credential (its own
projected ServiceAccount token) reads through it once bound, and the operator's metrics client
reads real scraped series through it and names a wrong token."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import LLMFLEET, Sandbox, _environment, _state_environment, spare_instance, wait_for
from llmfleet.autoscale.snapshot import MetricsFailure
from llmfleet.metrics.cadence import CadenceSource
from llmfleet.metrics.connection import PrometheusConnection
from llmfleet.metrics.prometheus import PrometheusMetrics
from llmfleet.render.layout import REQUEST_GAUGE, TENSORRT_LLM_MODEL
from llmfleet_sandbox import prometheus
from llmfleet_sandbox.config import PROMETHEUS_NAMESPACE, PROMETHEUS_READER
from llmfleet_sandbox.rbacproxy import reader_binding

pytestmark = pytest.mark.after_other_e2e

BEARER_INSTANCE = spare_instance("bearer-token")
SCRAPE_INTERVAL_S = 2
NAMESPACE = "bearer-e2e"
# The exporter pod serves series as a serving pod of LLMDeployment `probe` would, so that the
# operator's own queries find them.
PROBE_DEPLOYMENT = "probe"
WAITING_REQUESTS = 7
EXPORTER_SCRIPT = f"""
import http.server, os, socket, ssl, threading, time, urllib.error, urllib.request
SA = "/var/run/secrets/kubernetes.io/serviceaccount/"
BODY = b'''{REQUEST_GAUGE}{{model="{TENSORRT_LLM_MODEL}",version="1",request_type="waiting"}} {WAITING_REQUESTS}
{REQUEST_GAUGE}{{model="{TENSORRT_LLM_MODEL}",version="1",request_type="active"}} 3
{REQUEST_GAUGE}{{model="{TENSORRT_LLM_MODEL}",version="1",request_type="max"}} 4
'''
class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
threading.Thread(target=http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Metrics).serve_forever,
                 daemon=True).start()
context = ssl.create_default_context(cafile=SA + "ca.crt")
while True:
    token = open(SA + "token").read().strip()
    request = urllib.request.Request(os.environ["PROMETHEUS_URL"] + "/api/v1/query?query=up",
                                     headers={{"Authorization": "Bearer " + token}})
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except OSError as error:
        status = repr(error)
    try:
        socket.create_connection((os.environ["PROMETHEUS_HOST"], int(os.environ["UPSTREAM_PORT"])), 2).close()
        direct = "connected"
    except OSError:
        direct = "refused"
    print(f"through the proxy: {{status}}; Prometheus' own port: {{direct}}", flush=True)
    time.sleep(1)
"""


def _cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*LLMFLEET, "sandbox", *args], env=env, capture_output=True, text=True, timeout=timeout)


def _settings(state_dir: Path) -> dict:
    return json.loads((state_dir / "sandbox.json").read_text())["config"]


def _pids(state_dir: Path) -> dict[str, int]:
    return {path.stem: json.loads(path.read_text())["pid"] for path in (state_dir / "pids").glob("*.json")}


def _listeners(port: int) -> set[str]:
    """The addresses a TCP socket listens on at `port`, from the kernel's tables (a connection
    test could not tell: outside the sandbox's ranges, a connection may leave the machine)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                # The kernel writes each 32-bit word of the address in host (little-endian) order.
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                found.add(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw))
    return found


@pytest.fixture(scope="module")
def bearer() -> Sandbox:
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root for per-pod network namespaces")
    state_dir = Path(tempfile.mkdtemp(prefix="llmfleet-e2e-bearer-"))
    env = _state_environment(state_dir, BEARER_INSTANCE)
    started = _cli(env, "up", "--nodes", "1", "--scrape-interval", str(SCRAPE_INTERVAL_S), "--prometheus-auth", "bearer")
    try:
        assert started.returncode == 0, f"sandbox up failed:\n{started.stdout}\n{started.stderr}"
        yield Sandbox(state_dir, _environment(state_dir, BEARER_INSTANCE))
    finally:
        # Idempotent: the last test takes it down itself and checks what is left.
        _cli(env, "down", "--purge")


@pytest.fixture(scope="module")
def exporter(bearer) -> dict:
    """A pod of its own ServiceAccount, not yet allowed to read Prometheus, that serves the series
    of a serving pod of `probe` and queries Prometheus through the proxy every second."""
    settings = _settings(bearer.state_dir)
    url = urllib.parse.urlsplit(bearer.prometheus_url)
    bearer.kubectl("create", "namespace", NAMESPACE)
    bearer.kubectl("create", "serviceaccount", "exporter", "-n", NAMESPACE)
    bearer.apply([{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "exporter", "namespace": NAMESPACE,
                     "labels": {"llmfleet.io/deployment": PROBE_DEPLOYMENT},
                     "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}},
        "spec": {"serviceAccountName": "exporter", "containers": [{
            "name": "exporter", "image": "python:3.11", "command": ["python3", "-c", EXPORTER_SCRIPT],
            "ports": [{"containerPort": 8080}],
            "env": [{"name": "PROMETHEUS_URL", "value": bearer.prometheus_url},
                    {"name": "PROMETHEUS_HOST", "value": url.hostname},
                    {"name": "UPSTREAM_PORT", "value": str(settings["ports"]["prometheus_upstream"])}]}]},
    }], namespace=NAMESPACE)
    bearer.kubectl("wait", "--for=condition=Ready", "pod/exporter", "-n", NAMESPACE, "--timeout=120s", timeout=150)
    return bearer.kubectl_json("get", "pod", "exporter", "-n", NAMESPACE)


def _request(env: dict[str, str], authorization: str | None, method: str = "GET",
             path: str = "/api/v1/query", query: str = "up") -> tuple[int, str]:
    """(status, body) of one request to the sandbox's Prometheus URL, TLS verified by its CA."""
    context = ssl.create_default_context(cafile=env["LLMFLEET_PROMETHEUS_CA_FILE"])
    encoded = urllib.parse.urlencode({"query": query})
    url = env["LLMFLEET_PROMETHEUS_URL"] + path
    data = encoded.encode() if method == "POST" else None
    request = urllib.request.Request(url if data else f"{url}?{encoded}", data=data, method=method)
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _token(bearer: Sandbox, namespace: str, service_account: str) -> str:
    return bearer.kubectl("create", "token", service_account, "-n", namespace).strip()


def _reader_token(bearer: Sandbox) -> str:
    return Path(bearer.env["LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE"]).read_text().strip()


def test_sandbox_env_says_how_to_reach_prometheus_with_a_token_over_tls(bearer):
    env = bearer.env
    settings = _settings(bearer.state_dir)
    assert env["LLMFLEET_PROMETHEUS_URL"] == f"https://{settings['prometheus_ip']}:{settings['ports']['prometheus']}"
    assert Path(env["LLMFLEET_PROMETHEUS_CA_FILE"]).is_file()
    token_file = Path(env["LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE"])
    assert token_file.stat().st_mode & 0o077 == 0, "the reader's token is readable by others"
    assert "LLMFLEET_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE" not in env
    # The token is the reader ServiceAccount's, as the apiserver sees it.
    payload = _reader_token(bearer).split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{PROMETHEUS_NAMESPACE}:{PROMETHEUS_READER}"


def test_without_a_token_or_with_a_bad_one_the_answer_is_401(bearer):
    reader = _reader_token(bearer)
    header, payload, signature = reader.split(".")
    forged = ".".join((header, payload, signature[:-4] + ("AAAA" if signature[-4:] != "AAAA" else "BBBB")))
    for what, authorization in (("no Authorization", None), ("not a JWT", "Bearer not-a-token"),
                                ("the reader's claims with a wrong signature", f"Bearer {forged}"),
                                ("the reader's token as basic auth", "Basic " + base64.b64encode(
                                    f"{PROMETHEUS_READER}:{reader}".encode()).decode())):
        status, body = _request(bearer.env, authorization)
        assert status == 401, f"{what}: HTTP {status}: {body[:200]}"
        assert '"status":"success"' not in body, what


def test_a_service_account_without_the_permission_is_forbidden_until_a_rolebinding_grants_it(bearer):
    namespace = "bearer-stranger"
    bearer.kubectl("create", "namespace", namespace)
    bearer.kubectl("create", "serviceaccount", "stranger", "-n", namespace)
    token = f"Bearer {_token(bearer, namespace, 'stranger')}"
    status, body = _request(bearer.env, token)
    assert status == 403, body
    assert f"user=system:serviceaccount:{namespace}:stranger" in body and "verb=get" in body, body
    # The recipe docs/sandbox.md gives a user for their own ServiceAccount.
    bearer.kubectl("create", "rolebinding", "stranger-reads-prometheus", "-n", PROMETHEUS_NAMESPACE,
                   f"--role={PROMETHEUS_READER}", f"--serviceaccount={namespace}:stranger")
    wait_for(lambda: _request(bearer.env, token)[0] == 200, 10, "the bound ServiceAccount to read")
    assert _request(bearer.env, token, "POST")[0] == 200, "a POSTed query (verb create) is a read too"
    status, body = _request(bearer.env, token, "DELETE", "/api/v1/admin/tsdb/delete_series", 'up{job="x"}')
    assert status == 403 and "verb=delete" in body, (status, body)


def test_the_reader_token_gets_the_scraped_series(bearer, exporter):
    def answered():
        result = prometheus.query(bearer.env, f'{REQUEST_GAUGE}{{namespace="{NAMESPACE}", request_type="waiting"}}')
        return result if result and result[0]["value"][1] == str(WAITING_REQUESTS) else None

    result = wait_for(answered, 30, "the exporter's series through the proxy")
    assert result[0]["metric"]["pod"] == "exporter"


def test_a_pod_reads_through_the_proxy_with_its_own_token_once_bound_and_never_reaches_prometheus_directly(
        bearer, exporter):
    def lines():
        return bearer.container_log(exporter, "exporter").splitlines()

    wait_for(lambda: any("through the proxy: 403" in line for line in lines()), 30, "the unbound pod's 403")
    bearer.apply([reader_binding(NAMESPACE, "exporter")], namespace=PROMETHEUS_NAMESPACE)
    seen = len(lines())
    wait_for(lambda: any("through the proxy: 200" in line for line in lines()[seen:]), 30,
             "the bound pod's 200 with its projected token")
    assert all(line.endswith("Prometheus' own port: refused") for line in lines() if "through the proxy" in line), \
        lines()[-5:]


def _snapshot(reader: PrometheusMetrics):
    # The probe exports the engine's gauges and no TTFT histogram: any bounds read no p99.
    return reader.snapshot(NAMESPACE, PROBE_DEPLOYMENT, 30, datetime.now(timezone.utc), ttft_bounds_ms=(500,))


def test_the_operators_metrics_client_reads_through_it_and_names_a_wrong_or_unpermitted_token(
        bearer, exporter, tmp_path):
    env = bearer.env

    def metrics(token_file: Path) -> PrometheusMetrics:
        connection = PrometheusConnection(env["LLMFLEET_PROMETHEUS_URL"], bearer_token_file=token_file,
                                          ca_file=Path(env["LLMFLEET_PROMETHEUS_CA_FILE"]))
        connection.validate()
        return PrometheusMetrics(connection)

    reader = metrics(Path(env["LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE"]))

    def observed():
        snapshot = _snapshot(reader)
        return snapshot if snapshot.waiting_requests == WAITING_REQUESTS else None

    snapshot = wait_for(observed, 30, "the operator's snapshot of the probe's series")
    assert snapshot.error is None and snapshot.reporting_pods == 1 and snapshot.batch_utilization == pytest.approx(0.75)
    # The interval, from the spacing of the samples, once there are two.
    cadence = wait_for(lambda: (found := reader.scrape_cadence(NAMESPACE, PROBE_DEPLOYMENT, datetime.now(timezone.utc)))
                       .source == CadenceSource.OBSERVED and found, 30, "the scrape interval from the samples")
    assert cadence.interval_seconds == SCRAPE_INTERVAL_S

    wrong = tmp_path / "wrong-token"
    wrong.write_text(_reader_token(bearer)[:-3] + "xyz")
    bearer.kubectl("create", "serviceaccount", "unpermitted", "-n", NAMESPACE)
    unpermitted = tmp_path / "unpermitted-token"
    unpermitted.write_text(_token(bearer, NAMESPACE, "unpermitted"))
    for token_file, reason, code in ((wrong, MetricsFailure.UNAUTHORIZED, "401"),
                                     (unpermitted, MetricsFailure.FORBIDDEN, "403")):
        failed = _snapshot(metrics(token_file))
        assert failed.error_reason == reason, failed.error
        assert code in failed.error and token_file.read_text() not in failed.error
    assert MetricsFailure.UNAUTHORIZED.value == "PrometheusUnauthorized"
    assert "--prometheus-bearer-token-file" in _snapshot(metrics(wrong)).error


def test_prometheus_itself_listens_on_loopback_alone_behind_the_proxy(bearer):
    settings = _settings(bearer.state_dir)
    host, port, upstream = settings["prometheus_ip"], settings["ports"]["prometheus"], settings["ports"]["prometheus_upstream"]
    assert _listeners(upstream) == {"127.0.0.1"}, "Prometheus listens where more than its proxy reaches it"
    assert _listeners(port) == {host}
    argv = json.loads((bearer.state_dir / "pids" / "prometheus.json").read_text())["argv"]
    assert f"--web.listen-address=127.0.0.1:{upstream}" in argv, argv
    # The proxy's port speaks TLS alone.
    with pytest.raises(OSError):  # the connection closed without an answer
        urllib.request.urlopen(f"http://{host}:{port}/-/ready", timeout=5)


def test_down_leaves_no_proxy_process_port_or_file(bearer):
    settings = _settings(bearer.state_dir)
    pids = _pids(bearer.state_dir)
    assert {"prometheus", "prometheus-proxy"} <= set(pids), pids
    stopped = _cli(_state_environment(bearer.state_dir, BEARER_INSTANCE), "down", "--purge")
    assert stopped.returncode == 0, stopped.stderr
    for name, pid in pids.items():
        alive = Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        assert not alive, f"{name} (pid {pid}) outlived down"
    for port in (settings["ports"]["prometheus"], settings["ports"]["prometheus_upstream"]):
        assert not _listeners(port), f"port {port} still listened on"
    assert not bearer.state_dir.exists()
