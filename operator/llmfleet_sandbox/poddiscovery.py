"""Kubernetes pod discovery for Prometheus, served as HTTP service discovery.

Debian's Prometheus is built without `kubernetes_sd_configs`, so this adapter
watches pods on the sandbox apiserver and serves them on an `http_sd_configs`
endpoint with the same `__meta_kubernetes_pod_*` labels that Prometheus'
kubernetes SD (role: pod) produces: one target per declared container port, or
one port-less target for a pod that declares none. The relabelling rules are
therefore the ones you would write for a real cluster.
Pods listed by `llmfleet sandbox scrape off` (faults.unscraped_pods) are left out, as
when discovery loses a pod: Prometheus ends the series of a target that goes.
Run as `python -m llmfleet_sandbox.poddiscovery --kubeconfig FILE --port N --state-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pathlib import Path

from kubernetes import client, config as kube_config

from llmfleet_sandbox.faults import unscraped_pods
from llmfleet_sandbox.informer import watch_forever
from llmfleet_sandbox.prometheus import namespace_scrape_intervals

PREFIX = "__meta_kubernetes_"


def _label_name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def pod_target_groups(pod: dict) -> list[dict]:
    """The target groups Prometheus' kubernetes SD would give for this pod."""
    metadata, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    pod_ip = status.get("podIP")
    if not pod_ip:
        return []
    labels = {
        f"{PREFIX}namespace": metadata["namespace"],
        f"{PREFIX}pod_name": metadata["name"],
        f"{PREFIX}pod_uid": metadata["uid"],
        f"{PREFIX}pod_ip": pod_ip,
        f"{PREFIX}pod_node_name": spec.get("nodeName", ""),
        f"{PREFIX}pod_phase": status.get("phase", ""),
        f"{PREFIX}pod_ready": next((c["status"].lower() for c in status.get("conditions") or []
                                    if c["type"] == "Ready"), "unknown"),
    }
    for key, value in (metadata.get("labels") or {}).items():
        labels[f"{PREFIX}pod_label_{_label_name(key)}"] = value
        labels[f"{PREFIX}pod_labelpresent_{_label_name(key)}"] = "true"
    for key, value in (metadata.get("annotations") or {}).items():
        labels[f"{PREFIX}pod_annotation_{_label_name(key)}"] = value
        labels[f"{PREFIX}pod_annotationpresent_{_label_name(key)}"] = "true"
    groups = []
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            groups.append({"targets": [f"{pod_ip}:{port['containerPort']}"], "labels": {
                **labels,
                f"{PREFIX}pod_container_name": container["name"],
                f"{PREFIX}pod_container_port_name": port.get("name", ""),
                f"{PREFIX}pod_container_port_number": str(port["containerPort"]),
                f"{PREFIX}pod_container_port_protocol": port.get("protocol", "TCP"),
            }})
    if not groups:
        groups.append({"targets": [pod_ip], "labels": labels})
    return groups


class PodIndex:
    def __init__(self):
        self.lock = threading.Lock()
        self.pods: dict[str, dict] = {}

    def apply(self, event_type: str, pod: dict) -> None:
        with self.lock:
            if event_type == "DELETED":
                self.pods.pop(pod["metadata"]["uid"], None)
            else:
                self.pods[pod["metadata"]["uid"]] = pod

    def reset(self, pods: list[dict]) -> None:
        with self.lock:
            self.pods = {pod["metadata"]["uid"]: pod for pod in pods}

    def target_groups(self, left_out: set[str] = frozenset(),
                      namespace_intervals: dict[str, int] | None = None) -> list[dict]:
        """Every pod's targets but those of the pods named "namespace/name" in `left_out`; the
        pods of a namespace in `namespace_intervals` are scraped every that many seconds."""
        with self.lock:
            pods = list(self.pods.values())
        return [_with_interval(group, (namespace_intervals or {}).get(pod["metadata"]["namespace"]))
                for pod in pods
                if f"{pod['metadata']['namespace']}/{pod['metadata']['name']}" not in left_out
                for group in pod_target_groups(pod)]


def _with_interval(group: dict, seconds: int | None) -> dict:
    """Prometheus reads a target's interval and timeout from these labels (the timeout may not
    exceed the interval)."""
    if seconds is None:
        return group
    return {**group, "labels": {**group["labels"], "__scrape_interval__": f"{seconds}s",
                                "__scrape_timeout__": f"{seconds}s"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True, help="the sandbox's state directory (its faults)")
    args = parser.parse_args(argv)
    kube_config.load_kube_config(args.kubeconfig)
    index = PodIndex()
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(index.target_groups(unscraped_pods(args.state_dir),
                                                  namespace_scrape_intervals(args.state_dir))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    def on_event(event_type: str, objects: list[dict]) -> None:
        if event_type == "RESET":
            index.reset(objects)
        else:
            index.apply(event_type, objects[0])
    threading.Thread(target=watch_forever, args=(client.CoreV1Api().list_pod_for_all_namespaces, on_event, stopping),
                     kwargs={"what": "pod"}, daemon=True).start()

    def stop(signum, frame):
        stopping.set()
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
