"""Prometheus for the sandbox: discovers pods through the sandbox apiserver.

Discovery goes through `poddiscovery` (HTTP SD with kubernetes SD's labels),
because Debian's Prometheus is built without kubernetes_sd_configs.

A pod opts in to scraping with the conventional annotations:
  prometheus.io/scrape: "true"    (required)
  prometheus.io/port: "8002"      (defaults to each declared container port)
  prometheus.io/path: "/metrics"  (default /metrics)
Targets carry `namespace`, `pod`, `node` and every pod label as labels.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from llmfleet_sandbox.config import SandboxConfig

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
        "scrape_configs": [{
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


def argv(config: SandboxConfig) -> list[str]:
    config_file = config.state_dir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(scrape_config(config), sort_keys=False))
    return [
        find_binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={config.state_dir / 'prometheus-data'}",
        # Pods reach this address: no --web.enable-lifecycle, so none can stop or reload it.
        f"--web.listen-address={config.prometheus_ip}:{config.ports.prometheus}",
        "--storage.tsdb.retention.time=1d",
    ]
