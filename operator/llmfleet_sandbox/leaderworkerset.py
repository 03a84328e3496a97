"""The LeaderWorkerSet controller, as a cluster that offers LeaderWorkerSets runs it.

`operator/controlplane/lws.sh` builds the upstream controller (sigs.k8s.io/lws, pinned there)
and copies its CRDs, webhook configurations and ClusterRoles from the same module. The sandbox
installs them as the upstream release does (config/default: names prefixed `lws-`) and runs
the one binary, controller and webhooks, as a host process like the control plane:

- its webhooks (which default a LeaderWorkerSet's spec, and give each group's pods their
  labels and the LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX environment that the
  controller relies on) serve on loopback with a certificate from the sandbox CA; the upstream
  webhook configurations are registered with a `url` there instead of the in-cluster Service,
  and that CA as their caBundle. Its own certificate management (which writes a Secret and
  patches the configurations) is off, as a release with cert-manager has it;
- it authenticates as the user `lws-controller-manager`, bound to the upstream ClusterRoles;
- leader election is off (one replica), as for the control plane.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import time
from pathlib import Path

import yaml

from llmfleet_sandbox import certs
from llmfleet_sandbox.config import SandboxConfig

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "controlplane" / "lws.sh"
BINARY = "lws-controller-manager"
# config/default/kustomization.yaml: namePrefix.
RELEASE_PREFIX = "lws-"
CRD_NAMES = ("leaderworkersets.leaderworkerset.x-k8s.io", "disaggregatedsets.disaggregatedset.x-k8s.io")
# A LeaderWorkerSet the apiserver is asked to create with --dry-run=server: admitted once the
# CRD is served and the webhooks answer.
PROBE_LWS = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
    "metadata": {"name": "sandbox-webhook-probe", "namespace": "default"},
    "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [
        {"name": "probe", "image": "busybox:1.36"}]}}}},
}


def ensure_build() -> Path:
    """Build (or find in the cache) the controller; the directory holding it, its CRDs,
    webhook configurations and ClusterRoles."""
    result = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the LeaderWorkerSet controller failed (exit {result.returncode}); "
                           "the output above says why")
    return Path(result.stdout.strip().splitlines()[-1])


def version(build_dir: Path) -> str:
    output = subprocess.run([str(build_dir / BINARY), "--version"], capture_output=True, text=True,
                            check=True).stdout
    return output.splitlines()[0].split()[-1]


def state_dir(config: SandboxConfig) -> Path:
    return config.state_dir / "lws"


def write_configuration(config: SandboxConfig) -> Path:
    """The controller's --config (api/config/v1alpha1 Configuration) and its serving certificate."""
    directory = state_dir(config)
    cert_dir = directory / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    # controller-runtime's webhook server reads tls.crt and tls.key from its certDir.
    certs.issue_serving_certificate(config.pki_dir, cert_dir / "tls", "lws-webhook-service",
                                    ips=["127.0.0.1"], dns_names=["localhost"])
    ports = config.ports
    configuration = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports.lws_webhook, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.lws_metrics}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.lws_health}"},
    }
    path = directory / "configuration.yaml"
    path.write_text(yaml.safe_dump(configuration, sort_keys=False))
    return path


def argv(build_dir: Path, config: SandboxConfig) -> list[str]:
    kubeconfig = config.state_dir / f"{certs.LWS_CONTROLLER_MANAGER.file_stem}.kubeconfig"
    return [
        str(build_dir / BINARY),
        f"--config={write_configuration(config)}",
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--zap-devel=false",
        "--zap-log-level=info",
    ]


def _apply_patch(document: dict, patch: list[dict]) -> dict:
    """The JSON patches of config/webhook (only `replace` of a whole webhook)."""
    patched = copy.deepcopy(document)
    for operation in patch:
        if operation["op"] != "replace" or not operation["path"].startswith("/webhooks/"):
            raise ValueError(f"unexpected patch operation {operation}")
        patched["webhooks"][int(operation["path"].rsplit("/", 1)[1])] = operation["value"]
    return patched


def webhook_configurations(build_dir: Path, config: SandboxConfig) -> list[dict]:
    """The upstream Mutating- and ValidatingWebhookConfiguration with their patches, each webhook
    pointing at the controller's loopback server, trusted through the sandbox CA."""
    directory = build_dir / "webhooks"
    documents = [document for document in yaml.safe_load_all((directory / "manifests.yaml").read_text())
                 if document]
    patches = {"MutatingWebhookConfiguration": yaml.safe_load((directory / "mutating-patch.yaml").read_text()),
               "ValidatingWebhookConfiguration": yaml.safe_load((directory / "validating-patch.yaml").read_text())}
    ca_bundle = base64.b64encode((config.pki_dir / "ca.crt").read_bytes()).decode()
    configurations = []
    for document in documents:
        patched = _apply_patch(document, patches[document["kind"]])
        patched["metadata"]["name"] = RELEASE_PREFIX + patched["metadata"]["name"]
        for webhook in patched["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{config.ports.lws_webhook}{path}",
                                       "caBundle": ca_bundle}
        configurations.append(patched)
    return configurations


def rbac_objects(build_dir: Path) -> list[dict]:
    """The upstream ClusterRoles (manager-role, proxy-role), named as a release names them,
    bound to the controller's user."""
    objects = []
    for file_name in ("role.yaml", "auth_proxy_role.yaml"):
        role = yaml.safe_load((build_dir / "rbac" / file_name).read_text())
        role["metadata"] = {"name": RELEASE_PREFIX + role["metadata"]["name"]}
        objects.append(role)
        objects.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role["metadata"]["name"].replace("-role", "-rolebinding")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role["metadata"]["name"]},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": certs.LWS_CONTROLLER_MANAGER.common_name}],
        })
    return objects


def install(kubectl: list[str], build_dir: Path, config: SandboxConfig) -> None:
    """The CRDs (established before the controller starts: it watches both kinds), its RBAC and
    the webhook configurations."""
    _kubectl(kubectl + ["apply", "--server-side", "--force-conflicts", "-f", str(build_dir / "crds")],
             "the LeaderWorkerSet CRDs were refused")
    _wait_established(kubectl, timeout_seconds=60)
    objects = rbac_objects(build_dir) + webhook_configurations(build_dir, config)
    _kubectl(kubectl + ["apply", "--server-side", "--force-conflicts", "-f", "-"],
             "the LeaderWorkerSet RBAC or webhook configurations were refused",
             input_text="\n---\n".join(json.dumps(item) for item in objects))


def _wait_established(kubectl: list[str], timeout_seconds: float) -> None:
    # kubectl wait fails, rather than waits, on a CRD the apiserver has not given conditions yet.
    deadline = time.monotonic() + timeout_seconds
    while True:
        result = subprocess.run(kubectl + ["wait", "--for=condition=Established", "--timeout=10s",
                                           *[f"crd/{name}" for name in CRD_NAMES]], capture_output=True, text=True)
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the LeaderWorkerSet CRDs were not established: {result.stderr.strip()}")
        time.sleep(0.3)


def wait_until_serving(kubectl: list[str], timeout_seconds: float) -> None:
    """Until the apiserver admits a LeaderWorkerSet through the controller's webhooks."""
    deadline = time.monotonic() + timeout_seconds
    last = ""
    while time.monotonic() < deadline:
        result = subprocess.run(kubectl + ["create", "--dry-run=server", "-o", "name", "-f", "-"],
                                input=json.dumps(PROBE_LWS), capture_output=True, text=True)
        if result.returncode == 0:
            return
        last = (result.stderr or result.stdout).strip()
        time.sleep(0.5)
    raise TimeoutError(f"the LeaderWorkerSet webhooks did not admit a LeaderWorkerSet after "
                       f"{timeout_seconds:.0f} s: {last}")


def _kubectl(argv: list[str], failure: str, input_text: str | None = None) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, input=input_text)
    if result.returncode != 0:
        raise RuntimeError(f"{failure}:\n{(result.stderr or result.stdout).strip()}")
