"""Where the sandbox keeps its state and which addresses it uses.

Everything the sandbox writes lives under one state directory so that `down`
can find and remove all of it, even after a crash.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_GPU_TYPE = "H100-SXM-80GB"

# The pod network is a host-only bridge; its gateway address is also where the
# apiserver listens, so that pods and the host reach it at the same address.
BRIDGE_NAME = "llmf0"
BRIDGE_CIDR = "10.244.0.0/16"
BRIDGE_GATEWAY_IP = "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
NETNS_PREFIX = "llmf-"
CLUSTER_DOMAIN = "cluster.local"


def default_state_dir() -> Path:
    explicit = os.environ.get("LLMFLEET_SANDBOX_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmfleet" / "sandbox"


@dataclass(frozen=True)
class Ports:
    etcd_client: int = 12379
    etcd_peer: int = 12380
    apiserver: int = 16443
    controller_manager: int = 10257
    scheduler: int = 10259
    prometheus: int = 19090
    pod_discovery: int = 19091
    object_store: int = 19000


CPU_NODE = "cpu-node-1"


@dataclass(frozen=True)
class SandboxConfig:
    state_dir: Path = field(default_factory=default_state_dir)
    node_count: int = 2
    gpus_per_node: int = 8
    gpu_type: str = DEFAULT_GPU_TYPE
    scrape_interval_seconds: int = 5
    ports: Ports = field(default_factory=Ports)
    # Prometheus listens on the host-only bridge's gateway, like the apiserver: the host
    # and pods (the in-cluster operator) reach it at the same address.
    prometheus_ip: str = BRIDGE_GATEWAY_IP

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pids_dir(self) -> Path:
        return self.state_dir / "pids"

    @property
    def pods_dir(self) -> Path:
        return self.state_dir / "pods"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def settings_file(self) -> Path:
        """The options `up` was started with, read back by status/down/the agent."""
        return self.state_dir / "sandbox.json"

    @property
    def apiserver_url(self) -> str:
        return f"https://{BRIDGE_GATEWAY_IP}:{self.ports.apiserver}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.prometheus_ip}:{self.ports.prometheus}"

    @property
    def object_store_url(self) -> str:
        """The S3 endpoint, on the bridge's gateway: the host and pods reach it there."""
        return f"http://{BRIDGE_GATEWAY_IP}:{self.ports.object_store}"

    @property
    def object_store_credentials_file(self) -> Path:
        """An AWS shared credentials file ([default]) for the object store's one user."""
        return self.state_dir / "object-store" / "credentials"

    @property
    def pod_discovery_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.pod_discovery}/targets"

    def gpu_node_names(self) -> list[str]:
        return [f"gpu-node-{index}" for index in range(1, self.node_count + 1)]

    def node_names(self) -> list[str]:
        """The GPU nodes and one CPU node: as in a real cluster, work that needs no GPU (the
        operator, checkpoint downloads) does not tolerate the GPU nodes' taint."""
        return [*self.gpu_node_names(), CPU_NODE]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["state_dir"] = str(self.state_dir)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "SandboxConfig":
        return cls(**{**data, "state_dir": Path(data["state_dir"]), "ports": Ports(**data["ports"])})
