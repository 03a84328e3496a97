"""Pod volumes as directories under a per-pod root (or the sandbox's hostPath area).

Each container's mount namespace binds them at their mount paths (see `rootfs`).
"""

from __future__ import annotations

import base64
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from llmfleet_sandbox.rootfs import Mount

DEFAULT_TOKEN_SECONDS = 3607
# The kubelet mounts these read-only: their content is the API object's, written atomically.
READ_ONLY_TYPES = ("configMap", "secret", "projected", "downwardAPI")


class VolumeError(Exception):
    """A volume could not be prepared; `reason` is the kubelet-style waiting reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Volume:
    path: Path
    read_only: bool = False


def _write_file(path: Path, content: bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode if mode is not None else 0o644)


def _key_items(data: dict[str, bytes], items, default_mode, what: str, optional: bool):
    """Apply a ConfigMap/Secret volume's `items` projection."""
    if not items:
        return [(key, value, default_mode) for key, value in data.items()]
    selected = []
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise VolumeError("CreateContainerConfigError", f'{what} has no key "{item["key"]}"')
        selected.append((item["path"], data[item["key"]], item.get("mode", default_mode)))
    return selected


class VolumeBuilder:
    def __init__(self, core: CoreV1Api, pod: dict, pod_root: Path, sandbox_host_root: Path):
        self.core = core
        self.pod = pod
        self.namespace = pod["metadata"]["namespace"]
        self.volumes_root = pod_root / "volumes"
        self.sandbox_host_root = sandbox_host_root

    def build_all(self) -> dict[str, Volume]:
        return {volume["name"]: self.build(volume) for volume in self.pod["spec"].get("volumes") or []}

    def build(self, volume: dict) -> Volume:
        name = volume["name"]
        if "hostPath" in volume:
            return Volume(self._host_directory(volume["hostPath"]["path"]))
        if "persistentVolumeClaim" in volume:
            source = volume["persistentVolumeClaim"]
            return Volume(self._claim_directory(name, source["claimName"]),
                          read_only=source.get("readOnly", False))
        directory = self.volumes_root / name
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        if "emptyDir" in volume:
            return Volume(directory)
        if "configMap" in volume:
            self._write_items(directory, self._config_map_items(volume["configMap"]))
        elif "secret" in volume:
            self._write_items(directory, self._secret_items(volume["secret"]))
        elif "projected" in volume:
            for source in volume["projected"].get("sources") or []:
                self._write_items(directory, self._projected_items(source))
        elif "downwardAPI" in volume:
            self._write_items(directory, self._downward_items(volume["downwardAPI"]))
        else:
            kind = next((key for key in volume if key != "name"), "unknown")
            raise VolumeError(
                "CreateContainerConfigError",
                f'volume "{name}": volume type "{kind}" is not supported by the sandbox '
                "(supported: emptyDir, configMap, secret, projected, downwardAPI, hostPath, "
                "persistentVolumeClaim)",
            )
        return Volume(directory, read_only=any(kind in volume for kind in READ_ONLY_TYPES))

    def _host_directory(self, path: str) -> Path:
        # Host paths resolve inside the sandbox's state, never the real host.
        target = self.sandbox_host_root / path.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        return target

    def _claim_directory(self, volume_name: str, claim_name: str) -> Path:
        """The directory of the PersistentVolume bound to the claim. Until the claim is bound the
        pod waits in ContainerCreating, as a kubelet waits for its volumes to attach."""
        def waiting(why: str) -> VolumeError:
            return VolumeError("ContainerCreating",
                               f'MountVolume.SetUp failed for volume "{volume_name}": {why}')

        try:
            claim = self.core.read_namespaced_persistent_volume_claim(claim_name, self.namespace)
        except ApiException as error:
            if error.status == 404:
                raise waiting(f'persistentvolumeclaim "{claim_name}" not found') from None
            raise
        if claim.status is None or claim.status.phase != "Bound" or not claim.spec.volume_name:
            phase = claim.status.phase if claim.status else None
            raise waiting(f'persistentvolumeclaim "{claim_name}" is not bound (phase {phase or "Pending"})')
        try:
            volume = self.core.read_persistent_volume(claim.spec.volume_name)
        except ApiException as error:
            if error.status == 404:
                raise waiting(f'persistentvolume "{claim.spec.volume_name}" not found') from None
            raise
        if volume.spec.host_path is None:
            raise VolumeError("CreateContainerConfigError",
                              f'persistentvolume "{claim.spec.volume_name}" is not a hostPath volume; '
                              "the sandbox mounts hostPath persistent volumes only")
        return self._host_directory(volume.spec.host_path.path)

    @staticmethod
    def _write_items(directory: Path, items) -> None:
        for relative, content, mode in items:
            _write_file(directory / relative, content, mode)

    def _read(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        try:
            if kind == "ConfigMap":
                obj = self.core.read_namespaced_config_map(name, self.namespace)
                data = {k: v.encode() for k, v in (obj.data or {}).items()}
                data.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
                return data
            obj = self.core.read_namespaced_secret(name, self.namespace)
            return {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
        except ApiException as error:
            if error.status == 404:
                if optional:
                    return None
                raise VolumeError("CreateContainerConfigError",
                                  f'{kind.lower()} "{name}" not found') from None
            raise

    def _config_map_items(self, source: dict):
        optional = source.get("optional", False)
        data = self._read("ConfigMap", source["name"], optional)
        if data is None:
            return []
        return _key_items(data, source.get("items"), source.get("defaultMode"),
                          f'configmap "{source["name"]}"', optional)

    def _secret_items(self, source: dict):
        optional = source.get("optional", False)
        name = source.get("secretName") or source.get("name")
        data = self._read("Secret", name, optional)
        if data is None:
            return []
        return _key_items(data, source.get("items"), source.get("defaultMode", 0o644),
                          f'secret "{name}"', optional)

    def _downward_items(self, source: dict):
        items = []
        for item in source.get("items") or []:
            if "fieldRef" in item:
                value = field_ref_value(self.pod, item["fieldRef"]["fieldPath"])
                items.append((item["path"], value.encode(), item.get("mode")))
        return items

    def _projected_items(self, source: dict):
        if "configMap" in source:
            return self._config_map_items(source["configMap"])
        if "secret" in source:
            return self._secret_items(source["secret"])
        if "downwardAPI" in source:
            return self._downward_items(source["downwardAPI"])
        if "serviceAccountToken" in source:
            return [(source["serviceAccountToken"]["path"],
                     self._service_account_token(source["serviceAccountToken"]).encode(), 0o600)]
        return []

    def _service_account_token(self, source: dict) -> str:
        metadata = self.pod["metadata"]
        spec = {
            "expirationSeconds": source.get("expirationSeconds", DEFAULT_TOKEN_SECONDS),
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                               "name": metadata["name"], "uid": metadata["uid"]},
        }
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        response = self.core.create_namespaced_service_account_token(
            account, self.namespace, {"spec": spec})
        return response.status.token


def field_ref_value(pod: dict, field_path: str) -> str:
    metadata = pod["metadata"]
    simple = {
        "metadata.name": metadata["name"],
        "metadata.namespace": metadata["namespace"],
        "metadata.uid": metadata["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": (pod.get("status") or {}).get("podIP", ""),
        "status.hostIP": (pod.get("status") or {}).get("hostIP", ""),
    }
    if field_path in simple:
        return simple[field_path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", field_path)
    if match:
        return (metadata.get(match.group(1)) or {}).get(match.group(2), "")
    return ""


def container_mounts(container: dict, volumes: dict[str, Volume]) -> list[Mount]:
    """The container's volumeMounts as binds: subPath within the volume, readOnly honoured."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            raise VolumeError("CreateContainerConfigError",
                              f'volumeMount "{mount["name"]}" names no volume of the pod')
        volume = volumes[mount["name"]]
        source = volume.path
        sub_path = mount.get("subPath")
        if sub_path:
            if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                raise VolumeError("CreateContainerConfigError",
                                  f'subPath "{sub_path}" must be a relative path inside the volume')
            source = volume.path / sub_path
            # The kubelet creates a missing subPath as a directory.
            if not source.exists():
                source.mkdir(parents=True)
        mounts.append(Mount(mount["mountPath"], source,
                            read_only=mount.get("readOnly", False) or volume.read_only, volume=True))
    return mounts
