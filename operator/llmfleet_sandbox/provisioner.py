"""The sandbox's volume provisioner: PersistentVolumes on demand for PersistentVolumeClaims.

It plays the part a CSI driver's external provisioner plays on a real cluster.
At start it makes sure the default StorageClass `sandbox-local` exists, then
watches claims: for each Pending claim of a class naming this provisioner it
creates a directory and a hostPath PersistentVolume pre-bound to the claim
(claimRef), and the controller-manager's PV controller binds the two. When a
claim goes away and its volume becomes Released under reclaimPolicy Delete, it
deletes the directory and the PersistentVolume.

Volumes are hostPath volumes under /var/lib/llmfleet-sandbox/volumes; the node
agent resolves hostPath inside the sandbox's state directory, so the data lives
in <state>/hostpath/var/lib/llmfleet-sandbox/volumes/<volume> and every node
(they are all this machine) sees the same directory: ReadWriteMany works.
Run as `python -m llmfleet_sandbox.provisioner --settings FILE`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kubernetes import client, config as kube_config
from kubernetes.client.exceptions import ApiException

from llmfleet_sandbox.config import SANDBOX_LABEL, SandboxConfig
from llmfleet_sandbox.informer import each_object, watch_forever

PROVISIONER_NAME = "sandbox.llmfleet.io/local"
STORAGE_CLASS_NAME = "sandbox-local"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
PROVISIONED_BY_ANNOTATION = "pv.kubernetes.io/provisioned-by"
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
VOLUMES_HOST_PATH = "/var/lib/llmfleet-sandbox/volumes"
# Watches end after this long and everything is listed again, like an informer's
# resync: that is the retry for a claim whose provisioning failed transiently.
RESYNC_SECONDS = 60


def storage_class_manifest() -> dict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS_NAME,
                     "annotations": {DEFAULT_CLASS_ANNOTATION: "true"},
                     "labels": {SANDBOX_LABEL: "true"}},
        "provisioner": PROVISIONER_NAME,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_name(claim: dict) -> str:
    # Named after the claim's uid, so a restarted provisioner finds what it made.
    return f"pvc-{claim['metadata']['uid']}"


def volume_directory(state_dir: Path, name: str) -> Path:
    """Where the node agent puts the hostPath of volume `name`."""
    return state_dir / "hostpath" / VOLUMES_HOST_PATH.lstrip("/") / name


def claim_is_ours(claim: dict, storage_class: dict | None) -> bool:
    """The claim names a StorageClass, and that class names this provisioner."""
    class_name = (claim.get("spec") or {}).get("storageClassName")
    return (storage_class is not None and bool(class_name)
            and storage_class["metadata"]["name"] == class_name
            and storage_class.get("provisioner") == PROVISIONER_NAME)


def needs_volume(claim: dict, storage_class: dict | None) -> bool:
    """An unbound, live claim of ours that may be provisioned now."""
    if not claim_is_ours(claim, storage_class):
        return False
    metadata, spec = claim["metadata"], claim.get("spec") or {}
    if metadata.get("deletionTimestamp") or spec.get("volumeName"):
        return False
    if (claim.get("status") or {}).get("phase", "Pending") != "Pending":
        return False
    # WaitForFirstConsumer: the scheduler marks the claim once a pod needing it is placed.
    waits = storage_class.get("volumeBindingMode") == "WaitForFirstConsumer"
    return not waits or SELECTED_NODE_ANNOTATION in (metadata.get("annotations") or {})


def unsupported(claim: dict) -> str | None:
    """Why this provisioner cannot serve the claim, or None."""
    spec = claim.get("spec") or {}
    if spec.get("selector"):
        return "claim Selector is not supported"
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        return "cloning and restoring from a dataSource are not supported"
    if spec.get("volumeMode", "Filesystem") != "Filesystem":
        return f'volumeMode "{spec["volumeMode"]}" is not supported (only Filesystem)'
    if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
        return "the claim requests no storage size"
    return None


def volume_manifest(claim: dict, storage_class: dict) -> dict:
    metadata, spec = claim["metadata"], claim["spec"]
    name = volume_name(claim)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY_ANNOTATION: PROVISIONER_NAME}},
        "spec": {
            # A directory has no size limit; the volume reports what was asked for.
            "capacity": {"storage": spec["resources"]["requests"]["storage"]},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
            "storageClassName": storage_class["metadata"]["name"],
            "volumeMode": "Filesystem",
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "name": metadata["name"], "namespace": metadata["namespace"],
                         "uid": metadata["uid"]},
            "hostPath": {"path": f"{VOLUMES_HOST_PATH}/{name}", "type": "DirectoryOrCreate"},
        },
    }


def is_ours(volume: dict) -> bool:
    annotations = volume["metadata"].get("annotations") or {}
    return annotations.get(PROVISIONED_BY_ANNOTATION) == PROVISIONER_NAME


def should_delete(volume: dict) -> bool:
    """A volume of ours whose claim is gone, under reclaimPolicy Delete."""
    return (is_ours(volume) and not volume["metadata"].get("deletionTimestamp")
            and (volume.get("status") or {}).get("phase") == "Released"
            and volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete")


class Provisioner:
    def __init__(self, state_dir: Path, core: client.CoreV1Api, storage: client.StorageV1Api):
        self.state_dir = state_dir
        self.core = core
        self.storage = storage
        self.serialize = core.api_client.sanitize_for_serialization
        # The claim and volume watches run in two threads; one change at a time.
        self.lock = threading.Lock()
        # The last failure reported per claim uid, so a resync does not repeat it.
        self.failures: dict[str, str] = {}
        self.stopping = threading.Event()

    def log(self, message: str) -> None:
        print(f"{datetime.datetime.now().isoformat(timespec='seconds')} {message}", flush=True)

    def event(self, obj: dict, kind: str, reason: str, message: str) -> None:
        metadata = obj["metadata"]
        # Events about cluster-scoped objects (volumes) live in `default`.
        namespace = metadata.get("namespace") or "default"
        now = datetime.datetime.now(datetime.timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{metadata['name']}."),
            involved_object=client.V1ObjectReference(
                kind=obj["kind"], name=metadata["name"], namespace=metadata.get("namespace"),
                uid=metadata["uid"], api_version="v1",
                resource_version=metadata.get("resourceVersion")),
            reason=reason, message=message, type=kind,
            source=client.V1EventSource(component=PROVISIONER_NAME),
            first_timestamp=now, last_timestamp=now, count=1,
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except ApiException as error:
            self.log(f"event {reason} for {metadata['name']} not recorded: {error.reason}")

    def _read(self, call, name: str) -> dict | None:
        try:
            return self.serialize(call(name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def ensure_storage_class(self) -> None:
        try:
            self.storage.create_storage_class(storage_class_manifest())
            self.log(f"created the default StorageClass {STORAGE_CLASS_NAME}")
        except ApiException as error:
            # An existing class is left as it is: someone may have changed the default.
            if error.status != 409:
                raise

    # -- claims ---------------------------------------------------------------------------

    def handle_claim(self, event_type: str, claim: dict) -> None:
        claim = {"kind": "PersistentVolumeClaim", **claim}
        uid = claim["metadata"]["uid"]
        with self.lock:
            if event_type == "DELETED":
                self.failures.pop(uid, None)
                return
            class_name = (claim.get("spec") or {}).get("storageClassName")
            if not class_name:
                return
            storage_class = self._read(self.storage.read_storage_class, class_name)
            if needs_volume(claim, storage_class):
                self.provision(claim, storage_class)

    def provision(self, claim: dict, storage_class: dict) -> None:
        metadata = claim["metadata"]
        name = volume_name(claim)
        if self._read(self.core.read_persistent_volume, name) is not None:
            return  # made earlier; the PV controller binds it
        problem = unsupported(claim)
        if problem:
            self.fail(claim, storage_class, problem)
            return
        self.event(claim, "Normal", "Provisioning", f'External provisioner is provisioning volume '
                   f'for claim "{metadata["namespace"]}/{metadata["name"]}"')
        directory = volume_directory(self.state_dir, name)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.core.create_persistent_volume(volume_manifest(claim, storage_class))
        except (ApiException, OSError) as error:
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
            self.fail(claim, storage_class, _error_message(error))
            return
        self.failures.pop(metadata["uid"], None)
        self.log(f"provisioned {name} for {metadata['namespace']}/{metadata['name']}")
        self.event(claim, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {name}")

    def fail(self, claim: dict, storage_class: dict, reason: str) -> None:
        message = f'failed to provision volume with StorageClass "{storage_class["metadata"]["name"]}": {reason}'
        metadata = claim["metadata"]
        if self.failures.get(metadata["uid"]) != message:
            self.log(f"{metadata['namespace']}/{metadata['name']}: {message}")
            self.event(claim, "Warning", "ProvisioningFailed", message)
        self.failures[metadata["uid"]] = message

    # -- volumes --------------------------------------------------------------------------

    def handle_volume(self, event_type: str, volume: dict) -> None:
        volume = {"kind": "PersistentVolume", **volume}
        with self.lock:
            if event_type == "DELETED":
                # Deleted by hand under reclaimPolicy Delete: its storage goes with it.
                if is_ours(volume) and volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
                    self.remove_directory(volume["metadata"]["name"])
            elif should_delete(volume):
                self.delete(volume)

    def delete(self, volume: dict) -> None:
        name = volume["metadata"]["name"]
        try:
            self.remove_directory(name)
            self.core.delete_persistent_volume(name, body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=volume["metadata"]["uid"])))
        except (ApiException, OSError) as error:
            if isinstance(error, ApiException) and error.status in (404, 409):
                return  # already gone, or replaced by a volume with another uid
            self.event(volume, "Warning", "VolumeFailedDelete",
                       f"deleting {name} failed: {_error_message(error)}")
            return
        self.log(f"deleted {name} and its directory (claim "
                 f"{(volume['spec'].get('claimRef') or {}).get('name')} is gone)")

    def remove_directory(self, name: str) -> None:
        directory = volume_directory(self.state_dir, name)
        if directory.exists():
            shutil.rmtree(directory)

    # -- watches --------------------------------------------------------------------------

    def guarded(self, handler, event_type: str, item: dict) -> None:
        """One object's failure is logged and retried at the next resync; the rest go on."""
        try:
            handler(event_type, item)
        except Exception as error:  # noqa: BLE001 - one bad object never stops the provisioner
            metadata = item.get("metadata") or {}
            self.log(f"handling {metadata.get('namespace', '')}/{metadata.get('name')} failed: {error!r}")

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.ensure_storage_class()
                break
            except Exception as error:  # noqa: BLE001 - the apiserver may still be starting
                self.log(f"creating the StorageClass failed, retrying: {error!r}")
                self.stopping.wait(1)
        for list_call, handler in ((self.core.list_persistent_volume_claim_for_all_namespaces,
                                    self.handle_claim),
                                   (self.core.list_persistent_volume, self.handle_volume)):
            on_event = each_object(lambda event_type, item, handler=handler: self.guarded(handler, event_type, item))
            threading.Thread(target=watch_forever, args=(list_call, on_event, self.stopping), daemon=True,
                             kwargs={"what": handler.__name__, "log": self.log, "watch_seconds": RESYNC_SECONDS}).start()
        self.stopping.wait()


def _error_message(error: Exception) -> str:
    """The apiserver's own message for an API error (say, a validation failure)."""
    if isinstance(error, ApiException):
        try:
            return json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            return f"{error.status} {error.reason}"
    return str(error)


def wait_for_storage_class(kubectl: list[str], timeout_seconds: float) -> None:
    """Block until the provisioner has created the default StorageClass, so that
    claims made right after `sandbox up` get it from admission."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if subprocess.run([*kubectl, "get", "storageclass", STORAGE_CLASS_NAME],
                          capture_output=True).returncode == 0:
            return
        time.sleep(0.3)
    raise TimeoutError(f"StorageClass {STORAGE_CLASS_NAME} not created after {timeout_seconds:.0f} s; "
                       "see volume-provisioner.log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", required=True, help="sandbox.json written by `sandbox up`")
    args = parser.parse_args(argv)
    config = SandboxConfig.from_dict(json.loads(Path(args.settings).read_text())["config"])
    kube_config.load_kube_config(str(config.admin_kubeconfig))
    provisioner = Provisioner(config.state_dir, client.CoreV1Api(), client.StorageV1Api())

    def stop(signum, frame):
        provisioner.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    provisioner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
