"""Where the sandbox keeps its state and which addresses it uses.

Everything the sandbox writes lives under one state directory so that `down`
can find and remove all of it, even after a crash.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from llmfleet.simulation.routing import DEFAULT_ROUTING

DEFAULT_GPU_TYPE = "H100-SXM-80GB"

CLUSTER_DOMAIN = "cluster.local"
# On the objects the sandbox makes for itself (its nodes, its storage class), not the product's.
SANDBOX_LABEL = "llmfleet.io/sandbox"
# Sandboxes side by side on one machine: instance N has its own bridge, subnets and ports.
MAX_INSTANCE = 9
# Between two instances' ports, so that no default port of one is another's.
INSTANCE_PORT_STRIDE = 100


def default_state_dir(instance: int = 0) -> Path:
    explicit = os.environ.get("LLMFLEET_SANDBOX_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmfleet" / ("sandbox" if instance == 0 else f"sandbox-{instance}")


@dataclass(frozen=True)
class Network:
    """One sandbox's pod network, a host-only bridge whose gateway address is also where the
    apiserver listens (pods and the host reach it at the same address), and its Service range.
    Instance 0 is the default; instance N uses the next /16s, so that a test sandbox runs beside
    a demo one."""

    instance: int = 0

    @property
    def bridge_name(self) -> str:
        return f"llmf{self.instance}"

    @property
    def pod_cidr(self) -> str:
        return f"10.{244 + self.instance}.0.0/16"

    @property
    def gateway_ip(self) -> str:
        return f"10.{244 + self.instance}.0.1"

    def node_pod_cidr(self, node_index: int) -> str:
        return f"10.{244 + self.instance}.{node_index}.0/24"

    @property
    def service_cidr(self) -> str:
        # 65534 ClusterIPs: a /24 ran out at 254 Services (bench_scale creates 1000).
        return f"10.{96 + self.instance}.0.0/16"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"10.{96 + self.instance}.0.1"

    @property
    def netns_prefix(self) -> str:
        return f"llmf{self.instance}-"


@dataclass(frozen=True)
class Ports:
    etcd_client: int = 12379
    etcd_peer: int = 12380
    apiserver: int = 16443
    controller_manager: int = 10257
    scheduler: int = 10259
    prometheus: int = 19090
    pod_discovery: int = 19091
    # Prometheus itself, on loopback, behind the bearer-token proxy (prometheus_auth "bearer").
    prometheus_upstream: int = 19092
    object_store: int = 19000
    # The LeaderWorkerSet controller's webhook server, metrics and health probes (loopback).
    lws_webhook: int = 19443
    lws_metrics: int = 18443
    lws_health: int = 18081

    @classmethod
    def for_instance(cls, instance: int) -> "Ports":
        base = cls()
        return cls(**{name: port + instance * INSTANCE_PORT_STRIDE for name, port in asdict(base).items()})


CPU_NODE = "cpu-node-1"
PROMETHEUS_USERNAME = "llmfleet"
PROMETHEUS_AUTH_MODES = ("none", "basic", "bearer")
# prometheus_auth "bearer": a request reaches Prometheus when the SubjectAccessReview of its token's
# identity allows the HTTP method's verb (GET: get, POST: create) on this Service's `proxy`
# subresource, as `kubectl proxy` to the Service would need. The Service itself need not exist.
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_SERVICE = "prometheus"
# The ServiceAccount (and the Role it is bound to) `sandbox env` hands a token of.
PROMETHEUS_READER = "prometheus-reader"


@dataclass(frozen=True)
class SandboxConfig:
    state_dir: Path = field(default_factory=default_state_dir)
    node_count: int = 2
    gpus_per_node: int = 8
    gpu_type: str = DEFAULT_GPU_TYPE
    # More GPU nodes of other types, (GPU type, node count) each, numbered after the first
    # pool's: a cluster of mixed node pools.
    extra_node_pools: tuple[tuple[str, int], ...] = ()
    # The chart's PodMonitor default; kube-prometheus-stack's global default is 30.
    scrape_interval_seconds: int = 15
    # "basic": Prometheus serves HTTPS (the sandbox CA) and asks for basic auth; "bearer": a proxy
    # serves HTTPS and lets through requests whose Kubernetes token the apiserver accepts and
    # authorizes (llmfleet_sandbox.rbacproxy), Prometheus listening on loopback; "none": plain HTTP.
    prometheus_auth: str = "none"
    # How the service proxy spreads a Service's connections (llmfleet.simulation.routing).
    service_proxy_scheduler: str = DEFAULT_ROUTING
    instance: int = 0
    # None: the instance's ports.
    ports: Ports | None = None
    # Prometheus listens on the host-only bridge's gateway, like the apiserver: the host
    # and pods (the in-cluster operator) reach it at the same address. Empty: the gateway.
    prometheus_ip: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.instance <= MAX_INSTANCE:
            raise ValueError(f"instance must be within 0..{MAX_INSTANCE}, got {self.instance}")
        if self.ports is None:
            object.__setattr__(self, "ports", Ports.for_instance(self.instance))
        if self.prometheus_auth not in PROMETHEUS_AUTH_MODES:
            raise ValueError(f"prometheus_auth must be one of {', '.join(PROMETHEUS_AUTH_MODES)}, "
                             f"got {self.prometheus_auth!r}")
        if not self.prometheus_ip:
            object.__setattr__(self, "prometheus_ip", self.network.gateway_ip)

    @property
    def network(self) -> Network:
        return Network(self.instance)

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
        return f"https://{self.network.gateway_ip}:{self.ports.apiserver}"

    @property
    def prometheus_url(self) -> str:
        """Where users, the operator and pods reach Prometheus (its proxy's, with "bearer")."""
        scheme = "http" if self.prometheus_auth == "none" else "https"
        return f"{scheme}://{self.prometheus_ip}:{self.ports.prometheus}"

    @property
    def prometheus_listen_address(self) -> tuple[str, int]:
        """Where Prometheus itself listens: at `prometheus_url`, or on loopback where only its
        proxy reaches it (prometheus_auth "bearer")."""
        if self.prometheus_auth == "bearer":
            return "127.0.0.1", self.ports.prometheus_upstream
        return self.prometheus_ip, self.ports.prometheus

    @property
    def prometheus_proxy_dir(self) -> Path:
        """The bearer-token proxy's serving certificate and the reader's token."""
        return self.state_dir / "prometheus-proxy"

    @property
    def prometheus_token_file(self) -> Path:
        """A token of PROMETHEUS_READER, which may read Prometheus (prometheus_auth "bearer")."""
        return self.prometheus_proxy_dir / "token"

    @property
    def prometheus_password_file(self) -> Path:
        """The basic auth password of PROMETHEUS_USERNAME (prometheus_auth "basic")."""
        return self.state_dir / "prometheus-web" / "password"

    @property
    def prometheus_server_name(self) -> str:
        """A name Prometheus' certificate carries besides its address."""
        return f"prometheus.sandbox-{self.instance}.llmfleet"

    @property
    def cluster_dns_ip(self) -> str:
        """Where the cluster's DNS answers (port 53), on the bridge's gateway: the kubelet's
        --cluster-dns, the nameserver of every pod's resolv.conf."""
        return self.network.gateway_ip

    @property
    def object_store_url(self) -> str:
        """The S3 endpoint, on the bridge's gateway: the host and pods reach it there."""
        return f"http://{self.network.gateway_ip}:{self.ports.object_store}"

    @property
    def object_store_credentials_file(self) -> Path:
        """An AWS shared credentials file ([default]) for the object store's one user."""
        return self.state_dir / "object-store" / "credentials"

    @property
    def pod_discovery_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.pod_discovery}/targets"

    def gpu_node_types(self) -> dict[str, str]:
        """Every GPU node's name and its GPU type: gpu-node-1.. for `node_count` x `gpu_type`,
        then the extra pools' nodes in order."""
        pools = [(self.gpu_type, self.node_count), *self.extra_node_pools]
        types = [gpu_type for gpu_type, count in pools for _ in range(count)]
        return {f"gpu-node-{index}": gpu_type for index, gpu_type in enumerate(types, start=1)}

    def gpu_node_names(self) -> list[str]:
        return list(self.gpu_node_types())

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
        # Ports added since the sandbox was started take the instance's defaults.
        ports = ({**asdict(Ports.for_instance(data.get("instance", 0))), **data["ports"]}
                 if data.get("ports") else None)
        return cls(**{**data, "state_dir": Path(data["state_dir"]), "ports": Ports(**ports) if ports else None,
                      "extra_node_pools": tuple(tuple(pool) for pool in data.get("extra_node_pools") or ())})
