"""Pod networking, as a CNI plugin would give it: one network namespace per pod.

Each pod gets a namespace with a veth pair whose host end joins a host-only
bridge, so every pod binds its usual ports (Triton's 8000-8002) without
clashing and its IP is reachable from the host. Service ClusterIPs are made
local to the host (an "AnyIP" route on lo) so the service proxy can listen on
them directly. All of this needs CAP_NET_ADMIN, i.e. root.

Each sandbox instance has its own bridge and subnets (config.Network). The bridge's alias
names the state directory that owns it: a second sandbox of the same instance refuses to
start instead of taking it over, and only the owner removes it. While the bridge is up,
"unreachable" routes of a higher metric cover the pod and Service ranges, so that if the
bridge ever goes, cluster traffic fails on this machine instead of leaving it by the default
route.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

from llmfleet_sandbox.config import Network

NETNS_DIR = Path("/run/netns")
# Above any route the bridge or lo gives these ranges (kernel routes have metric 0).
GUARD_ROUTE_METRIC = 4242


class NetworkSetupError(RuntimeError):
    pass


def require_root() -> None:
    if os.geteuid() != 0:
        raise NetworkSetupError(
            "the sandbox gives every pod its own network namespace, which needs root "
            "(CAP_NET_ADMIN); run `llmfleet sandbox up` as root (e.g. with sudo)"
        )


def require_nft() -> None:
    """The NetworkPolicy engine writes each pod's ingress rules with nft (`policyengine`)."""
    if shutil.which("nft") is None:
        raise NetworkSetupError(
            "the sandbox enforces NetworkPolicy with nftables in each pod's network namespace, and `nft` "
            "is not installed; install the Debian package nftables (`apt-get install nftables`, or `make setup`)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkSetupError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def bridge_owner(network: Network) -> str | None:
    """The state directory of the sandbox whose bridge this instance's is; None: no bridge."""
    shown = _ip("-d", "link", "show", network.bridge_name, check=False)
    if shown.returncode != 0:
        return None
    for line in shown.stdout.splitlines():
        if line.strip().startswith("alias "):
            return line.strip()[len("alias "):]
    return ""


def setup_host_network(network: Network, owner: str) -> None:
    """Create the bridge, the service route and the guard routes; safe to call when they exist.
    Raises when the instance's bridge belongs to another state directory."""
    require_root()
    current = bridge_owner(network)
    if current not in (None, "", owner):
        raise NetworkSetupError(f"bridge {network.bridge_name} (sandbox instance {network.instance}) belongs to the "
                                f"sandbox in {current}; stop it, or start this one with --instance N for another N")
    if current is None:
        _ip("link", "add", network.bridge_name, "type", "bridge")
    _ip("link", "set", network.bridge_name, "alias", owner)
    prefix = ipaddress.ip_network(network.pod_cidr).prefixlen
    addresses = _ip("-o", "addr", "show", "dev", network.bridge_name).stdout
    if f"{network.gateway_ip}/{prefix}" not in addresses:
        _ip("addr", "add", f"{network.gateway_ip}/{prefix}", "dev", network.bridge_name)
    _ip("link", "set", network.bridge_name, "up")
    routes = _ip("route", "show", "table", "local", network.service_cidr).stdout
    if network.service_cidr not in routes:
        _ip("route", "add", "local", network.service_cidr, "dev", "lo")
    for cidr in (network.pod_cidr, network.service_cidr):
        _ip("route", "replace", "unreachable", cidr, "metric", str(GUARD_ROUTE_METRIC))


def teardown_host_network(network: Network, owner: str) -> None:
    """Remove this instance's pod namespaces, bridge and routes if this sandbox owns them."""
    if bridge_owner(network) not in (owner, "", None):
        return  # another sandbox's: not ours to remove
    for namespace in list_pod_namespaces(network):
        delete_pod_namespace(namespace)
    _ip("route", "del", "local", network.service_cidr, "dev", "lo", check=False)
    _ip("link", "del", network.bridge_name, check=False)
    for cidr in (network.pod_cidr, network.service_cidr):
        _ip("route", "del", "unreachable", cidr, "metric", str(GUARD_ROUTE_METRIC), check=False)


def pod_namespace_name(network: Network, pod_uid: str) -> str:
    return network.netns_prefix + pod_uid.replace("-", "")[:12]


def _veth_name(namespace: str) -> str:
    # Interface names are limited to 15 bytes.
    return "lv" + hashlib.sha1(namespace.encode()).hexdigest()[:10]


def create_pod_namespace(network: Network, namespace: str, pod_ip: str) -> None:
    require_root()
    delete_pod_namespace(namespace)
    host_end = _veth_name(namespace)
    prefix = ipaddress.ip_network(network.pod_cidr).prefixlen
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", host_end, "master", network.bridge_name)
        _ip("link", "set", host_end, "up")
        _ip("-n", namespace, "addr", "add", f"{pod_ip}/{prefix}", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "route", "add", "default", "via", network.gateway_ip)
    except NetworkSetupError:
        delete_pod_namespace(namespace)
        raise


def namespace_pids(namespace: str) -> list[int]:
    result = _ip("netns", "pids", namespace, check=False)
    return [int(pid) for pid in result.stdout.split()]


def delete_pod_namespace(namespace: str) -> None:
    """Kill anything still running inside, then remove the namespace and its veth."""
    if not (NETNS_DIR / namespace).exists():
        return
    for pid in namespace_pids(namespace):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    _ip("link", "del", _veth_name(namespace), check=False)
    _ip("netns", "del", namespace, check=False)


def list_pod_namespaces(network: Network) -> list[str]:
    if not NETNS_DIR.exists():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(network.netns_prefix))


def exec_prefix(namespace: str) -> list[str]:
    """Command prefix that runs a program inside the pod's network namespace."""
    return ["nsenter", f"--net={NETNS_DIR / namespace}", "--"]
