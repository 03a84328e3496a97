"""Pod networking, as a CNI plugin would give it: one network namespace per pod.

Each pod gets a namespace with a veth pair whose host end joins a host-only
bridge, so every pod binds its usual ports (Triton's 8000-8002) without
clashing and its IP is reachable from the host. Service ClusterIPs are made
local to the host (an "AnyIP" route on lo) so the service proxy can listen on
them directly. All of this needs CAP_NET_ADMIN, i.e. root.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import subprocess
from pathlib import Path

from llmfleet_sandbox.config import (
    BRIDGE_CIDR,
    BRIDGE_GATEWAY_IP,
    BRIDGE_NAME,
    NETNS_PREFIX,
    SERVICE_CIDR,
)

NETNS_DIR = Path("/run/netns")


class NetworkSetupError(RuntimeError):
    pass


def require_root() -> None:
    if os.geteuid() != 0:
        raise NetworkSetupError(
            "the sandbox gives every pod its own network namespace, which needs root "
            "(CAP_NET_ADMIN); run `llmfleet sandbox up` as root (e.g. with sudo)"
        )


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkSetupError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def setup_host_network() -> None:
    """Create the bridge and the service route; safe to call when they exist."""
    require_root()
    if _ip("link", "show", BRIDGE_NAME, check=False).returncode != 0:
        _ip("link", "add", BRIDGE_NAME, "type", "bridge")
    prefix = ipaddress.ip_network(BRIDGE_CIDR).prefixlen
    addresses = _ip("-o", "addr", "show", "dev", BRIDGE_NAME).stdout
    if f"{BRIDGE_GATEWAY_IP}/{prefix}" not in addresses:
        _ip("addr", "add", f"{BRIDGE_GATEWAY_IP}/{prefix}", "dev", BRIDGE_NAME)
    _ip("link", "set", BRIDGE_NAME, "up")
    routes = _ip("route", "show", "table", "local", SERVICE_CIDR).stdout
    if SERVICE_CIDR not in routes:
        _ip("route", "add", "local", SERVICE_CIDR, "dev", "lo")


def teardown_host_network() -> None:
    for namespace in list_pod_namespaces():
        delete_pod_namespace(namespace)
    _ip("route", "del", "local", SERVICE_CIDR, "dev", "lo", check=False)
    _ip("link", "del", BRIDGE_NAME, check=False)


def pod_namespace_name(pod_uid: str) -> str:
    return NETNS_PREFIX + pod_uid.replace("-", "")[:12]


def _veth_name(namespace: str) -> str:
    # Interface names are limited to 15 bytes.
    return "lv" + hashlib.sha1(namespace.encode()).hexdigest()[:10]


def create_pod_namespace(namespace: str, pod_ip: str) -> None:
    require_root()
    delete_pod_namespace(namespace)
    host_end = _veth_name(namespace)
    prefix = ipaddress.ip_network(BRIDGE_CIDR).prefixlen
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", host_end, "master", BRIDGE_NAME)
        _ip("link", "set", host_end, "up")
        _ip("-n", namespace, "addr", "add", f"{pod_ip}/{prefix}", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "route", "add", "default", "via", BRIDGE_GATEWAY_IP)
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


def list_pod_namespaces() -> list[str]:
    if not NETNS_DIR.exists():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(NETNS_PREFIX))


def exec_prefix(namespace: str) -> list[str]:
    """Command prefix that runs a program inside the pod's network namespace."""
    return ["nsenter", f"--net={NETNS_DIR / namespace}", "--"]
