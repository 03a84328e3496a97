"""The sandbox volume provisioner without a cluster: which claims are its own, the
PersistentVolume it makes for a claim, when it deletes one, and its reactions
(events, directories, idempotence) against an in-memory API."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet_sandbox import provisioner
from llmfleet_sandbox.provisioner import (
    PROVISIONER_NAME,
    Provisioner,
    claim_is_ours,
    needs_volume,
    should_delete,
    storage_class_manifest,
    unsupported,
    volume_directory,
    volume_manifest,
)

UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"


def claim(**spec) -> dict:
    return {
        "metadata": {"name": "llmfleet-engine-cache", "namespace": "serving", "uid": UID},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "sandbox-local",
                 "resources": {"requests": {"storage": "100Gi"}}, **spec},
        "status": {"phase": "Pending"},
    }


def released(volume: dict) -> dict:
    return {**volume, "status": {"phase": "Released"}}


CLASS = storage_class_manifest()


def test_the_storage_class_is_the_default_and_deletes_with_its_claims():
    assert CLASS["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    assert CLASS["provisioner"] == PROVISIONER_NAME
    assert (CLASS["reclaimPolicy"], CLASS["volumeBindingMode"]) == ("Delete", "Immediate")


def test_volume_for_a_claim_is_a_hostpath_prebound_to_it():
    volume = volume_manifest(claim(), CLASS)
    assert volume["metadata"] == {"name": f"pvc-{UID}",
                                  "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER_NAME}}
    spec = volume["spec"]
    assert spec["capacity"] == {"storage": "100Gi"}
    assert spec["accessModes"] == ["ReadWriteMany"]
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["storageClassName"] == "sandbox-local"
    assert spec["claimRef"] == {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                "name": "llmfleet-engine-cache", "namespace": "serving", "uid": UID}
    assert spec["hostPath"]["path"] == f"/var/lib/llmfleet-sandbox/volumes/pvc-{UID}"


def test_volume_directory_is_where_the_node_agent_maps_the_hostpath(tmp_path):
    assert volume_directory(tmp_path, "pvc-x") == tmp_path / "hostpath/var/lib/llmfleet-sandbox/volumes/pvc-x"


@pytest.mark.parametrize("class_name, storage_class, ours", [
    ("sandbox-local", CLASS, True),
    ("sandbox-local", None, False),  # the class does not exist
    ("other", {**CLASS, "metadata": {"name": "other"}, "provisioner": "ebs.csi.aws.com"}, False),
    ("mine-too", {**CLASS, "metadata": {"name": "mine-too"}}, True),  # any class naming us
    ("", CLASS, False),  # "" asks for no dynamic provisioning
    (None, CLASS, False),  # not yet given the default class
])
def test_claims_are_ours_when_their_class_names_this_provisioner(class_name, storage_class, ours):
    assert claim_is_ours(claim(storageClassName=class_name), storage_class) is ours


def test_only_unbound_live_pending_claims_need_a_volume():
    assert needs_volume(claim(), CLASS)
    assert not needs_volume(claim(volumeName="pvc-other"), CLASS)
    assert not needs_volume({**claim(), "status": {"phase": "Bound"}}, CLASS)
    deleting = claim()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not needs_volume(deleting, CLASS)


def test_wait_for_first_consumer_waits_for_the_scheduler_to_pick_a_node():
    waiting_class = {**CLASS, "volumeBindingMode": "WaitForFirstConsumer"}
    assert not needs_volume(claim(), waiting_class)
    selected = claim()
    selected["metadata"]["annotations"] = {"volume.kubernetes.io/selected-node": "gpu-node-1"}
    assert needs_volume(selected, waiting_class)


@pytest.mark.parametrize("spec, words", [
    ({"selector": {"matchLabels": {"a": "b"}}}, "Selector"),
    ({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}, "dataSource"),
    ({"dataSourceRef": {"kind": "VolumeSnapshot", "name": "snap"}}, "dataSource"),
    ({"volumeMode": "Block"}, "Block"),
])
def test_unsupported_requests_are_named(spec, words):
    assert words in unsupported(claim(**spec))


def test_plain_claims_are_supported():
    assert unsupported(claim()) is None


def test_only_released_volumes_of_ours_under_delete_are_deleted():
    volume = volume_manifest(claim(), CLASS)
    assert should_delete(released(volume))
    assert not should_delete({**volume, "status": {"phase": "Bound"}})
    retained = copy.deepcopy(volume)
    retained["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    assert not should_delete(released(retained))
    foreign = copy.deepcopy(volume)
    foreign["metadata"]["annotations"] = {}
    assert not should_delete(released(foreign))


# -- reactions, against an in-memory API ---------------------------------------------------


class FakeApi:
    def __init__(self):
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda obj: obj)
        self.volumes: dict[str, dict] = {}
        self.classes = {CLASS["metadata"]["name"]: CLASS}
        self.events: list = []
        self.reject_volumes = False

    def read_persistent_volume(self, name):
        if name not in self.volumes:
            raise ApiException(status=404, reason="Not Found")
        return self.volumes[name]

    def create_persistent_volume(self, body):
        if self.reject_volumes:
            raise ApiException(status=500, reason="Internal Server Error")
        self.volumes[body["metadata"]["name"]] = {**body, "metadata": {**body["metadata"], "uid": "pv-uid"}}

    def delete_persistent_volume(self, name, body):
        del self.volumes[name]

    def create_namespaced_event(self, namespace, body):
        self.events.append((namespace, body.involved_object.name, body.reason, body.message))

    def read_storage_class(self, name):
        if name not in self.classes:
            raise ApiException(status=404, reason="Not Found")
        return self.classes[name]


@pytest.fixture
def api():
    return FakeApi()


@pytest.fixture
def subject(api, tmp_path):
    return Provisioner(tmp_path, api, api)


def reasons(api) -> list[str]:
    return [reason for _, _, reason, _ in api.events]


def test_a_claim_gets_a_volume_and_a_directory_once(api, subject, tmp_path):
    subject.handle_claim("ADDED", claim())
    assert list(api.volumes) == [f"pvc-{UID}"]
    assert volume_directory(tmp_path, f"pvc-{UID}").is_dir()
    assert reasons(api) == ["Provisioning", "ProvisioningSucceeded"]
    # The PV controller's annotations and a restart's relist bring the claim again.
    subject.handle_claim("MODIFIED", claim())
    Provisioner(tmp_path, api, api).handle_claim("ADDED", claim())
    assert len(api.volumes) == 1 and len(api.events) == 2


def test_an_unsupported_claim_fails_once_with_a_clear_event(api, subject):
    bad = claim(selector={"matchLabels": {"tier": "fast"}})
    subject.handle_claim("ADDED", bad)
    subject.handle_claim("MODIFIED", bad)
    assert api.volumes == {}
    [(namespace, name, reason, message)] = api.events
    assert (namespace, name, reason) == ("serving", "llmfleet-engine-cache", "ProvisioningFailed")
    assert message == 'failed to provision volume with StorageClass "sandbox-local": claim Selector is not supported'


def test_a_failed_create_leaves_no_directory_and_is_retried(api, subject, tmp_path):
    api.reject_volumes = True
    subject.handle_claim("ADDED", claim())
    assert reasons(api) == ["Provisioning", "ProvisioningFailed"]
    assert not volume_directory(tmp_path, f"pvc-{UID}").exists()
    api.reject_volumes = False
    subject.handle_claim("MODIFIED", claim())
    assert list(api.volumes) == [f"pvc-{UID}"]
    assert reasons(api)[-1] == "ProvisioningSucceeded"


def test_claims_of_other_classes_are_left_alone(api, subject):
    subject.handle_claim("ADDED", claim(storageClassName="missing"))
    subject.handle_claim("ADDED", claim(storageClassName=""))
    assert api.volumes == {} and api.events == []


def test_a_released_volume_and_its_directory_are_deleted(api, subject, tmp_path):
    subject.handle_claim("ADDED", claim())
    name = f"pvc-{UID}"
    (volume_directory(tmp_path, name) / "engine.plan").write_text("built")
    subject.handle_volume("MODIFIED", released(api.volumes[name]))
    assert api.volumes == {}
    assert not volume_directory(tmp_path, name).exists()


def test_a_retained_volume_keeps_its_directory(api, subject, tmp_path):
    subject.handle_claim("ADDED", claim())
    name = f"pvc-{UID}"
    volume = api.volumes[name]
    volume["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    subject.handle_volume("MODIFIED", released(volume))
    subject.handle_volume("DELETED", volume)
    assert volume_directory(tmp_path, name).is_dir()


def test_one_bad_object_does_not_stop_the_others(api, subject):
    handled = []

    def handler(event_type, item):
        if item["metadata"]["name"] == "bad":
            raise KeyError("spec")
        handled.append(item["metadata"]["name"])

    for name in ("bad", "good"):
        subject.guarded(handler, "ADDED", {"metadata": {"name": name}})
    assert handled == ["good"]


def test_the_storage_class_is_created_once(api, subject):
    created = []

    def create_storage_class(body):
        if created:
            raise ApiException(status=409, reason="Conflict")
        created.append(body)

    api.create_storage_class = create_storage_class
    subject.ensure_storage_class()
    subject.ensure_storage_class()
    assert created == [provisioner.storage_class_manifest()]
