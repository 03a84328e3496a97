"""spec.networkPolicy: one NetworkPolicy per LLMDeployment that lets only the named clients
(and the operator) reach Triton's inference ports, and only the named scrapers its metrics
port, on every revision's serving pods. Build and prepare Jobs are not selected: they need no
ingress, and their egress (downloads) is left to the namespace's policies."""

from __future__ import annotations

from typing import Any

from llmfleet.api import NetworkPeer, NetworkPolicySpec
from llmfleet.render import layout

API_VERSION = "networking.k8s.io/v1"
COMPONENT = "network-policy"
# Set by the apiserver on every namespace (Kubernetes >= 1.22).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _peer(peer: NetworkPeer) -> dict[str, Any]:
    return {**({"namespaceSelector": {"matchLabels": dict(peer.namespace_selector.match_labels)}}
               if peer.namespace_selector is not None else {}),
            **({"podSelector": {"matchLabels": dict(peer.pod_selector.match_labels)}}
               if peer.pod_selector is not None else {})}


def _ports(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def network_policy(metadata: dict[str, Any], serving_pod_labels: dict[str, str], policy: NetworkPolicySpec,
                   operator_namespace: str | None, group_pod_labels: dict[str, str] | None = None,
                   picker_pod_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Ingress to the serving pods: inference ports from the clients (default: the namespace's
    own pods) and the operator's namespace, the metrics port from the scrapers and, with
    `picker_pod_labels` (an InferencePool), the endpoint pickers, which score pods by their
    metrics; with `group_pod_labels` (replicas spanning nodes) any port from those pods, the
    group's ranks (MPI's daemons and NCCL connect back to the leader on ports of their choosing)."""
    clients = [_peer(peer) for peer in policy.clients] if policy.clients is not None else [{"podSelector": {}}]
    scrapers = [_peer(peer) for peer in policy.metrics_scrapers]
    if picker_pod_labels is not None:
        scrapers.append({"podSelector": {"matchLabels": picker_pod_labels}})
    if operator_namespace is not None:
        clients.append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}}})
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": serving_pod_labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                # An ingress rule with no peers admits every source: `clients: []` and no
                # operator namespace means nobody may send requests, so no rule at all.
                *([{"from": clients, "ports": _ports(layout.HTTP_PORT, layout.GRPC_PORT)}] if clients else []),
                {"from": scrapers, "ports": _ports(layout.METRICS_PORT)},
                *([{"from": [{"podSelector": {"matchLabels": group_pod_labels}}]}] if group_pod_labels else []),
            ],
        },
    }
