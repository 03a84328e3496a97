"""Command lines for etcd and the Kubernetes control plane, and health waits.

The binaries come from `operator/controlplane/build.sh`, which builds them from
pinned Go modules into a cache outside the repository.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from llmfleet_sandbox.certs import CONTROLLER_MANAGER, SCHEDULER
from llmfleet_sandbox.config import SandboxConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "operator" / "controlplane" / "build.sh"
GATEWAY_CRDS_SCRIPT = REPO_ROOT / "operator" / "controlplane" / "gateway-crds.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
NODE_MONITOR_GRACE_SECONDS = 30
NODE_LOSS_TOLERATION_SECONDS = 30


def ensure_gateway_crds() -> Path:
    """The upstream Gateway API and InferencePool CRD files (fetched once into the cache)."""
    result = subprocess.run([str(GATEWAY_CRDS_SCRIPT)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{GATEWAY_CRDS_SCRIPT.name} failed: {result.stderr.strip()[-2000:]}")
    return Path(result.stdout.strip())


def ensure_binaries() -> Path:
    """Build (or find in the cache) the control-plane binaries; return their directory."""
    explicit = os.environ.get("LLMFLEET_CONTROLPLANE_BIN")
    if explicit:
        return Path(explicit)
    if not BUILD_SCRIPT.exists():
        raise RuntimeError(
            f"{BUILD_SCRIPT} not found: run from a source checkout or set "
            "LLMFLEET_CONTROLPLANE_BIN to a directory holding " + ", ".join(BINARIES)
        )
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the control plane failed (exit {result.returncode}); "
                           "the output above names the failing module")
    return Path(result.stdout.strip().splitlines()[-1])


def etcd_argv(bin_dir: Path, config: SandboxConfig) -> list[str]:
    ports = config.ports
    return [
        str(bin_dir / "etcd"),
        "--name=sandbox",
        f"--data-dir={config.state_dir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{ports.etcd_client}",
        f"--advertise-client-urls=http://127.0.0.1:{ports.etcd_client}",
        f"--listen-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
        f"--initial-cluster=sandbox=http://127.0.0.1:{ports.etcd_peer}",
        # A sandbox trades durability on power loss for speed.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


# The apiserver's audit log records who listed or wrote the kinds an LLMDeployment owns (and its
# status), and every request of an in-cluster client (a ServiceAccount, as the operator runs):
# how tests see what the operator asks of the API and what RBAC refused it, and where a user
# looks when something changed that should not have. Other users' reads are not logged.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "Metadata", "verbs": ["list", "create", "update", "patch", "delete"],
         "resources": [{"group": "", "resources": ["configmaps", "services"]},
                       {"group": "apps", "resources": ["deployments"]},
                       {"group": "batch", "resources": ["jobs"]},
                       {"group": "policy", "resources": ["poddisruptionbudgets"]},
                       {"group": "llmfleet.io", "resources": ["llmdeployments", "llmdeployments/status"]}]},
        {"level": "None"},
    ],
}


def audit_log(config: SandboxConfig) -> Path:
    return config.logs_dir / "kube-apiserver-audit.log"


def apiserver_argv(bin_dir: Path, config: SandboxConfig) -> list[str]:
    pki = config.pki_dir
    policy = config.state_dir / "audit-policy.json"
    policy.write_text(json.dumps(AUDIT_POLICY))
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{config.ports.etcd_client}",
        # The apiserver listens on the pod bridge's gateway: host-only, and the
        # same address for the host and for pods (the `kubernetes` Service
        # endpoint must not be a loopback address).
        f"--bind-address={config.network.gateway_ip}",
        f"--advertise-address={config.network.gateway_ip}",
        f"--secure-port={config.ports.apiserver}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        f"--service-cluster-ip-range={config.network.service_cidr}",
        "--allow-privileged=true",
        f"--service-account-issuer={config.apiserver_url}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        # Pods leave a lost node after 30 s instead of 5 minutes: a cluster setting (the
        # DefaultTolerationSeconds admission plugin), so node-loss tests take a minute.
        f"--default-not-ready-toleration-seconds={NODE_LOSS_TOLERATION_SECONDS}",
        f"--default-unreachable-toleration-seconds={NODE_LOSS_TOLERATION_SECONDS}",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log(config)}",
        "--audit-log-maxsize=100",
        "--audit-log-maxbackup=1",
        "--v=1",
    ]


def controller_manager_argv(bin_dir: Path, config: SandboxConfig) -> list[str]:
    pki = config.pki_dir
    kubeconfig = config.state_dir / f"{CONTROLLER_MANAGER.file_stem}.kubeconfig"
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={config.ports.controller_manager}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true",
        "--controllers=*",
        "--leader-elect=false",
        # A node whose Lease is 30 s old is NotReady (default 50 s); the agent renews every 5 s.
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
        # The node agent assigns pod IPs itself; no cloud routes to allocate.
        "--allocate-node-cidrs=false",
        "--v=1",
    ]


def scheduler_argv(bin_dir: Path, config: SandboxConfig) -> list[str]:
    kubeconfig = config.state_dir / f"{SCHEDULER.file_stem}.kubeconfig"
    return [
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={config.ports.scheduler}",
        "--leader-elect=false",
        "--v=1",
    ]


def wait_for_https_ok(url: str, config: SandboxConfig, timeout_seconds: float,
                      what: str, authenticated: bool = True) -> None:
    """Poll url until it answers 200, with the admin client certificate."""
    context = ssl.create_default_context(cafile=str(config.pki_dir / "ca.crt"))
    if authenticated:
        context.load_cert_chain(config.pki_dir / "admin.crt", config.pki_dir / "admin.key")
    if "127.0.0.1" in url:
        # Component serving certs are self-signed by the component itself.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    _wait_ok(url, timeout_seconds, what, context)


def wait_for_http_ok(url: str, timeout_seconds: float, what: str) -> None:
    _wait_ok(url, timeout_seconds, what, None)


def _wait_ok(url, timeout_seconds, what, context) -> None:
    deadline = time.monotonic() + timeout_seconds
    last_error = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status == 200:
                    return
                last_error = f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            last_error = f"HTTP {error.code}"
        except (urllib.error.URLError, OSError) as error:
            last_error = str(error)
        time.sleep(0.2)
    raise TimeoutError(f"{what} not healthy at {url} after {timeout_seconds:.0f} s: {last_error}")
