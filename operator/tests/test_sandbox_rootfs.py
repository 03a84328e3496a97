"""The sandbox's container runtime without a cluster: root filesystem plans, command lookup
inside the root, image mapping, volume mounts and claims, and (as root) the launcher itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client.exceptions import ApiException

from llmfleet.render import group
from llmfleet_sandbox import images, rootfs, trtllm_image
from llmfleet_sandbox.config import SandboxConfig
from llmfleet_sandbox.rootfs import Mount
from llmfleet_sandbox.volumes import Volume, VolumeBuilder, VolumeError, container_mounts


@pytest.fixture
def host(tmp_path) -> Path:
    """A small Debian-like host root."""
    root = tmp_path / "host"
    for directory in ("usr/bin", "etc/existing", "run/lock", "opt/other", "tmp", "dev/shm", "proc"):
        (root / directory).mkdir(parents=True)
    (root / "etc" / "hostname").write_text("host\n")
    (root / "bin").symlink_to("usr/bin")
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")
    return root


def _volume(tmp_path, name: str) -> Path:
    path = tmp_path / "volumes" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _created_outside_tmpfs_or_volumes(ops: list[list], host: Path) -> list[str]:
    """Paths the plan would create inside a bind of the host (which writes to the host)."""
    binds: dict[str, str] = {}
    tmpfs_dirs = {"/"}
    wrong = []
    for op in ops:
        kind, path = op[0], op[-1]
        if kind in ("mkdir", "touch", "symlink"):
            parent = os.path.dirname(path)
            owner = max((p for p in [*binds, *tmpfs_dirs] if parent == p or parent.startswith(p.rstrip("/") + "/")),
                        key=len)
            if owner in binds and binds[owner].startswith(str(host)):
                wrong.append(path)
            if kind == "mkdir" and owner in tmpfs_dirs:
                tmpfs_dirs.add(path)
        elif kind == "bind":
            tmpfs_dirs.discard(path)
            binds[path] = op[1]
        elif kind == "tmpfs":
            binds.pop(path, None)
            tmpfs_dirs.add(path)
    return wrong


def test_the_host_is_visible_and_symlinks_are_kept(host, tmp_path):
    ops = rootfs.plan([], [], "/", host_root=host)
    assert ["bind", str(host / "usr"), "/usr"] in ops
    assert ["bind", str(host / "etc"), "/etc"] in ops
    assert ["symlink", "usr/bin", "/bin"] in ops
    assert ["tmpfs", "1777", "/dev/shm"] in ops
    assert not _created_outside_tmpfs_or_volumes(ops, host)


def test_mounts_appear_at_their_paths_without_creating_anything_on_the_host(host, tmp_path):
    token, repo, scratch = (_volume(tmp_path, name) for name in ("token", "repo", "scratch"))
    image_home = _volume(tmp_path, "image-opt-tritonserver")
    ops = rootfs.plan(
        [Mount("/opt/tritonserver", image_home, read_only=True)],
        [Mount("/var/run/secrets/kubernetes.io/serviceaccount", token, True, volume=True),
         Mount("/models", repo, True, volume=True),
         Mount("/tmp", scratch, volume=True)],
        "/workspace/app", host_root=host)
    # /var/run is a symlink to /run: the mount goes where it leads, inside the root.
    assert ["bind", str(token), "/run/secrets/kubernetes.io/serviceaccount"] in ops
    assert ["readonly", "/run/secrets/kubernetes.io/serviceaccount"] in ops
    # /run had no "secrets": it is shadowed by a tmpfs holding binds of its entries.
    assert ["mkdir", "/run/secrets"] in ops and ["bind", str(host / "run" / "lock"), "/run/lock"] in ops
    assert ["bind", str(host / "run"), "/run"] not in ops
    assert ["bind", str(image_home), "/opt/tritonserver"] in ops
    assert ["bind", str(host / "opt" / "other"), "/opt/other"] in ops
    # The pod's /tmp hides the host's.
    assert ["bind", str(scratch), "/tmp"] in ops and ["bind", str(host / "tmp"), "/tmp"] not in ops
    assert ["mkdir", "/workspace/app"] in ops
    assert not _created_outside_tmpfs_or_volumes(ops, host)
    for missing in ("run/secrets", "models", "opt/tritonserver", "workspace"):
        assert not (host / missing).exists()


def test_a_mount_point_missing_in_a_volume_is_made_in_the_volume_before_it_turns_read_only(host, tmp_path):
    repo, engine = _volume(tmp_path, "repo"), _volume(tmp_path, "engine")
    ops = rootfs.plan([], [Mount("/models/llama/1/engine", engine, volume=True),
                           Mount("/models", repo, True, volume=True)], "/", host_root=host)
    order = [op for op in ops if op[-1].startswith("/models")]
    assert order == [["mkdir", "/models"], ["bind", str(repo), "/models"],
                     ["mkdir", "/models/llama"], ["mkdir", "/models/llama/1"],
                     ["mkdir", "/models/llama/1/engine"], ["bind", str(engine), "/models/llama/1/engine"],
                     ["readonly", "/models"]]


def test_the_sandbox_environment_stays_visible_under_a_volume(host, tmp_path):
    # A checkout under /tmp and a pod with an emptyDir at /tmp: the interpreter must still be there.
    scratch = _volume(tmp_path, "scratch")
    venv, source = host / "tmp" / "checkout" / ".venv", host / "tmp" / "checkout" / "operator"
    venv.mkdir(parents=True)
    source.mkdir()
    ops = rootfs.plan([], [Mount("/tmp", scratch, volume=True)], "/", host_root=host,
                      environment=[Mount("/tmp/checkout/.venv", venv, read_only=True),
                                   Mount("/tmp/checkout/operator", source, read_only=True)])
    assert ops.index(["bind", str(scratch), "/tmp"]) < ops.index(["bind", str(venv), "/tmp/checkout/.venv"])
    assert ["bind", str(source), "/tmp/checkout/operator"] in ops
    assert ops.count(["mkdir", "/tmp/checkout"]) == 1
    assert ["readonly", "/tmp/checkout/.venv"] in ops
    assert not _created_outside_tmpfs_or_volumes(ops, host)


def test_every_image_carries_this_interpreter_and_the_source_of_its_packages():
    assert sys.prefix in images.ENVIRONMENT_PATHS
    assert str(Path(images.__file__).resolve().parents[1]) in images.ENVIRONMENT_PATHS


@pytest.mark.parametrize("image", ["python:3.12", "busybox:1.36", "llmfleet/operator:0.1.0",
                                   "nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3"])
def test_a_pods_python_imports_the_source_of_the_sandbox_that_runs_it(image, tmp_path):
    """Not the editable install's checkout: a sandbox started from a git worktree runs that
    worktree's stand-ins in its pods."""
    source = Path(images.__file__).resolve().parents[1]
    env = images.resolve(image, tmp_path).env
    assert env["PYTHONPATH"] == str(source)
    imported = subprocess.run([sys.executable, "-c", "import llmfleet_sandbox; print(llmfleet_sandbox.__file__)"],
                              env={**env, "PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True, text=True,
                              check=True).stdout.strip()
    assert Path(imported).resolve().parents[1] == source


def test_shadowing_a_directory_keeps_the_mounts_already_placed_in_it(host, tmp_path):
    first, second = _volume(tmp_path, "first"), _volume(tmp_path, "second")
    ops = rootfs.plan([], [Mount("/etc/existing", first, volume=True),
                           Mount("/etc/new/config", second, volume=True)], "/", host_root=host)
    assert ["bind", str(first), "/etc/existing"] in ops
    assert ["bind", str(host / "etc" / "existing"), "/etc/existing"] not in ops
    assert ["bind", str(host / "etc" / "hostname"), "/etc/hostname"] in ops
    assert ["bind", str(second), "/etc/new/config"] in ops
    assert not _created_outside_tmpfs_or_volumes(ops, host)


def test_a_file_is_mounted_on_a_file_and_a_volume_at_dev_shm_replaces_the_tmpfs(host, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("a: 1\n")
    ops = rootfs.plan([], [Mount("/etc/app/config.yaml", config, volume=True),
                           Mount("/dev/shm", _volume(tmp_path, "shm"), volume=True)], "/", host_root=host)
    assert ["touch", "/etc/app/config.yaml"] in ops
    assert not any(op[0] == "tmpfs" and op[-1] == "/dev/shm" for op in ops)


def test_command_lookup_uses_the_container_path_inside_its_root(tmp_path):
    server = tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver"
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "tritonserver").write_text("not executable")
    path = "/usr/bin:/opt/tritonserver/bin"
    assert rootfs.find_program("tritonserver", path, tmp_path) == "/opt/tritonserver/bin/tritonserver"
    assert rootfs.find_program("/opt/tritonserver/bin/tritonserver", "", tmp_path).endswith("tritonserver")
    with pytest.raises(rootfs.StartError, match=r'exec: "nosuch": executable file not found in \$PATH'):
        rootfs.find_program("nosuch", path, tmp_path)
    with pytest.raises(rootfs.StartError, match="no such file or directory"):
        rootfs.find_program("/opt/missing", path, tmp_path)


def test_unknown_image_is_not_runnable_and_the_message_lists_the_runnable_ones(tmp_path):
    with pytest.raises(images.ImageNotRunnable, match=r'"registry.invalid/x:1".*runnable images.*busybox'):
        images.resolve("registry.invalid/x:1", tmp_path)


def test_triton_image_brings_its_server_at_its_path(tmp_path):
    image = images.resolve("nvcr.io/nvidia/tritonserver:24.12-trtllm-python-py3", tmp_path)
    home = image.files["/opt/tritonserver"]
    assert os.access(home / "bin" / "tritonserver", os.X_OK)
    assert (home / "backends" / "python" / "triton_python_backend_stub").exists()
    assert image.search_path.startswith("/opt/tritonserver/bin:")
    # The host filesystem is visible in the container, so the lookup runs on this machine.
    assert rootfs.find_program("python3", image.search_path) == f"{images.ENVIRONMENT_BIN}/python3"
    assert image.argv(["/bin/sh", "-c"], ["exec tritonserver"]) == ["/bin/sh", "-c", "exec tritonserver"]
    # Its environment names the pinned release whose metric set the engine stand-in exports.
    assert image.env == {trtllm_image.RELEASE_VARIABLE: "engine-24.12", trtllm_image.HUB_EGRESS_VARIABLE: "1",
                         "PYTHONPATH": images.ENVIRONMENT_SOURCE}


def test_a_python_backend_model_imports_the_sandboxs_source_in_an_isolated_interpreter():
    """Triton's python backend stub ignores PYTHONPATH: the generated model.py honours it."""
    content = trtllm_image._python_model("llmfleet_sandbox.images", "ENVIRONMENT_SOURCE")
    shown = subprocess.run([sys.executable, "-I", "-c", content + "print(TritonPythonModel)"],
                           env={"PYTHONPATH": images.ENVIRONMENT_SOURCE, "PATH": "/usr/bin:/bin"}, cwd="/",
                           capture_output=True, text=True, check=True).stdout.strip()
    assert shown == images.ENVIRONMENT_SOURCE


def test_the_operator_image_carries_the_sandboxs_kubectl_for_group_leaders(tmp_path):
    """Where the Containerfile puts it (render/group.py copies it into a group's leader): the
    kubectl `up` built from the control plane's pin, as the image's is that release."""
    bin_dir = tmp_path / "bin"
    SandboxConfig(state_dir=tmp_path).settings_file.write_text(json.dumps({"binDir": str(bin_dir)}))
    files = images.resolve("llmfleet/operator:0.1.0", tmp_path).files
    assert files[group.OPERATOR_IMAGE_KUBECTL] == bin_dir / "kubectl"


def test_an_unpinned_triton_release_is_not_runnable(tmp_path):
    with pytest.raises(images.ImageNotRunnable, match=r'"nvcr.io/nvidia/tritonserver:23.10-trtllm-python-py3" '
                                                      r'is not a pinned release.*24.12-trtllm-python-py3'):
        images.resolve("nvcr.io/nvidia/tritonserver:23.10-trtllm-python-py3", tmp_path)


@pytest.mark.parametrize("name", ["python:3.11-slim", "llmfleet/operator:0.1.0", "busybox:1.36"])
def test_python_resolves_to_this_environment_in_every_mapped_image(name, tmp_path):
    image = images.resolve(name, tmp_path)
    assert Path(rootfs.find_program("python", image.search_path)).parent == Path(sys.executable).parent


def test_image_command_and_args_combine_as_in_kubernetes(tmp_path):
    operator = images.resolve("llmfleet/operator:0.1.0", tmp_path)
    assert operator.argv([], []) == ["llmfleet", "run"]
    assert operator.argv([], ["run", "--sandbox"]) == ["llmfleet", "run", "--sandbox"]
    assert operator.argv(["python3", "-m", "llmfleet"], []) == ["python3", "-m", "llmfleet"]
    assert rootfs.find_program("llmfleet", operator.search_path) == f"{images.ENVIRONMENT_BIN}/llmfleet"
    assert images.resolve("busybox:1.36", tmp_path).argv([], []) == ["sh"]


def test_volume_mounts_honour_sub_path_and_read_only(tmp_path):
    repo = tmp_path / "repo"
    (repo / "llama").mkdir(parents=True)
    (repo / "config.yaml").write_text("x")
    volumes = {"repo": Volume(repo, read_only=True), "scratch": Volume(tmp_path / "scratch")}
    container = {"volumeMounts": [
        {"name": "repo", "mountPath": "/models", "subPath": "llama"},
        {"name": "repo", "mountPath": "/etc/config.yaml", "subPath": "config.yaml"},
        {"name": "scratch", "mountPath": "/data", "subPath": "new/dir", "readOnly": True},
        {"name": "scratch", "mountPath": "/tmp"},
    ]}
    mounts = container_mounts(container, volumes)
    assert mounts[0] == Mount("/models", repo / "llama", read_only=True, volume=True)
    assert mounts[1].source == repo / "config.yaml"
    assert mounts[2].read_only and (tmp_path / "scratch" / "new" / "dir").is_dir()
    assert not mounts[3].read_only
    with pytest.raises(VolumeError, match="inside the volume"):
        container_mounts({"volumeMounts": [{"name": "repo", "mountPath": "/x", "subPath": "../up"}]}, volumes)


class _Claims:
    """Just enough of CoreV1Api for persistentVolumeClaim volumes."""

    def __init__(self, claims: dict, volumes: dict):
        self.claims, self.volumes = claims, volumes

    def read_namespaced_persistent_volume_claim(self, name, namespace):
        if name not in self.claims:
            raise ApiException(status=404)
        return self.claims[name]

    def read_persistent_volume(self, name):
        return self.volumes[name]


def _claim(phase: str | None, volume_name: str | None):
    return SimpleNamespace(status=SimpleNamespace(phase=phase), spec=SimpleNamespace(volume_name=volume_name))


def test_a_claim_mounts_its_bound_host_path_volume_and_waits_until_bound(tmp_path):
    pv = SimpleNamespace(spec=SimpleNamespace(host_path=SimpleNamespace(path="/var/lib/sandbox/pv-1")))
    core = _Claims({"bound": _claim("Bound", "pv-1"), "pending": _claim("Pending", None)}, {"pv-1": pv})
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}}
    builder = VolumeBuilder(core, pod, tmp_path / "pod", tmp_path / "hostpath")
    volume = builder.build({"name": "data", "persistentVolumeClaim": {"claimName": "bound", "readOnly": True}})
    assert volume == Volume(tmp_path / "hostpath" / "var/lib/sandbox/pv-1", read_only=True)
    assert volume.path.is_dir()
    for claim, why in (("pending", "is not bound"), ("missing", "not found")):
        with pytest.raises(VolumeError, match=why) as raised:
            builder.build({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
        assert raised.value.reason == "ContainerCreating"


def _can_build_roots() -> bool:
    return os.geteuid() == 0 and subprocess.run(["unshare", "--mount", "true"],
                                                capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_build_roots(), reason="building a container root needs root")
def test_the_launcher_builds_the_root_and_execs_the_command_found_there(tmp_path):
    repo, scratch, staging = (_volume(tmp_path, name) for name in ("repo", "scratch", "staging"))
    (repo / "model.txt").write_text("weights\n")
    mount_path = f"/llmfleet-test-{os.getpid()}"
    ops = rootfs.plan([], [Mount(f"{mount_path}/repo", repo, True, volume=True),
                           Mount("/tmp", scratch, volume=True)], "/")

    def launch(argv: list[str]) -> tuple[subprocess.CompletedProcess, str]:
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({
            "staging": str(staging), "ops": ops, "argv": argv, "cwd": "/",
            "env": {"PATH": images.resolve("busybox:1", tmp_path).search_path},
            "error_file": str(tmp_path / "error"), "hostname": "pod-a"}))
        result = subprocess.run(rootfs.launcher_command(spec), capture_output=True, text=True, timeout=30)
        return result, (tmp_path / "error").read_text()

    script = (f"cat {mount_path}/repo/model.txt; ls /tmp; touch /tmp/made; "
              f"touch {mount_path}/repo/x 2>/dev/null || echo read-only; python3 -c 'print(1)'; "
              "python3 -c 'import socket; print(socket.gethostname())'")
    host_name = socket.gethostname()
    result, error = launch(["sh", "-c", script])
    assert (result.returncode, error) == (0, ""), result.stderr
    # The pod's hostname, in a UTS namespace of the container's own: the host keeps its name.
    assert result.stdout.split() == ["weights", "read-only", "1", "pod-a"]
    assert socket.gethostname() == host_name
    assert (scratch / "made").exists()
    assert not os.path.lexists(mount_path)

    result, error = launch(["no-such-command"])
    assert result.returncode == rootfs.START_ERROR_EXIT_CODE
    assert error == 'exec: "no-such-command": executable file not found in $PATH'
