"""Prometheus for the sandbox: discovers pods through the sandbox apiserver.

Discovery goes through `poddiscovery` (HTTP SD with kubernetes SD's labels),
because Debian's Prometheus is built without kubernetes_sd_configs.

A pod opts in to scraping with the conventional annotations:
  prometheus.io/scrape: "true"    (required)
  prometheus.io/port: "8002"      (defaults to each declared container port)
  prometheus.io/path: "/metrics"  (default /metrics)
Targets carry `namespace`, `pod`, `node` and every pod label as labels.

The chart's operator PodMonitor and PrometheusRule are applied as the Prometheus Operator would:
a job for the operator pods' `metrics` port (honor_labels), and the chart's rules file.

Pods are scraped every `scrape_interval_seconds` (15 s, the chart's PodMonitor default), or at
the interval `llmfleet sandbox scrape-interval` set for their namespace, as a PodMonitor with an
interval of its own would. With `prometheus_auth="basic"` Prometheus serves HTTPS with a
certificate from the sandbox's CA and asks for basic auth (its own web config), as a Prometheus
behind authentication does. With `prometheus_auth="bearer"` it listens on loopback alone, behind
the sandbox's kube-rbac-proxy (`rbacproxy`), which serves HTTPS at its address and asks for a
Kubernetes token allowed to read it. `client_environment` says how to reach it.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import yaml

from llmfleet_sandbox import certs
from llmfleet_sandbox.controlplane import REPO_ROOT
from llmfleet_sandbox.config import PROMETHEUS_USERNAME, SandboxConfig

NAMESPACE_INTERVALS_FILE = "scrape-intervals.json"
# The chart's generated rules (llmfleet/render/monitoring.py), loaded as the Prometheus Operator
# loads its PrometheusRule.
CHART_RULES = REPO_ROOT / "charts" / "llmfleet" / "files" / "prometheus-rules.yaml"

PROMETHEUS_BINARY = "prometheus"


def find_binary() -> str:
    path = shutil.which(PROMETHEUS_BINARY) or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if path is None:
        raise RuntimeError("prometheus not found: install it with `apt-get install -y prometheus` "
                           "(`make sandbox` does this)")
    return path


def scrape_config(config: SandboxConfig) -> dict:
    interval = f"{config.scrape_interval_seconds}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": interval},
        # What the Prometheus Operator makes of the chart's PrometheusRule (prometheusRule.enabled).
        "rule_files": [str(CHART_RULES)] if CHART_RULES.exists() else [],
        "scrape_configs": [_operator_job(config), {
            "job_name": "kubernetes-pods",
            "http_sd_configs": [{"url": config.pod_discovery_url, "refresh_interval": "2s"}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                 "action": "keep", "regex": "true"},
                {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "drop",
                 "regex": "Succeeded|Failed"},
                {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                 "action": "replace", "target_label": "__metrics_path__", "regex": "(.+)"},
                {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                 "action": "replace", "regex": "([^:]+)(?::\\d+)?;(\\d+)",
                 "replacement": "$1:$2", "target_label": "__address__"},
                {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
            ],
        }],
    }


def _operator_job(config: SandboxConfig) -> dict:
    """What the Prometheus Operator makes of the chart's operator PodMonitor (podMonitor.enabled):
    the operator pods' `metrics` port, their gauges' own namespace label kept (honorLabels)."""
    return {
        "job_name": "llmfleet-operator",
        "honor_labels": True,
        "http_sd_configs": [{"url": config.pod_discovery_url, "refresh_interval": "2s"}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                               "__meta_kubernetes_pod_container_port_name"], "action": "keep", "regex": "llmfleet;metrics"},
            {"source_labels": ["__meta_kubernetes_pod_phase"], "action": "drop", "regex": "Succeeded|Failed"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ],
    }


def argv(config: SandboxConfig) -> list[str]:
    config_file = config.state_dir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(scrape_config(config), sort_keys=False))
    web = [f"--web.config.file={write_web_config(config)}"] if config.prometheus_auth == "basic" else []
    host, port = config.prometheus_listen_address
    return [
        find_binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={config.state_dir / 'prometheus-data'}",
        # Pods reach this address (or its proxy's): no --web.enable-lifecycle, so none can stop
        # or reload it.
        f"--web.listen-address={host}:{port}",
        "--storage.tsdb.retention.time=1d",
        *web,
    ]


def write_web_config(config: SandboxConfig) -> Path:
    """Prometheus' web config for TLS and basic auth: a serving certificate from the sandbox's CA
    (for its address and PROMETHEUS_SERVER_NAME), one user whose password is kept across
    restarts in `prometheus_password_file`, stored as the bcrypt hash Prometheus wants."""
    import bcrypt  # the sandbox extra; only this option needs it

    directory = config.prometheus_password_file.parent
    directory.mkdir(parents=True, exist_ok=True)
    if not config.prometheus_password_file.exists():
        config.prometheus_password_file.write_text(secrets.token_urlsafe(24))
        config.prometheus_password_file.chmod(0o600)
    certificate, key = certs.issue_serving_certificate(
        config.pki_dir, directory / "prometheus", "prometheus", [config.prometheus_ip],
        [config.prometheus_server_name])
    password = config.prometheus_password_file.read_text().strip().encode()
    web = {"tls_server_config": {"cert_file": str(certificate), "key_file": str(key)},
           "basic_auth_users": {PROMETHEUS_USERNAME: bcrypt.hashpw(password, bcrypt.gensalt(rounds=10)).decode()}}
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump(web))
    path.chmod(0o600)
    return path


def client_environment(config: SandboxConfig) -> dict[str, str]:
    """The LLMFLEET_PROMETHEUS_* variables `llmfleet` (operator, fleet status) reads Prometheus with."""
    env = {"LLMFLEET_PROMETHEUS_URL": config.prometheus_url}
    if config.prometheus_auth == "basic":
        env.update(LLMFLEET_PROMETHEUS_CA_FILE=str(config.pki_dir / "ca.crt"),
                   LLMFLEET_PROMETHEUS_BASIC_AUTH_USERNAME=PROMETHEUS_USERNAME,
                   LLMFLEET_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE=str(config.prometheus_password_file))
    if config.prometheus_auth == "bearer":
        env.update(LLMFLEET_PROMETHEUS_CA_FILE=str(config.pki_dir / "ca.crt"),
                   LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE=str(config.prometheus_token_file))
    return env


def http_get(env: Mapping[str, str], path: str, params: Mapping[str, str] | None = None,
             timeout_seconds: float = 10) -> bytes:
    """GET a Prometheus path with what `client_environment` put in `env` (tests and benchmarks
    read Prometheus this way, as a user with the sandbox's environment would)."""
    url = env["LLMFLEET_PROMETHEUS_URL"] + path + (f"?{urllib.parse.urlencode(params)}" if params else "")
    request = urllib.request.Request(url)
    context = None
    if "LLMFLEET_PROMETHEUS_CA_FILE" in env:
        context = ssl.create_default_context(cafile=env["LLMFLEET_PROMETHEUS_CA_FILE"])
    if "LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE" in env:
        token = Path(env["LLMFLEET_PROMETHEUS_BEARER_TOKEN_FILE"]).read_text().strip()
        request.add_header("Authorization", f"Bearer {token}")
    elif "LLMFLEET_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE" in env:
        password = Path(env["LLMFLEET_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"]).read_text().strip()
        token = base64.b64encode(f"{env['LLMFLEET_PROMETHEUS_BASIC_AUTH_USERNAME']}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=timeout_seconds, context=context) as response:
        return response.read()


def query(env: Mapping[str, str], promql: str) -> list[dict]:
    """An instant query's result list."""
    return json.loads(http_get(env, "/api/v1/query", {"query": promql}))["data"]["result"]


def wait_until_ready(config: SandboxConfig, timeout_seconds: float) -> None:
    env = client_environment(config)
    deadline, last_error = time.monotonic() + timeout_seconds, "no answer"
    while time.monotonic() < deadline:
        try:
            http_get(env, "/-/ready", timeout_seconds=2)
            return
        except (urllib.error.URLError, OSError) as error:
            last_error = str(error)
        time.sleep(0.2)
    raise TimeoutError(f"prometheus not ready at {config.prometheus_url} after {timeout_seconds:.0f} s: {last_error}")


def namespace_scrape_intervals(state_dir: Path) -> dict[str, int]:
    """Seconds by namespace, for the namespaces scraped at an interval of their own."""
    path = state_dir / NAMESPACE_INTERVALS_FILE
    try:
        return {str(k): int(v) for k, v in json.loads(path.read_text()).items()}
    except (FileNotFoundError, ValueError, AttributeError):
        return {}


def set_namespace_scrape_interval(state_dir: Path, namespace: str, seconds: int | None) -> None:
    """Scrape the namespace's pods every `seconds`; None: at the sandbox's interval again."""
    intervals = namespace_scrape_intervals(state_dir)
    if seconds is None:
        intervals.pop(namespace, None)
    else:
        intervals[namespace] = seconds
    # Written whole, then renamed: pod discovery reads it on every request.
    staging = state_dir / f"{NAMESPACE_INTERVALS_FILE}.new"
    staging.write_text(json.dumps(intervals))
    staging.replace(state_dir / NAMESPACE_INTERVALS_FILE)
