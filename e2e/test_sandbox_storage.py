"""Dynamic volume provisioning in the sandbox: a claim without a storage class gets
the default class, a provisioned volume and binds; pods share what it holds; deleting
the claim deletes the volume and its directory."""

from __future__ import annotations

import pytest

from conftest import temporary_namespace, wait_for
from triton_fixtures import GPU_TOLERATION

NAMESPACE = "storage-e2e"
CLAIM = "llmfleet-engine-cache"


def _volumes_root(sandbox):
    return sandbox.state_dir / "hostpath" / "var" / "lib" / "llmfleet-sandbox" / "volumes"


def _pod(name: str, script: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
            "tolerations": [GPU_TOLERATION],
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script],
                            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
            "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": CLAIM}}],
        },
    }


def _phase(sandbox, name: str) -> str:
    pod = sandbox.kubectl_json("get", "pod", "-n", NAMESPACE, name)
    return pod.get("status", {}).get("phase", "")


@pytest.fixture(scope="module")
def bound_claim(sandbox):
    """The operator's engine-cache claim, as the chart writes it (no storageClassName)."""
    with temporary_namespace(sandbox, NAMESPACE):
        # Pods are admitted only once the namespace's default ServiceAccount exists.
        wait_for(lambda: sandbox.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False)
                 .startswith("NAME"), 30, "the default ServiceAccount")
        sandbox.apply([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM},
                        "spec": {"accessModes": ["ReadWriteMany"],
                                 "resources": {"requests": {"storage": "50Gi"}}}}], namespace=NAMESPACE)

        def bound():
            claim = sandbox.kubectl_json("get", "pvc", "-n", NAMESPACE, CLAIM)
            return claim if claim.get("status", {}).get("phase") == "Bound" else None

        yield wait_for(bound, 30, "the claim to be Bound")


def test_claim_without_a_class_gets_the_default_class_and_binds(sandbox, bound_claim):
    assert bound_claim["spec"]["storageClassName"] == "sandbox-local"
    volume = sandbox.kubectl_json("get", "pv", bound_claim["spec"]["volumeName"])
    assert volume["metadata"]["name"] == f"pvc-{bound_claim['metadata']['uid']}"
    assert volume["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == "sandbox.llmfleet.io/local"
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volume["spec"]["capacity"]["storage"] == "50Gi"
    assert volume["spec"]["claimRef"]["uid"] == bound_claim["metadata"]["uid"]
    assert (_volumes_root(sandbox) / volume["metadata"]["name"]).is_dir()
    reasons = sandbox.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                              f"involvedObject.name={CLAIM}", "-o", "jsonpath={.items[*].reason}").split()
    assert "ProvisioningSucceeded" in reasons


def test_a_second_pod_reads_what_the_first_wrote(sandbox, bound_claim):
    sandbox.apply([_pod("writer", "echo built-by-writer > /cache/engine.plan")], namespace=NAMESPACE)
    wait_for(lambda: _phase(sandbox, "writer") in ("Succeeded", "Failed"), 60, "the writer to finish")
    assert _phase(sandbox, "writer") == "Succeeded"
    sandbox.apply([_pod("reader", "grep -q built-by-writer /cache/engine.plan")], namespace=NAMESPACE)
    wait_for(lambda: _phase(sandbox, "reader") in ("Succeeded", "Failed"), 60, "the reader to finish")
    assert _phase(sandbox, "reader") == "Succeeded"
    plan = _volumes_root(sandbox) / bound_claim["spec"]["volumeName"] / "engine.plan"
    assert plan.read_text() == "built-by-writer\n"
    sandbox.kubectl("delete", "pod", "-n", NAMESPACE, "writer", "reader", "--wait=true")


def test_unsupported_claim_gets_a_provisioning_failed_event(sandbox, bound_claim):
    sandbox.apply([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "selective"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "selector": {"matchLabels": {"tier": "fast"}},
                             "resources": {"requests": {"storage": "1Gi"}}}}], namespace=NAMESPACE)

    def failed_message():
        return sandbox.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                               "involvedObject.name=selective,reason=ProvisioningFailed",
                               "-o", "jsonpath={.items[*].message}")
    assert "claim Selector is not supported" in wait_for(failed_message, 30, "ProvisioningFailed")
    sandbox.kubectl("delete", "pvc", "-n", NAMESPACE, "selective", "--wait=true")


def test_deleting_the_claim_deletes_the_volume_and_its_directory(sandbox, bound_claim):
    volume = bound_claim["spec"]["volumeName"]
    sandbox.kubectl("delete", "pvc", "-n", NAMESPACE, CLAIM, "--wait=true")
    wait_for(lambda: not sandbox.kubectl("get", "pv", volume, "--ignore-not-found"), 30,
             f"{volume} to be deleted")
    assert not (_volumes_root(sandbox) / volume).exists()


def test_status_lists_the_provisioner(sandbox):
    assert "volume-provisioner" in sandbox.llmfleet("status").stdout
