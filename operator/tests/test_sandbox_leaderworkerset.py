"""How the sandbox installs and runs the LeaderWorkerSet controller, without a cluster: the
upstream webhook configurations pointed at its loopback server, its RBAC, its configuration, and
the certificates and ports that come with it."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict

import yaml
from cryptography import x509

from llmfleet_sandbox import certs, leaderworkerset
from llmfleet_sandbox.config import SandboxConfig

# The shape of sigs.k8s.io/lws config/webhook (one webhook of each kind kept short).
MANIFESTS = """---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset}
  failurePolicy: Fail
  name: mleaderworkerset.kb.io
  rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE],
           resources: [leaderworkersets]}]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-leaderworkerset-x-k8s-io-v1-leaderworkerset}
  failurePolicy: Fail
  name: vleaderworkerset.kb.io
  rules: [{apiGroups: [leaderworkerset.x-k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE],
           resources: [leaderworkersets]}]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate--v1-pod}
  failurePolicy: Fail
  name: vpod.kb.io
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}]
  sideEffects: None
"""


def _pod_patch(name, path, operations):
    return [{"op": "replace", "path": "/webhooks/1", "value": {
        "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "name": name, "sideEffects": "None",
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "objectSelector": {"matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": ["pods"]}]}}]


def _build_dir(tmp_path):
    build = tmp_path / "lws"
    (build / "webhooks").mkdir(parents=True)
    (build / "rbac").mkdir()
    (build / "webhooks" / "manifests.yaml").write_text(MANIFESTS)
    (build / "webhooks" / "mutating-patch.yaml").write_text(
        yaml.safe_dump(_pod_patch("mpod.kb.io", "/mutate--v1-pod", ["CREATE"])))
    (build / "webhooks" / "validating-patch.yaml").write_text(
        yaml.safe_dump(_pod_patch("vpod.kb.io", "/validate--v1-pod", ["CREATE", "UPDATE"])))
    for name, rule in (("role.yaml", "leaderworkersets"), ("auth_proxy_role.yaml", "tokenreviews")):
        (build / "rbac" / name).write_text(yaml.safe_dump({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name.replace("auth_proxy_role.yaml", "proxy-role").replace("role.yaml", "manager-role"),
                         "labels": {"app.kubernetes.io/name": "clusterrole"}},
            "rules": [{"apiGroups": ["x"], "resources": [rule], "verbs": ["get"]}]}))
    return build


def _config(tmp_path, instance=5):
    config = SandboxConfig(state_dir=tmp_path / "state", instance=instance)
    certs.generate_pki(config.pki_dir, ["127.0.0.1"], [])
    return config


def test_the_upstream_webhooks_point_at_the_loopback_server_and_trust_the_sandbox_ca(tmp_path):
    config = _config(tmp_path)
    mutating, validating = leaderworkerset.webhook_configurations(_build_dir(tmp_path), config)
    assert (mutating["metadata"]["name"], validating["metadata"]["name"]) == (
        "lws-mutating-webhook-configuration", "lws-validating-webhook-configuration")
    ca_bundle = base64.b64encode((config.pki_dir / "ca.crt").read_bytes()).decode()
    port = config.ports.lws_webhook
    assert [webhook["clientConfig"] for webhook in mutating["webhooks"]] == [
        {"url": f"https://127.0.0.1:{port}/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset", "caBundle": ca_bundle},
        {"url": f"https://127.0.0.1:{port}/mutate--v1-pod", "caBundle": ca_bundle}]
    # The release's patches: the pod webhooks see only pods of a LeaderWorkerSet.
    for configuration in (mutating, validating):
        assert configuration["webhooks"][1]["objectSelector"]["matchExpressions"][0]["key"] == \
            "leaderworkerset.sigs.k8s.io/name"
        assert "objectSelector" not in configuration["webhooks"][0]


def test_the_upstream_cluster_roles_are_bound_to_the_controllers_user(tmp_path):
    objects = leaderworkerset.rbac_objects(_build_dir(tmp_path))
    assert [(item["kind"], item["metadata"]["name"]) for item in objects] == [
        ("ClusterRole", "lws-manager-role"), ("ClusterRoleBinding", "lws-manager-rolebinding"),
        ("ClusterRole", "lws-proxy-role"), ("ClusterRoleBinding", "lws-proxy-rolebinding")]
    assert objects[1]["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                       "name": "lws-controller-manager"}]
    assert objects[0]["rules"][0]["resources"] == ["leaderworkersets"]


def test_the_controller_runs_without_leader_election_or_its_own_certificates_on_loopback(tmp_path):
    config = _config(tmp_path)
    argv = leaderworkerset.argv(tmp_path / "lws", config)
    assert argv[0] == str(tmp_path / "lws" / "lws-controller-manager")
    assert "--leader-elect=false" in argv
    assert f"--kubeconfig={config.state_dir / 'lws-controller-manager.kubeconfig'}" in argv
    configuration = yaml.safe_load((config.state_dir / "lws" / "configuration.yaml").read_text())
    assert configuration["internalCertManagement"] == {"enable": False}
    assert configuration["leaderElection"] == {"leaderElect": False}
    assert configuration["webhook"]["host"] == "127.0.0.1"
    assert configuration["webhook"]["port"] == config.ports.lws_webhook
    assert configuration["health"]["healthProbeBindAddress"] == f"127.0.0.1:{config.ports.lws_health}"
    cert_dir = config.state_dir / "lws" / "certs"
    serving = x509.load_pem_x509_certificate((cert_dir / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((config.pki_dir / "ca.crt").read_bytes())
    assert serving.issuer == ca.subject and (cert_dir / "tls.key").exists()
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


def test_an_identity_added_since_the_pki_was_made_gets_a_certificate_from_the_same_ca(tmp_path):
    config = _config(tmp_path)
    ca_before = (config.pki_dir / "ca.crt").read_bytes()
    admin_before = (config.pki_dir / "admin.crt").read_bytes()
    (config.pki_dir / "lws-controller-manager.crt").unlink()  # a sandbox made before the controller
    certs.generate_pki(config.pki_dir, ["127.0.0.1"], [])
    assert (config.pki_dir / "ca.crt").read_bytes() == ca_before
    assert (config.pki_dir / "admin.crt").read_bytes() == admin_before
    issued = x509.load_pem_x509_certificate((config.pki_dir / "lws-controller-manager.crt").read_bytes())
    assert issued.issuer == x509.load_pem_x509_certificate(ca_before).subject
    assert issued.subject.rfc4514_string() == "CN=lws-controller-manager"


def test_a_settings_file_from_before_the_controller_gets_the_instances_new_ports(tmp_path):
    config = SandboxConfig(state_dir=tmp_path, instance=5)
    saved = json.loads(json.dumps(config.to_dict()))
    for name in ("lws_webhook", "lws_metrics", "lws_health"):
        del saved["ports"][name]
    assert asdict(SandboxConfig.from_dict(saved).ports) == asdict(config.ports)
