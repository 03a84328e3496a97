"""`spec.networkPolicy`: which pods may reach the serving pods, by label selectors."""

import re
from typing import Annotated

from pydantic import Field

from llmfleet.api.base import ApiModel, CelRule


# Kubernetes label syntax: an optional DNS-subdomain prefix and '/', then a name of up to 63
# characters; values up to 63 characters, possibly empty.
# ('[.]', not an escaped dot: the pattern is also a CEL string literal, where '\.' is no escape.)
LABEL_KEY_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
MAX_LABEL_KEY_LENGTH = 253 + 1 + 63
MAX_LABEL_VALUE_LENGTH = 63


def _valid_label(key: str, value: str) -> bool:
    return (len(key) <= MAX_LABEL_KEY_LENGTH and re.match(LABEL_KEY_PATTERN, key) is not None
            and len(value) <= MAX_LABEL_VALUE_LENGTH and re.match(LABEL_VALUE_PATTERN, value) is not None)


class LabelSelector(ApiModel):
    """Objects whose labels include all of these; empty selects every one."""

    match_labels: dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE_LENGTH)]] = Field(
        default_factory=dict, max_length=16, description="Labels the objects must carry, key: value."
    )

    cel_rules = (
        CelRule(
            rule=f"!has(self.matchLabels) || self.matchLabels.all(k, size(k) <= {MAX_LABEL_KEY_LENGTH} && "
            f"k.matches('{LABEL_KEY_PATTERN}') && size(self.matchLabels[k]) <= {MAX_LABEL_VALUE_LENGTH} && "
            f"self.matchLabels[k].matches('{LABEL_VALUE_PATTERN}'))",
            message="spec.networkPolicy: matchLabels keys and values must be Kubernetes labels, e.g. "
            "kubernetes.io/metadata.name: gateways (values of up to 63 letters, digits, '-', '_', '.')",
            holds=lambda m: all(_valid_label(key, value) for key, value in m.match_labels.items()),
            field_path=".matchLabels",
        ),
    )


class NetworkPeer(ApiModel):
    """Pods let in, as a NetworkPolicy peer: namespaceSelector alone, every pod of the matching
    namespaces; podSelector alone, the matching pods of the LLMDeployment's namespace; both, the
    matching pods of the matching namespaces."""

    namespace_selector: LabelSelector | None = Field(default=None, description="Namespaces, by label.")
    pod_selector: LabelSelector | None = Field(default=None, description="Pods, by label.")

    cel_rules = (
        CelRule(
            rule="has(self.namespaceSelector) || has(self.podSelector)",
            message="spec.networkPolicy: each peer needs namespaceSelector, podSelector or both, e.g. "
            "namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}",
            holds=lambda m: m.namespace_selector is not None or m.pod_selector is not None,
        ),
    )


class NetworkPolicySpec(ApiModel):
    """Who may reach the serving pods; everyone else is refused by the cluster's network plugin
    (it must enforce NetworkPolicy)."""

    clients: list[NetworkPeer] | None = Field(
        default=None,
        max_length=16,
        description="Who may send inference requests (Triton's HTTP and gRPC ports): the Gateway's "
        "or the clients' pods. Omit for every pod of the LLMDeployment's namespace; [] for none. The "
        "operator's own namespace is always let in (it sends the canary's golden prompts).",
    )
    metrics_scrapers: list[NetworkPeer] = Field(
        min_length=1,
        max_length=16,
        description="Who may read Triton's metrics port: the Prometheus the operator reads, e.g. "
        "namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}. Autoscaling "
        "and canary analysis need it.",
    )
