"""The Helm chart and the operator image: defaults agree with the project, the chart renders
and lints with the real helm, and what it renders is what `llmfleet run` accepts."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from llmfleet.catalog.release_record import UPSTREAM_CODE_ROOT, load_release_record, release_names
from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.catalog.router_record import load_router_record
from llmfleet.cli import build_parser
from llmfleet.render import identity, serving

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "llmfleet"
CONTAINERFILE = REPO_ROOT / "Containerfile"
PROJECT_VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in joined.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def test_containerfile_installs_the_product_and_not_the_sandbox():
    instructions = _instructions(CONTAINERFILE.read_text())
    copied = [shlex.split(arguments)[:-1] for kind, arguments in instructions
              if kind == "COPY" and not arguments.startswith("--from")]
    sources = [source for sources in copied for source in sources]
    assert "operator/llmfleet" in sources
    # Copying operator/ (or the whole tree) would let setuptools' discovery (llmfleet*) take
    # the sandbox package as well.
    assert not [source for source in sources if source in (".", "operator", "operator/")
                or "llmfleet_sandbox" in source]
    bases = [arguments.split()[0] for kind, arguments in instructions if kind == "FROM"]
    assert bases and set(bases) == {"python:3.11-slim"}
    assert ("COPY", f"--from=upstream-code /upstream {UPSTREAM_CODE_ROOT}") in instructions
    assert ("USER", "1000:1000") in instructions
    entrypoint = [json.loads(arguments) for kind, arguments in instructions if kind in ("ENTRYPOINT", "CMD")]
    assert entrypoint == [["llmfleet"], ["run"]]


def test_containerfile_carries_every_upstream_file_the_records_name():
    (entries,) = [arguments.split("=", 1)[1].strip('"').split() for kind, arguments
                  in _instructions(CONTAINERFILE.read_text()) if kind == "ARG" and arguments.startswith("UPSTREAM_FILES=")]
    recorded = {f"{file.repository}@{file.ref}:{file.path}" for name in release_names()
                for file in load_release_record(name).model_code}
    assert sorted(entries) == sorted(recorded)


def test_default_image_is_the_project_version():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert values["image"]["repository"] == "llmfleet/operator"
    assert values["image"]["tag"] == PROJECT_VERSION == chart["appVersion"]


def _helm() -> Path | None:
    """The helm that operator/controlplane/build.sh builds into the cache (not built here)."""
    explicit = os.environ.get("LLMFLEET_CONTROLPLANE_BIN")
    if explicit:
        return Path(explicit) / "helm" if (Path(explicit) / "helm").exists() else None
    cache = os.environ.get("LLMFLEET_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmfleet")
    built = sorted(path for path in (Path(cache) / "bin").glob("*/helm") if not path.parent.name.endswith(".partial"))
    return built[-1] if built else None


HELM = _helm()
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm is not built yet: run operator/controlplane/build.sh (`make controlplane`)")


def _helm_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)


def _template(*sets: str, release: str = "llmfleet") -> dict[str, dict]:
    arguments = [argument for value in sets for argument in ("--set", value)]
    result = _helm_run("template", release, str(CHART), "--namespace", "llmfleet-system", *arguments)
    assert result.returncode == 0, result.stderr
    documents = [document for document in yaml.safe_load_all(result.stdout) if document]
    return {f"{document['kind']}/{document['metadata']['name']}": document for document in documents}


def _operator_flags(rendered: dict[str, dict]):
    """The rendered container's command line, parsed by `llmfleet run`'s own parser."""
    (deployment,) = [document for key, document in rendered.items() if key.startswith("Deployment/")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "-m", "llmfleet", "run"]
    return build_parser().parse_args(["run", *container["args"]])


@needs_helm
def test_defaults_render_the_operator_under_its_own_account():
    rendered = _template()
    assert set(rendered) == {"ServiceAccount/llmfleet-operator", "ClusterRole/llmfleet-operator",
                             "ClusterRoleBinding/llmfleet-operator", "Role/llmfleet-operator",
                             "RoleBinding/llmfleet-operator", "Deployment/llmfleet-operator",
                             "ClusterRole/llmfleet-endpoint-picker", "ClusterRole/llmfleet-rank-launcher"}
    assert rendered["Deployment/llmfleet-operator"]["spec"]["replicas"] == 1
    pod = rendered["Deployment/llmfleet-operator"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "llmfleet-operator"
    assert pod["securityContext"]["runAsUser"] == 1000
    container = pod["containers"][0]
    assert container["image"] == f"llmfleet/operator:{PROJECT_VERSION}"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    flags = _operator_flags(rendered)
    assert (flags.engine_cache_claim, flags.engine_cache_storage_class, flags.engine_cache_size) == (
        "llmfleet-engine-cache", None, "500Gi")
    assert flags.namespace == []
    assert flags.liveness == "http://0.0.0.0:8080/healthz"
    # Leader election on a Lease in the release namespace, named by the downward API.
    assert flags.leader_election_namespace == "$(POD_NAMESPACE)"
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    (lease_rule,) = rendered["Role/llmfleet-operator"]["rules"]
    assert rendered["Role/llmfleet-operator"]["metadata"]["namespace"] == "llmfleet-system"
    assert (lease_rule["apiGroups"], lease_rule["resources"]) == (["coordination.k8s.io"], ["leases"])
    # Serving pods copy the Triton model code from the operator's own image.
    assert flags.model_code_image == container["image"]
    assert "--prometheus-url" not in " ".join(container["args"])
    assert "--observation" not in " ".join(container["args"])  # the operator's own defaults
    # Least privilege: named resources and verbs only.
    for rule in rendered["ClusterRole/llmfleet-operator"]["rules"]:
        assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]


@needs_helm
def test_the_endpoint_pickers_role_grants_what_the_pinned_release_reads_and_the_operator_may_only_bind_it():
    rendered = _template()
    picker_rules = {(group, resource, tuple(sorted(rule["verbs"])))
                    for rule in rendered["ClusterRole/llmfleet-endpoint-picker"]["rules"]
                    for group in rule["apiGroups"] for resource in rule["resources"]}
    recorded = {(entry["api_group"], entry["resource"], tuple(sorted(entry["verbs"])))
                for entry in load_router_record().rbac}
    assert picker_rules == recorded
    bind = [rule for rule in rendered["ClusterRole/llmfleet-operator"]["rules"] if "clusterroles" in rule["resources"]]
    assert bind == [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                     "resourceNames": ["llmfleet-endpoint-picker", "llmfleet-rank-launcher"], "verbs": ["bind"]}]


@needs_helm
def test_the_rank_launchers_role_grants_what_the_recipe_uses_and_the_operator_creates_groups():
    rendered = _template()
    launcher_rules = {(group, resource, tuple(sorted(rule["verbs"])))
                      for rule in rendered["ClusterRole/llmfleet-rank-launcher"]["rules"]
                      for group in rule["apiGroups"] for resource in rule["resources"]}
    assert launcher_rules == {(group, resource, tuple(sorted(verbs)))
                              for group, resource, verbs in load_lws_record().permissions}
    assert _operator_flags(rendered).rank_launcher_cluster_role == "llmfleet-rank-launcher"
    operator_rules = {(group, resource) for rule in rendered["ClusterRole/llmfleet-operator"]["rules"]
                      for group in rule["apiGroups"] for resource in rule["resources"]}
    assert ("leaderworkerset.x-k8s.io", "leaderworkersets") in operator_rules
    assert _operator_flags(rendered).endpoint_picker_cluster_role == "llmfleet-endpoint-picker"


@needs_helm
def test_two_releases_own_separate_picker_roles_and_each_operator_binds_its_own():
    """Cluster-scoped objects are named per release: a second release (another set of watched
    namespaces) installs beside the first instead of failing on the first's ClusterRole."""
    first, second = _template(), _template(release="llmfleet-b")
    cluster_scoped = {key for key, document in first.items() if "namespace" not in document["metadata"]}
    assert cluster_scoped and not cluster_scoped & {key for key, document in second.items()
                                                     if "namespace" not in document["metadata"]}
    assert "ClusterRole/llmfleet-b-endpoint-picker" in second
    assert _operator_flags(second).endpoint_picker_cluster_role == "llmfleet-b-endpoint-picker"
    (bind,) = [rule for rule in second["ClusterRole/llmfleet-b-operator"]["rules"] if "clusterroles" in rule["resources"]]
    assert bind["resourceNames"] == ["llmfleet-b-endpoint-picker", "llmfleet-b-rank-launcher"]


@needs_helm
def test_values_become_operator_flags_and_a_pod_monitor():
    rendered = _template("prometheus.url=http://prometheus-operated.monitoring:9090",
                         "engineCache.storageClassName=nfs-rwx", "engineCache.size=2Ti",
                         "watchNamespaces={team-a,team-b}", "podMonitor.enabled=true",
                         "prometheus.scrapeIntervalSeconds=30", "podMonitor.labels.release=kube-prometheus-stack",
                         "liveReplanning.observationIntervalSeconds=600",
                         "liveReplanning.observationWindowSeconds=120")
    flags = _operator_flags(rendered)
    assert flags.prometheus_url == "http://prometheus-operated.monitoring:9090"
    # One value: the PodMonitor scrapes at the interval the operator derives its windows from.
    assert flags.prometheus_scrape_interval_seconds == 30
    assert (flags.observation_interval_seconds, flags.observation_window_seconds) == (600, 120)
    assert (flags.engine_cache_storage_class, flags.engine_cache_size) == ("nfs-rwx", "2Ti")
    assert flags.namespace == ["team-a", "team-b"]
    monitor = rendered["PodMonitor/llmfleet-serving"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    # It selects exactly what the operator renders for serving pods.
    assert monitor["spec"]["selector"]["matchLabels"] == {
        identity.MANAGED_BY_LABEL: identity.PROJECT, identity.COMPONENT_LABEL: serving.COMPONENT}
    endpoint, = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "30s")
    assert "metrics" in dict(serving.PORTS)
    # The autoscaler's PromQL selects a deployment by its pod labels, labelmap-named.
    assert {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"} in endpoint["relabelings"]


@needs_helm
def test_the_pod_monitor_scrapes_every_15_s_when_no_interval_is_set_and_the_operator_then_reads_it():
    rendered = _template("podMonitor.enabled=true", "prometheus.url=http://prometheus:9090")
    endpoint, = rendered["PodMonitor/llmfleet-serving"]["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == "15s"
    assert _operator_flags(rendered).prometheus_scrape_interval_seconds is None


def _mounted(rendered: dict[str, dict]) -> dict[str, dict]:
    """Mount path -> the volume mounted there, in the operator pod."""
    pod = rendered["Deployment/llmfleet-operator"]["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod.get("volumes") or []}
    return {mount["mountPath"]: volumes[mount["name"]] for mount in pod["containers"][0].get("volumeMounts") or []}


@needs_helm
def test_prometheus_credentials_come_from_mounted_secrets_and_become_file_flags():
    rendered = _template("prometheus.url=https://mimir.monitoring/prometheus",
                         "prometheus.basicAuth.username=llmfleet", "prometheus.basicAuth.passwordSecret.name=mimir-auth",
                         "prometheus.tls.ca.name=monitoring-ca", "prometheus.tls.serverName=mimir.monitoring.svc",
                         "prometheus.tls.clientCertSecret=llmfleet-client", "prometheus.headers.X-Scope-OrgID=team-a")
    flags, mounted = _operator_flags(rendered), _mounted(rendered)
    assert flags.prometheus_url == "https://mimir.monitoring/prometheus"
    assert flags.prometheus_basic_auth_username == "llmfleet"
    assert flags.prometheus_header == ["X-Scope-OrgID=team-a"]
    assert flags.prometheus_server_name == "mimir.monitoring.svc"
    # Every file flag names a key inside a volume of the Secret or ConfigMap the values name.
    for path, source in ((flags.prometheus_basic_auth_password_file, {"secret": {"secretName": "mimir-auth"}}),
                         (flags.prometheus_ca_file, {"configMap": {"name": "monitoring-ca"}}),
                         (flags.prometheus_client_cert_file, {"secret": {"secretName": "llmfleet-client"}}),
                         (flags.prometheus_client_key_file, {"secret": {"secretName": "llmfleet-client"}})):
        volume = mounted[str(path.parent)]
        assert {key: value for key, value in volume.items() if key != "name"} == source
    assert (flags.prometheus_basic_auth_password_file.name, flags.prometheus_ca_file.name) == ("password", "ca.crt")
    assert _operator_flags(rendered).prometheus_bearer_token_file is None


@needs_helm
def test_the_service_account_token_or_a_secret_is_the_bearer_token():
    own = _template("prometheus.url=https://thanos-querier.openshift-monitoring.svc:9091",
                    "prometheus.bearerToken.serviceAccountToken=true")
    assert str(_operator_flags(own).prometheus_bearer_token_file) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert _mounted(own) == {}  # the kubelet mounts the token anyway
    secret = _template("prometheus.url=https://p", "prometheus.bearerToken.secret.name=prom-token")
    path = _operator_flags(secret).prometheus_bearer_token_file
    assert path.name == "token" and _mounted(secret)[str(path.parent)]["secret"] == {"secretName": "prom-token"}


def _found_by_the_dashboard_sidecars(labels: dict) -> bool:
    """Whether the Grafana sidecars of the stacks on record (llmfleet_dev/records) load a
    ConfigMap with these labels: the label's key, and its value where the stack asks one."""
    record = yaml.safe_load((REPO_ROOT / "operator" / "llmfleet_dev" / "records" / "dashboard-sidecars.yaml").read_text())
    assert set(record) == {"kube-prometheus-stack", "grafana"}
    return all(stack["label"] in labels and stack["label_value"] in ("", labels[stack["label"]])
               for stack in record.values())


@needs_helm
def test_rules_dashboard_and_the_operators_own_pod_monitor_render_what_the_operator_generates():
    from llmfleet.render import monitoring

    rendered = _template("prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack",
                         "grafanaDashboard.enabled=true", "podMonitor.enabled=true")
    rule = rendered["PrometheusRule/llmfleet-slo"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == monitoring.prometheus_rules()
    dashboard = rendered["ConfigMap/llmfleet-dashboard"]
    assert _found_by_the_dashboard_sidecars(dashboard["metadata"]["labels"])
    assert json.loads(dashboard["data"]["llmfleet-deployment.json"]) == monitoring.grafana_dashboard()
    operator_monitor = rendered["PodMonitor/llmfleet-operator"]
    endpoint, = operator_monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["honorLabels"], endpoint["interval"]) == ("metrics", True, "15s")
    pod = rendered["Deployment/llmfleet-operator"]["spec"]["template"]["spec"]
    assert operator_monitor["spec"]["selector"]["matchLabels"].items() <= \
        rendered["Deployment/llmfleet-operator"]["spec"]["template"]["metadata"]["labels"].items()
    port = next(p for p in pod["containers"][0]["ports"] if p["name"] == "metrics")["containerPort"]
    assert _operator_flags(rendered).metrics_address == f"0.0.0.0:{port}"
    assert not {key for key in _template() if key.startswith(("PrometheusRule/", "ConfigMap/"))}  # off by default


@needs_helm
def test_basic_auth_without_its_password_secret_fails_the_install_naming_the_value():
    result = _helm_run("template", "llmfleet", str(CHART), "--set", "prometheus.basicAuth.username=llmfleet")
    assert result.returncode != 0 and "prometheus.basicAuth.passwordSecret.name is required" in result.stderr


@needs_helm
@pytest.mark.parametrize("value", ["sandboxMode=true", "engineCache.create=false", "prometheus.address=x",
                                   "podMonitor.interval=30s", "prometheus.scrapeIntervalSeconds=0",
                                   "prometheus.url=http://p/?tenant=a", "prometheus.tls.ca.kind=File"])
def test_schema_rejects_unknown_and_removed_values(value):
    result = _helm_run("template", "llmfleet", str(CHART), "--set", value)
    assert result.returncode != 0
    assert "schema" in result.stderr.lower()


@needs_helm
@pytest.mark.parametrize("sets", [[], ["podMonitor.enabled=true", "prometheus.url=http://prometheus:9090"],
                                  ["prometheus.url=https://p", "prometheus.basicAuth.username=u",
                                   "prometheus.basicAuth.passwordSecret.name=s", "prometheus.tls.ca.kind=Secret",
                                   "prometheus.tls.ca.name=ca", "prometheus.tls.clientCertSecret=c"],
                                  ["prometheusRule.enabled=true", "grafanaDashboard.enabled=true",
                                   "grafanaDashboard.namespace=monitoring"]])
def test_helm_lint_passes(sets):
    arguments = [argument for value in sets for argument in ("--set", value)]
    result = _helm_run("lint", "--strict", str(CHART), *arguments)
    assert result.returncode == 0, result.stdout + result.stderr
