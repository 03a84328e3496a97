"""`llmfleet sandbox up | down | status | kubeconfig | env`."""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from llmfleet_sandbox import (certs, clusterdns, controlplane, leaderworkerset, network, objectstore, prometheus,
                              rbacproxy)
from llmfleet_sandbox.config import (
    CLUSTER_DOMAIN,
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_READER,
    PROMETHEUS_USERNAME,
    SandboxConfig,
)
from llmfleet_sandbox.processes import ProcessTable

# Start order; `down` stops in reverse so pods end before the apiserver does. The
# prometheus-proxy runs with --prometheus-auth bearer alone (`components`).
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "lws-controller-manager",
              "cluster-dns", "network-policy", "node-agent", "service-proxy", "pod-discovery", "volume-provisioner", "prometheus",
              "prometheus-proxy", "object-store")
# How long the token `sandbox env` hands out for PROMETHEUS_READER lasts: as long as the
# sandbox's certificates (`kubectl create token` gives an hour by default).
PROMETHEUS_TOKEN_DURATION = "8760h"
NODE_AGENT_STOP_SECONDS = 60
DEMO_MANIFEST = controlplane.REPO_ROOT / "examples" / "sandbox-chat.yaml"
# The load the demo's instructions print (benchmarks/bench_routing.py drives the same): a step
# from 1 to 3 requests/s for three minutes. One replica serves about 1.2/s of this workload
# within the SLO (the emulated engine in virtual time, arrivals at random), so the step needs
# three replicas; maxReplicas 4 leaves one to spare.
DEMO_LOAD_ARGS = ("--schedule", "steps:0:1,60:3,240:1", "--duration-s", "360",
                  "--input-tokens", "lognormal:256:512", "--output-tokens", "lognormal:64:128")
# `demo` installs the operator as a user would: this chart, this release, this namespace.
CHART = controlplane.REPO_ROOT / "charts" / "llmfleet"
OPERATOR_RELEASE = "llmfleet"
OPERATOR_NAMESPACE = "llmfleet-system"
OPERATOR_READY_TIMEOUT = "180s"


class SandboxError(RuntimeError):
    pass


def progress(message: str) -> None:
    print(f"[sandbox] {message}", file=sys.stderr, flush=True)


def load_settings(config: SandboxConfig) -> dict | None:
    if not config.settings_file.exists():
        return None
    return json.loads(config.settings_file.read_text())


def configured(state_dir: Path | None = None) -> SandboxConfig:
    """The config a running sandbox was started with, or the defaults."""
    default = SandboxConfig() if state_dir is None else SandboxConfig(state_dir=state_dir)
    settings = load_settings(default)
    return SandboxConfig.from_dict(settings["config"]) if settings else default


def process_table(config: SandboxConfig) -> ProcessTable:
    return ProcessTable(config.pids_dir, config.logs_dir)


def components(config: SandboxConfig) -> tuple[str, ...]:
    """The components this sandbox runs, in start order."""
    return tuple(name for name in COMPONENTS if name != "prometheus-proxy" or config.prometheus_auth == "bearer")


def running_components(config: SandboxConfig) -> set[str]:
    return {record.name for record in process_table(config).recorded() if record.alive()}


def up(config: SandboxConfig) -> SandboxConfig:
    network.require_root()
    network.require_nft()
    running = running_components(config)
    if running >= set(components(configured(config.state_dir))):
        progress(f"already running (state in {config.state_dir}); `llmfleet sandbox status` shows it")
        return configured(config.state_dir)
    if running:
        # Start only what stopped: pods, cluster data and addresses stay as they are.
        config = configured(config.state_dir)
        missing = [name for name in components(config) if name not in running]
        progress(f"partly running; starting {', '.join(missing)}")
        settings = load_settings(config)
        bin_dir = Path(settings["binDir"])
        # A sandbox started before the LeaderWorkerSet controller was part of it builds it now.
        lws_dir = Path(settings["lwsDir"]) if settings.get("lwsDir") else leaderworkerset.ensure_build()
        _start_components(config, process_table(config), bin_dir, lws_dir, set(missing))
        return config
    stop_everything(config, quiet=True)
    busy = ports_in_use(config)
    if busy:
        raise SandboxError(
            f"port(s) {', '.join(busy)} already in use: is another sandbox running with a "
            "different state directory? Stop it with `llmfleet sandbox down` "
            "(with its LLMFLEET_SANDBOX_DIR), or free the ports")
    started = time.monotonic()
    progress("building or reusing the control-plane binaries")
    bin_dir = controlplane.ensure_binaries()
    kubernetes_version = _binary_version(bin_dir)
    progress("building or reusing the LeaderWorkerSet controller")
    lws_dir = leaderworkerset.ensure_build()
    config.state_dir.mkdir(parents=True, exist_ok=True)
    network.setup_host_network(config.network, str(config.state_dir))
    certs.generate_pki(
        config.pki_dir,
        serving_ips=[config.network.gateway_ip, "127.0.0.1", config.network.kubernetes_service_ip],
        serving_dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                     f"kubernetes.default.svc.{CLUSTER_DOMAIN}"],
    )
    for identity in certs.CLIENT_IDENTITIES:
        certs.write_kubeconfig(config.state_dir / f"{identity.file_stem}.kubeconfig",
                               config.apiserver_url, config.pki_dir, identity)
    config.settings_file.write_text(json.dumps({
        "config": config.to_dict(), "kubernetesVersion": kubernetes_version,
        "binDir": str(bin_dir), "lwsDir": str(lws_dir), "lwsVersion": leaderworkerset.version(lws_dir)},
        indent=2))
    try:
        _start_components(config, process_table(config), bin_dir, lws_dir, set(components(config)))
    except Exception:
        progress(f"start failed; logs are in {config.logs_dir}; stopping what was started")
        stop_everything(config, quiet=True)
        raise
    pools = [(config.gpu_type, config.node_count), *config.extra_node_pools]
    progress(f"up in {time.monotonic() - started:.1f} s: " + ", ".join(
        f"{count} nodes x {config.gpus_per_node} {gpu_type}" for gpu_type, count in pools) + ", and a CPU node")
    return config


def _start_components(config: SandboxConfig, table: ProcessTable, bin_dir: Path, lws_dir: Path,
                      wanted: set[str]) -> None:
    """Start the wanted components in dependency order, each once it can work."""
    # Here, not at the top: it loads the kubernetes client, which status and down do not need.
    from llmfleet_sandbox import provisioner

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    python_components = {
        "cluster-dns": ["llmfleet_sandbox.clusterdns", "--kubeconfig", str(config.admin_kubeconfig),
                        "--address", config.cluster_dns_ip],
        "network-policy": ["llmfleet_sandbox.policyengine", "--settings", str(config.settings_file)],
        "node-agent": ["llmfleet_sandbox.agent", "--settings", str(config.settings_file)],
        "service-proxy": ["llmfleet_sandbox.serviceproxy", "--kubeconfig", str(config.admin_kubeconfig),
                          "--scheduler", config.service_proxy_scheduler],
        "pod-discovery": ["llmfleet_sandbox.poddiscovery", "--kubeconfig", str(config.admin_kubeconfig),
                          "--port", str(config.ports.pod_discovery), "--state-dir", str(config.state_dir)],
        "volume-provisioner": ["llmfleet_sandbox.provisioner", "--settings", str(config.settings_file)],
    }
    _start_control_plane(config, table, bin_dir, wanted)
    _start_leaderworkerset(config, table, bin_dir, lws_dir, wanted)
    for name, module_args in python_components.items():
        if name in wanted:
            table.start(name, [sys.executable, "-m", *module_args], env=env)
    if "prometheus" in wanted:
        table.start("prometheus", prometheus.argv(config))
    if "prometheus-proxy" in wanted:
        table.start("prometheus-proxy", rbacproxy.argv(config, sys.executable), env=env)
    if "object-store" in wanted:
        table.start("object-store", objectstore.argv(config, objectstore.ensure_environment()),
                    env=objectstore.server_env())
    _wait_for_nodes(config, bin_dir, timeout_seconds=60)
    clusterdns.wait_until_serving(config.cluster_dns_ip, f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
                                  config.network.kubernetes_service_ip, timeout_seconds=30)
    if "kube-apiserver" in wanted:
        progress("installing the Gateway API, InferencePool, PodMonitor and PrometheusRule CRDs")
        _run([str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig), "apply", "--server-side",
              "-f", str(controlplane.ensure_gateway_crds())], "the upstream CRDs were refused")
    provisioner.wait_for_storage_class(
        [str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig)], timeout_seconds=30)
    if config.prometheus_auth == "bearer":
        _grant_prometheus_access(config, bin_dir)
    prometheus.wait_until_ready(config, 60)
    if "object-store" in wanted:
        controlplane.wait_for_http_ok(f"{config.object_store_url}/moto-api/", 60, "object-store")
        objectstore.provision(config)


def _grant_prometheus_access(config: SandboxConfig, bin_dir: Path) -> None:
    """The RBAC of the bearer-token proxy and its reader, and a token of the reader for
    `sandbox env` (anew on every start; tokens handed out before stay valid until they expire)."""
    kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig)]
    _run([*kubectl, "apply", "-f", "-"], "creating the Prometheus proxy's RBAC failed",
         input_text=yaml.safe_dump_all(rbacproxy.access_manifests()))
    result = subprocess.run([*kubectl, "create", "token", PROMETHEUS_READER, "-n", PROMETHEUS_NAMESPACE,
                             f"--duration={PROMETHEUS_TOKEN_DURATION}"], capture_output=True, text=True)
    if result.returncode != 0:
        raise SandboxError(f"requesting a token of {PROMETHEUS_NAMESPACE}/{PROMETHEUS_READER} failed:\n"
                           f"{result.stderr.strip()}")
    config.prometheus_proxy_dir.mkdir(parents=True, exist_ok=True)
    staging = config.prometheus_token_file.with_suffix(".new")
    staging.write_text(result.stdout.strip() + "\n")
    staging.chmod(0o600)
    staging.replace(config.prometheus_token_file)


def ports_in_use(config: SandboxConfig) -> list[str]:
    ports = config.ports
    wanted = [("127.0.0.1", ports.etcd_client), ("127.0.0.1", ports.etcd_peer),
              ("127.0.0.1", ports.controller_manager), ("127.0.0.1", ports.scheduler),
              ("127.0.0.1", ports.lws_webhook), ("127.0.0.1", ports.lws_metrics), ("127.0.0.1", ports.lws_health),
              (config.cluster_dns_ip, clusterdns.DNS_PORT),
              (config.prometheus_ip, ports.prometheus), config.prometheus_listen_address,
              ("127.0.0.1", ports.pod_discovery),
              (config.network.gateway_ip, ports.object_store),
              (config.network.gateway_ip, ports.apiserver)]
    busy = []
    for host, port in dict.fromkeys(wanted):
        with socket.socket() as probe:
            # SO_REUSEADDR: only a listener, not a TIME_WAIT leftover, makes bind fail.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    busy.append(f"{host}:{port}")
    return busy


def _binary_version(bin_dir: Path) -> str:
    output = subprocess.run([str(bin_dir / "kube-apiserver"), "--version"], capture_output=True,
                            text=True, check=True).stdout
    return output.split()[-1]


def _start_control_plane(config: SandboxConfig, table: ProcessTable, bin_dir: Path,
                         wanted: set[str]) -> None:
    if "etcd" in wanted:
        progress("starting etcd")
        table.start("etcd", controlplane.etcd_argv(bin_dir, config))
    controlplane.wait_for_http_ok(f"http://127.0.0.1:{config.ports.etcd_client}/health", 30, "etcd")
    if "kube-apiserver" in wanted:
        progress("starting kube-apiserver")
        table.start("kube-apiserver", controlplane.apiserver_argv(bin_dir, config))
    controlplane.wait_for_https_ok(f"{config.apiserver_url}/readyz", config, 60, "kube-apiserver")
    for name, argv, port in (
            ("kube-controller-manager", controlplane.controller_manager_argv(bin_dir, config),
             config.ports.controller_manager),
            ("kube-scheduler", controlplane.scheduler_argv(bin_dir, config), config.ports.scheduler)):
        if name in wanted:
            progress(f"starting {name}")
            table.start(name, argv)
        controlplane.wait_for_https_ok(f"https://127.0.0.1:{port}/healthz", config, 60, name,
                                       authenticated=False)


def _start_leaderworkerset(config: SandboxConfig, table: ProcessTable, bin_dir: Path, lws_dir: Path,
                           wanted: set[str]) -> None:
    """The LeaderWorkerSet controller: its CRDs, RBAC and webhook configurations first."""
    if "lws-controller-manager" not in wanted:
        return
    kubectl = [str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig)]
    progress("installing the LeaderWorkerSet CRDs, RBAC and webhooks; starting lws-controller-manager")
    leaderworkerset.install(kubectl, lws_dir, config)
    table.start("lws-controller-manager", leaderworkerset.argv(lws_dir, config))
    controlplane.wait_for_http_ok(f"http://127.0.0.1:{config.ports.lws_health}/healthz", 60,
                                  "lws-controller-manager")
    leaderworkerset.wait_until_serving(kubectl, timeout_seconds=60)


def _wait_for_nodes(config: SandboxConfig, bin_dir: Path, timeout_seconds: float) -> None:
    progress("waiting for nodes to be Ready")
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        result = subprocess.run(
            [str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig), "get", "nodes",
             "-o", "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}"],
            capture_output=True, text=True)
        statuses = result.stdout.split()
        if result.returncode == 0 and len(statuses) == len(config.node_names()) and set(statuses) == {"True"}:
            return
        time.sleep(0.3)
    raise SandboxError(f"nodes not Ready after {timeout_seconds:.0f} s; see {config.logs_dir}/node-agent.log")


def stop_everything(config: SandboxConfig, quiet: bool = False) -> None:
    """Stop recorded processes (even after a crash) and remove pod networks."""
    table = process_table(config)
    for name in reversed(COMPONENTS):
        record = table.get(name)
        if record is None:
            continue
        if not quiet and record.alive():
            progress(f"stopping {name} (pid {record.pid})")
        grace = NODE_AGENT_STOP_SECONDS if name == "node-agent" else 10
        table.stop(name, grace_seconds=grace)
    if os.geteuid() == 0:
        network.teardown_host_network(config.network, str(config.state_dir))


def down(config: SandboxConfig, purge: bool) -> None:
    stop_everything(config)
    if purge and config.state_dir.exists():
        shutil.rmtree(config.state_dir)
        progress(f"removed {config.state_dir}")
    progress("down")


def status(config: SandboxConfig) -> tuple[bool, str]:
    settings = load_settings(config)
    table = process_table(config)
    records = {record.name: record for record in table.recorded()}
    lines = []
    all_up = True
    for name in components(config):
        record = records.get(name)
        alive = record is not None and record.alive()
        all_up &= alive
        lines.append(f"{name:24} {'running (pid ' + str(record.pid) + ')' if alive else 'stopped'}")
    if settings:
        lines += [
            f"{'kubernetes':24} {settings['kubernetesVersion']}",
            f"{'leaderworkersets':24} sigs.k8s.io/lws {settings.get('lwsVersion', 'not installed')}",
            f"{'apiserver':24} {config.apiserver_url}",
            f"{'kubeconfig':24} {config.admin_kubeconfig}",
            f"{'prometheus':24} {config.prometheus_url}" + (
                f" (its proxy; Prometheus on {':'.join(map(str, config.prometheus_listen_address))}, "
                f"a reader's token in {config.prometheus_token_file})" if config.prometheus_auth == "bearer" else ""),
            f"{'object store (S3)':24} {config.object_store_url}, credentials "
            f"{config.object_store_credentials_file}",
            f"{'services':24} http://<clusterIP>:<port> from the host and from pods",
            f"{'cluster DNS':24} {config.cluster_dns_ip}:53, zone {CLUSTER_DOMAIN} (every pod's nameserver)",
            f"{'pod logs':24} {config.pods_dir}/<namespace>_<pod>_<uid8>/logs/<container>.log",
            f"{'audit log':24} {controlplane.audit_log(config)} (writes and lists of llmfleet's kinds)",
            f"{'state':24} {config.state_dir}",
        ]
    return all_up, "\n".join(lines)


def demo(config: SandboxConfig) -> str:
    """Install the operator with its Helm chart (the CRD, RBAC and an in-cluster
    Deployment autoscaling on the sandbox's Prometheus) and apply the demo
    LLMDeployment; return what to do next."""
    settings = load_settings(config)
    if settings is None or running_components(config) < set(components(config)):
        raise SandboxError("the sandbox is not running; start it with `llmfleet sandbox up`")
    bin_dir = Path(settings["binDir"])
    operator_log = (f"{config.pods_dir}/{OPERATOR_NAMESPACE}_{OPERATOR_RELEASE}-operator-*"
                    "/logs/operator.log")
    progress(f"installing the operator: helm upgrade --install {OPERATOR_RELEASE} "
             f"charts/llmfleet --namespace {OPERATOR_NAMESPACE} --wait")
    _run([str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig), "apply", "-f", "-"],
         "creating the operator's namespace and Prometheus credentials failed",
         input_text=yaml.safe_dump_all(operator_prerequisites(config, OPERATOR_NAMESPACE)))
    _run([str(bin_dir / "helm"), "--kubeconfig", str(config.admin_kubeconfig), "upgrade", "--install",
          OPERATOR_RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
          *operator_chart_values(config), "--wait", "--timeout", OPERATOR_READY_TIMEOUT],
         f"helm could not install the operator (its pod's log: {operator_log})", env=helm_environment(config))
    _run([str(bin_dir / "kubectl"), "--kubeconfig", str(config.admin_kubeconfig), "apply", "-f",
          str(DEMO_MANIFEST)], f"applying {DEMO_MANIFEST} failed")
    progress(f"applied {DEMO_MANIFEST.relative_to(controlplane.REPO_ROOT)}")
    return f"""The operator runs in the cluster (Helm release `{OPERATOR_RELEASE}`, namespace
`{OPERATOR_NAMESPACE}`, log: {operator_log})
and serves the LLMDeployment `chat` (Llama 3.1 70B on H100, emulated). Next:

  eval "$({Path(sys.executable).parent / 'llmfleet'} sandbox env)"
  kubectl get llmdeployment chat -w                # plan, replicas, p99 TTFT
  kubectl wait --for=condition=Ready llmdeployment/chat --timeout=180s
  llmfleet load --target $(kubectl get svc chat -o jsonpath='{{.spec.clusterIP}}'):8001 \\
      {shlex.join(DEMO_LOAD_ARGS[:4])} \\
      {shlex.join(DEMO_LOAD_ARGS[4:])} --output-dir /tmp/chat-load
  kubectl get llmdeployment chat -o jsonpath='{{.status.autoscaler}}'   # why it scaled
  open {config.prometheus_url} and query nv_inference_first_response_histogram_ms_bucket{prometheus_login(config)}
  helm list -n {OPERATOR_NAMESPACE}                     # the operator's release
"""


# What the chart mounts to reach a Prometheus behind basic auth or a bearer token, and TLS.
PROMETHEUS_PASSWORD_SECRET = "sandbox-prometheus-basic-auth"
PROMETHEUS_CA_CONFIG_MAP = "sandbox-prometheus-ca"


def prometheus_login(config: SandboxConfig) -> str:
    """How a person logs in to the sandbox's Prometheus, when it asks."""
    if config.prometheus_auth == "bearer":
        return (f"\n      (with the header `Authorization: Bearer <token>`, a token of "
                f"{PROMETHEUS_NAMESPACE}/{PROMETHEUS_READER} in {config.prometheus_token_file}; "
                f"its certificate is signed by {config.pki_dir / 'ca.crt'})")
    if config.prometheus_auth != "basic":
        return ""
    return (f"\n      (user {PROMETHEUS_USERNAME}, password in {config.prometheus_password_file}; "
            f"its certificate is signed by {config.pki_dir / 'ca.crt'})")


def operator_chart_values(config: SandboxConfig) -> list[str]:
    """The chart values this sandbox needs, as helm flags (with `operator_prerequisites` in the
    release namespace first)."""
    # Pods reach the sandbox's Prometheus at the host's address (the bridge gateway). The
    # operator needs no GPU: it runs on the CPU node, as on a real cluster, with no toleration.
    values = [f"prometheus.url={config.prometheus_url}"]
    if config.prometheus_auth == "basic":
        values += [f"prometheus.basicAuth.username={PROMETHEUS_USERNAME}",
                   f"prometheus.basicAuth.passwordSecret.name={PROMETHEUS_PASSWORD_SECRET}",
                   f"prometheus.tls.ca.name={PROMETHEUS_CA_CONFIG_MAP}"]
    if config.prometheus_auth == "bearer":
        # The operator's own projected token, as on OpenShift's Thanos querier.
        values += ["prometheus.bearerToken.serviceAccountToken=true",
                   f"prometheus.tls.ca.name={PROMETHEUS_CA_CONFIG_MAP}"]
    return [argument for value in values for argument in ("--set", value)]


def operator_prerequisites(config: SandboxConfig, namespace: str, release: str = OPERATOR_RELEASE) -> list[dict]:
    """The release namespace and what `operator_chart_values` names in it: the Prometheus
    password as a Secret and the sandbox CA as a ConfigMap, as a user keeps them. Behind the
    bearer-token proxy, a RoleBinding in PROMETHEUS_NAMESPACE lets the release's ServiceAccount
    read Prometheus, as a cluster admin grants it (OpenShift: cluster-monitoring-view)."""
    objects = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}]
    if config.prometheus_auth == "basic":
        objects.append(
            {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": PROMETHEUS_PASSWORD_SECRET, "namespace": namespace},
             "stringData": {"password": config.prometheus_password_file.read_text().strip()}})
    if config.prometheus_auth == "bearer":
        objects.append(rbacproxy.reader_binding(namespace, f"{release}-operator"))
    if config.prometheus_auth != "none":
        objects.append(
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": PROMETHEUS_CA_CONFIG_MAP, "namespace": namespace},
             "data": {"ca.crt": (config.pki_dir / "ca.crt").read_text()}})
    return objects


def helm_environment(config: SandboxConfig) -> dict[str, str]:
    """Helm's caches and settings inside the sandbox's state, not the user's home."""
    helm_home = config.state_dir / "helm"
    return {**os.environ, "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"), "HELM_DATA_HOME": str(helm_home / "data")}


def _run(argv: list[str], failure: str, env: dict[str, str] | None = None, input_text: str | None = None) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, env=env, input=input_text)
    if result.returncode != 0:
        raise SandboxError(f"{failure}:\n{(result.stderr or result.stdout).strip()}")


def environment_script(config: SandboxConfig) -> str:
    settings = load_settings(config)
    if settings is None:
        raise SandboxError("the sandbox has never been started here; run `llmfleet sandbox up`")
    # The matching kubectl and helm first, then this environment's llmfleet.
    return (f"export KUBECONFIG={config.admin_kubeconfig}\n"
            f"export PATH={settings['binDir']}:{Path(sys.executable).parent}:$PATH\n"
            + "".join(f"export {name}={shlex.quote(value)}\n"
                      for name, value in prometheus.client_environment(config).items()))
