"""NetworkPolicy ingress as a CNI policy plugin enforces it: from the policies, pods and
namespaces the apiserver holds, what each pod admits, and that as an nftables ruleset for the
pod's own network namespace. Pure: objects in, rules and text out (`policyengine` watches the
apiserver and writes the rulesets).

The semantics are networking.k8s.io/v1's
(https://kubernetes.io/docs/concepts/services-networking/network-policies/):
- a pod selected by a policy whose policyTypes include Ingress is isolated for ingress (absent
  policyTypes: Ingress, plus Egress if the policy has egress rules); other pods admit anything;
- an isolated pod admits the union of the ingress rules of the policies that select it; a rule
  admits a connection from any of its `from` peers (none listed: from anywhere) to any of its
  ports (none listed: every port and protocol);
- a peer's podSelector alone means pods of the policy's namespace, namespaceSelector alone every
  pod of the matching namespaces, both the matching pods of the matching namespaces; an ipBlock
  is its cidr less its `except` ranges;
- a port is a number (with endPort, a range) or the name of a port of the selected pod's
  containers, with its protocol (TCP unless given);
- always admitted: replies to the pod's own connections, traffic from the pod itself and from
  its node ("traffic to and from the node where a Pod is running is always allowed").
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

# The nftables table the engine owns in every pod's network namespace.
TABLE = "llmfleet_network_policy"
INGRESS = "Ingress"
EGRESS = "Egress"
# A pod whose phase is one of these runs nothing: its IP is no longer its (and may be reused).
FINISHED_PHASES = ("Succeeded", "Failed")
ALL_PORTS = (1, 65535)


@dataclass(frozen=True)
class Source:
    """Addresses a rule admits: a CIDR (a peer pod's IP is a /32 or /128) less `excepts`."""

    cidr: str
    excepts: tuple[str, ...] = ()


@dataclass(frozen=True)
class PortRange:
    protocol: str  # nftables' name: tcp, udp, sctp
    first: int
    last: int


@dataclass(frozen=True)
class Allow:
    """One ingress rule, resolved: None admits any source (any port); an empty tuple, none."""

    sources: tuple[Source, ...] | None
    ports: tuple[PortRange, ...] | None


class PolicyError(ValueError):
    pass


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: every matchLabels pair and every matchExpressions requirement
    holds; the empty selector selects everything."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for requirement in selector.get("matchExpressions") or []:
        key, operator, values = requirement["key"], requirement["operator"], requirement.get("values") or []
        if operator == "In":
            held = key in labels and labels[key] in values
        elif operator == "NotIn":
            held = key not in labels or labels[key] not in values
        elif operator == "Exists":
            held = key in labels
        elif operator == "DoesNotExist":
            held = key not in labels
        else:
            raise PolicyError(f"matchExpressions operator must be In, NotIn, Exists or DoesNotExist, got {operator!r}")
        if not held:
            return False
    return True


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


def policy_types(policy: dict[str, Any]) -> list[str]:
    spec = policy["spec"]
    if spec.get("policyTypes"):
        return spec["policyTypes"]
    return [INGRESS, *([EGRESS] if spec.get("egress") else [])]


def pod_ip(pod: dict[str, Any]) -> str | None:
    """The pod's address as a policy peer: None for a pod without one, a finished pod or a
    host-network pod (whose address is its node's)."""
    status = pod.get("status") or {}
    if pod["spec"].get("hostNetwork") or status.get("phase") in FINISHED_PHASES:
        return None
    return status.get("podIP") or None


def _peer_sources(peer: dict[str, Any], policy_namespace: str, pods: list[dict[str, Any]],
                  namespace_labels: dict[str, dict[str, str]]) -> list[Source]:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        return [Source(block["cidr"], tuple(block.get("except") or ()))]
    pod_selector, namespace_selector = peer.get("podSelector"), peer.get("namespaceSelector")
    if pod_selector is None and namespace_selector is None:
        raise PolicyError("a NetworkPolicyPeer needs podSelector, namespaceSelector or ipBlock")
    sources = []
    for pod in pods:
        namespace = pod["metadata"]["namespace"]
        if namespace_selector is None:
            in_namespace = namespace == policy_namespace
        else:
            in_namespace = namespace in namespace_labels and selects(namespace_selector, namespace_labels[namespace])
        address = pod_ip(pod)
        if address and in_namespace and selects(pod_selector or {}, _labels(pod)):
            network = ipaddress.ip_network(address)
            sources.append(Source(str(network)))
    return sources


def _named_ports(pod: dict[str, Any]) -> dict[tuple[str, str], int]:
    return {(port["name"], port.get("protocol", "TCP")): port["containerPort"]
            for container in pod["spec"].get("containers") or [] for port in container.get("ports") or []
            if port.get("name")}


def _port_ranges(ports: list[dict[str, Any]], pod: dict[str, Any]) -> list[PortRange]:
    named = _named_ports(pod)
    ranges = []
    for port in ports:
        protocol = port.get("protocol", "TCP")
        value = port.get("port")
        if value is None:
            ranges.append(PortRange(protocol.lower(), *ALL_PORTS))
        elif isinstance(value, str) and not value.isdigit():
            if (value, protocol) in named:  # a name this pod does not declare matches nothing here
                ranges.append(PortRange(protocol.lower(), named[(value, protocol)], named[(value, protocol)]))
        else:
            ranges.append(PortRange(protocol.lower(), int(value), int(port.get("endPort") or value)))
    return ranges


def ingress_allows(pod: dict[str, Any], policies: list[dict[str, Any]], pods: list[dict[str, Any]],
                   namespaces: list[dict[str, Any]]) -> tuple[Allow, ...] | None:
    """What `pod` admits: None when no Ingress policy selects it (it admits anything), else
    one Allow per ingress rule of the policies that do (none: it admits nothing more than what
    is always allowed)."""
    namespace = pod["metadata"]["namespace"]
    selecting = [policy for policy in policies
                 if policy["metadata"]["namespace"] == namespace and INGRESS in policy_types(policy)
                 and selects(policy["spec"].get("podSelector") or {}, _labels(pod))]
    if not selecting:
        return None
    namespace_labels = {ns["metadata"]["name"]: _labels(ns) for ns in namespaces}
    allows = []
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from") or []
            sources = None if not peers else tuple(dict.fromkeys(
                source for peer in peers
                for source in _peer_sources(peer, namespace, pods, namespace_labels)))
            ports = tuple(dict.fromkeys(_port_ranges(rule["ports"], pod))) if rule.get("ports") else None
            allows.append(Allow(sources, ports))
    return tuple(allows)


# -- nftables -------------------------------------------------------------------------------

def _address_family(cidr: str) -> str:
    return "ip" if ipaddress.ip_network(cidr, strict=False).version == 4 else "ip6"


def _set(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _source_matches(sources: tuple[Source, ...] | None) -> list[str]:
    """nftables matches, any of which admits the sources: one per address family for plain
    CIDRs, one per CIDR with exceptions."""
    if sources is None:
        return [""]
    matches = []
    for family in ("ip", "ip6"):
        plain = sorted({s.cidr for s in sources if not s.excepts and _address_family(s.cidr) == family},
                       key=lambda cidr: ipaddress.ip_network(cidr, strict=False))
        if plain:
            matches.append(f"{family} saddr {_set(plain)} ")
    for source in sources:
        if source.excepts:
            family = _address_family(source.cidr)
            matches.append(f"{family} saddr {source.cidr} {family} saddr != {{ {', '.join(source.excepts)} }} ")
    return matches


def _port_matches(ports: tuple[PortRange, ...] | None) -> list[str]:
    if ports is None:
        return [""]
    matches = []
    for protocol in sorted({p.protocol for p in ports}):
        ranges = sorted({(p.first, p.last) for p in ports if p.protocol == protocol})
        if ALL_PORTS in ranges:
            matches.append(f"meta l4proto {protocol} ")
        else:
            items = [str(first) if first == last else f"{first}-{last}" for first, last in ranges]
            matches.append(f"meta l4proto {protocol} th dport {_set(items)} ")
    return matches


def nft_script(allows: tuple[Allow, ...] | None, node_ips: list[str]) -> str:
    """An `nft -f` script that replaces the engine's table in one transaction: with `allows`
    None, removes it (the pod admits anything); else an input chain that drops whatever
    neither the always-allowed traffic nor an Allow admits."""
    script = [f"table inet {TABLE}", f"delete table inet {TABLE}"]
    if allows is None:
        return "\n".join(script) + "\n"
    rules = ["iif lo accept",  # the pod's own traffic: a pod cannot block access to itself
             "ct state established,related accept",
             *(f"{_address_family(ip)} saddr {ip} accept" for ip in node_ips)]
    for allow in allows:
        rules += [f"{source}{port}accept" for source in _source_matches(allow.sources)
                  for port in _port_matches(allow.ports)]
    script += [f"table inet {TABLE} {{", "  chain ingress {",
               "    type filter hook input priority filter; policy drop;",
               *(f"    {rule}" for rule in rules), "  }", "}"]
    return "\n".join(script) + "\n"
