"""Each container's root filesystem, in a mount namespace of its own.

The sandbox's container runtime: the node agent plans a container's root (`plan`), and a small
launcher (this file run as a script, after `nsenter --net`) builds it and execs the command.

The root is a tmpfs holding binds of the host's top-level entries, so the host is visible as it
is; the image's files and the pod's volumes are bound at their paths on top. A mount point must
never be created on the host's real filesystem: when one is missing below a host directory,
that directory is "shadowed" by a tmpfs holding binds of its entries, and the mount point is
made in the tmpfs. Mount points missing inside a pod volume are created in the volume, as a
real runtime does. Symlinks on the way to a mount point resolve inside the container's view
(/var/run/secrets -> /run/secrets), never outside it.

The launcher runs as `python -I -S rootfs.py <spec.json>`, so it imports the standard library
only.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

MAX_SYMLINK_HOPS = 40
# The exit code and the start of the message a real runtime gives when exec fails.
START_ERROR_EXIT_CODE = 128


class MountError(Exception):
    """A container's mounts cannot be laid out; the message says why."""


class StartError(Exception):
    """The container's process could not be started (missing executable, failed mount)."""


@dataclass(frozen=True)
class Mount:
    target: str
    source: Path
    read_only: bool = False
    # Mount points missing inside a pod volume are created there, never in an image or the host.
    volume: bool = False


# -- the planned tree -------------------------------------------------------------------------

@dataclass
class _Dir:
    """A directory in tmpfs: the root, a shadowed host directory, a new mount point's parent."""

    children: dict = field(default_factory=dict)
    tmpfs: bool = False  # a tmpfs mount of its own (not just a directory in the parent's tmpfs)
    mode: str = "755"
    create: bool = False


@dataclass
class _Bind:
    """A host file or directory seen here: bound here (`mounted`) or reached through a bind."""

    source: Path
    read_only: bool = False
    volume: bool = False
    mounted: bool = True
    create: bool = False
    over: dict = field(default_factory=dict)  # entries below with mounts somewhere inside


@dataclass
class _Link:
    target: str


def _is_dir(node) -> bool:
    # A directory the plan makes inside a volume does not exist yet on the host.
    return isinstance(node, _Dir) or (isinstance(node, _Bind) and (
        node.source.is_dir() or (node.create and not node.mounted)))


def _host_is_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


class _Planner:
    def __init__(self, host_root: Path):
        self.host_root = host_root
        self.root = _Dir(self._host_entries(host_root, read_only=False))

    @staticmethod
    def _host_entries(directory: Path, read_only: bool) -> dict:
        entries = {}
        for entry in sorted(directory.iterdir()):
            if entry.is_symlink():
                entries[entry.name] = _Link(os.readlink(entry))
            else:
                entries[entry.name] = _Bind(entry, read_only=read_only)
        return entries

    # -- looking at the container's view --

    def _lookup(self, parts: list[str]):
        """The node at a symlink-free path, a host Path for an entry inside a bind, or None."""
        node = self.root
        for index, name in enumerate(parts):
            if isinstance(node, _Dir):
                node = node.children.get(name)
            elif isinstance(node, _Bind):
                if name in node.over:
                    node = node.over[name]
                else:
                    host = node.source.joinpath(*parts[index:])
                    return host if os.path.lexists(host) else None
            else:
                return None
            if node is None:
                return None
        return node

    def _resolve(self, path: str) -> list[str]:
        """The path's parts with every symlink resolved inside the container's view."""
        pending = deque(_parts(path))
        resolved: list[str] = []
        hops = 0
        while pending:
            name = pending.popleft()
            if name == ".":
                continue
            if name == "..":
                if resolved:
                    resolved.pop()
                continue
            found = self._lookup(resolved + [name])
            if isinstance(found, Path) and found.is_symlink():
                target = os.readlink(found)
            elif isinstance(found, _Link):
                target = found.target
            else:
                resolved.append(name)
                continue
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise MountError(f"too many levels of symbolic links in {path}")
            if target.startswith("/"):
                resolved = []
            pending.extendleft(reversed(_parts(target)))
        return resolved

    # -- changing it --

    def _shadow(self, chain: list, names: list[str]) -> _Dir:
        """Replace the host directory at the end of `chain` by a tmpfs with binds of its entries."""
        bound: _Bind = chain[-1]
        parent = chain[-2]
        shadow = _Dir(self._host_entries(bound.source, bound.read_only),
                      tmpfs=not isinstance(parent, _Dir))
        for name, node in bound.over.items():
            if isinstance(node, _Bind):
                node.mounted = True  # its parent is now a tmpfs, not the host directory
            shadow.children[name] = node
        if isinstance(parent, _Dir):
            parent.children[names[-1]] = shadow
        else:
            parent.over[names[-1]] = shadow
        chain[-1] = shadow
        return shadow

    def _child_dir(self, parent, name: str):
        """The directory `name` in `parent`, made if missing; None if the parent must be shadowed."""
        if isinstance(parent, _Dir):
            child = parent.children.get(name)
            if child is None or not _is_dir(child):
                child = parent.children[name] = _Dir()
            return child
        child = parent.over.get(name)
        if child is not None and _is_dir(child):
            return child
        host = parent.source / name
        if child is None and _host_is_dir(host):
            child = _Bind(host, parent.read_only, parent.volume, mounted=False)
        elif child is None and not os.path.lexists(host) and parent.volume:
            child = _Bind(host, parent.read_only, volume=True, mounted=False, create=True)
        elif parent.volume:
            raise MountError(f"{host} is in the way of a mount point")
        else:
            return None
        parent.over[name] = child
        return child

    def _directory_chain(self, parts: list[str]) -> list:
        chain: list = [self.root]
        for index, name in enumerate(parts):
            child = self._child_dir(chain[-1], name)
            if child is None:
                child = self._child_dir(self._shadow(chain, parts[:index]), name)
            chain.append(child)
        return chain

    def place(self, target: str, node) -> None:
        parts = self._resolve(target)
        if not parts:
            raise MountError("cannot mount over the container's root")
        chain = self._directory_chain(parts[:-1])
        parent, name = chain[-1], parts[-1]
        if isinstance(parent, _Bind):
            host = parent.source / name
            if os.path.lexists(host) and _host_is_dir(host) == _is_dir(node):
                parent.over[name] = node
                return
            if parent.volume and not os.path.lexists(host):
                node.create = True
                parent.over[name] = node
                return
            if parent.volume:
                raise MountError(f"{host} is in the way of the mount at {target}")
            parent = self._shadow(chain, parts[:-1])
        parent.children[name] = node

    def ensure_directory(self, path: str) -> None:
        self._directory_chain(self._resolve(path))

    # -- what the launcher does, in order --

    def operations(self) -> list[list]:
        ops: list[list] = []
        for name, node in self.root.children.items():
            self._emit(node, "/" + name, ops, in_tmpfs=True)
        return ops

    def _emit(self, node, path: str, ops: list, in_tmpfs: bool) -> None:
        if isinstance(node, _Link):
            ops.append(["symlink", node.target, path])
            return
        # Mount points are made in tmpfs, or in a volume; a host directory already has them.
        create = in_tmpfs or node.create
        if isinstance(node, _Dir):
            if create:
                ops.append(["mkdir", path])
            if node.tmpfs:
                ops.append(["tmpfs", node.mode, path])
            for name, child in node.children.items():
                self._emit(child, f"{path}/{name}", ops, in_tmpfs=True)
            return
        if create:
            ops.append(["mkdir" if not node.mounted or node.source.is_dir() else "touch", path])
        if node.mounted:
            ops.append(["bind", str(node.source), path])
        for name, child in node.over.items():
            self._emit(child, f"{path}/{name}", ops, in_tmpfs=False)
        if node.mounted and node.read_only:
            ops.append(["readonly", path])


def plan(image_files: list[Mount], volume_mounts: list[Mount], working_dir: str,
         host_root: Path = Path("/"), environment: list[Mount] = ()) -> list[list]:
    """The operations that build a container's root, in container paths.

    The image's files go first, then a fresh /dev/shm, then the volumes (parents before
    children), so a volume hides what the image has at its path, as on a real node. The
    sandbox's own Python `environment`, which its mapped images run on, goes last at its own
    paths: a volume must not hide it (an emptyDir at /tmp when the checkout is under /tmp).
    """
    planner = _Planner(host_root)
    for mount in sorted(image_files, key=lambda m: len(_parts(m.target))):
        planner.place(mount.target, _Bind(mount.source, mount.read_only))
    planner.place("/dev/shm", _Dir(tmpfs=True, mode="1777"))
    for mount in sorted(volume_mounts, key=lambda m: len(_parts(m.target))):
        planner.place(mount.target, _Bind(mount.source, mount.read_only, volume=mount.volume))
    for mount in sorted(environment, key=lambda m: len(_parts(m.target))):
        planner.place(mount.target, _Bind(mount.source, mount.read_only))
    planner.ensure_directory(working_dir)
    return planner.operations()


def find_program(name: str, search_path: str, root: Path = Path("/")) -> str:
    """Look a command up the way a container runtime does: by the container's PATH, in its root."""
    def runnable(path: str) -> bool:
        host = root / path.lstrip("/")
        return host.is_file() and os.access(host, os.X_OK)

    if "/" in name:
        if not os.path.lexists(root / name.lstrip("/")):
            raise StartError(f'exec: "{name}": stat {name}: no such file or directory')
        return name
    for directory in search_path.split(":"):
        candidate = os.path.join(directory or ".", name)
        if runnable(candidate):
            return candidate
    raise StartError(f'exec: "{name}": executable file not found in $PATH')


# -- the launcher -----------------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_UNBINDABLE = 0x20000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = (lambda text: text.encode() if text is not None else None)
    _check(_libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags),
                       encode(data)), f"mount {source or fstype or ''} on {target}")


def build_root(staging: str, ops: list[list]) -> None:
    """In a new mount namespace, build the root at `staging` and make it the process's root."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Nothing done here may propagate back to the host.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    # Recursive binds of the host directory holding `staging` must not copy the new root into itself.
    _mount(None, staging, None, MS_UNBINDABLE)
    for op in ops:
        kind, path = op[0], staging + op[-1]
        if kind == "mkdir":
            # A volume keeps the mount points made by the container's earlier runs.
            if not os.path.isdir(path):
                os.mkdir(path)
        elif kind == "touch":
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        elif kind == "symlink":
            os.symlink(op[1], path)
        elif kind == "tmpfs":
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={op[1]}")
        elif kind == "bind":
            _mount(op[1], path, None, MS_BIND | MS_REC)
        elif kind == "readonly":
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    os.chdir(staging)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unsupported machine {platform.machine()}")
    # pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the new root.
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def set_hostname(hostname: str) -> None:
    """In a UTS namespace of its own, the container's hostname: the pod's, as a runtime sets it."""
    _check(_libc.unshare(CLONE_NEWUTS), "unshare(CLONE_NEWUTS)")
    name = hostname.encode()
    _check(_libc.sethostname(name, ctypes.c_size_t(len(name))), "sethostname")


def _start(spec: dict) -> None:
    """Build the root and exec the command; it returns only by raising."""
    build_root(spec["staging"], spec["ops"])
    if spec.get("hostname"):
        set_hostname(spec["hostname"])
    os.chdir(spec["cwd"])
    program = find_program(spec["argv"][0], spec["env"].get("PATH", ""))
    try:
        os.execve(program, spec["argv"], spec["env"])
    except OSError as error:
        raise StartError(f'exec: "{spec["argv"][0]}": {error.strerror.lower()}') from None


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    # Opened before the root changes: the agent reads why a start failed from here.
    error_fd = os.open(spec["error_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _start(spec)
    except StartError as error:
        message = str(error)
    except OSError as error:
        message = f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    os.write(error_fd, message.encode())
    print(f"llmfleet sandbox: cannot start container: {message}", file=sys.stderr)
    return START_ERROR_EXIT_CODE


def launcher_command(spec_file: Path) -> list[str]:
    """Run after `nsenter --net`: this interpreter, isolated from the container's environment."""
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve()), str(spec_file)]


def exec_prefix(pid: int, nsenter: str = "nsenter") -> list[str]:
    """Command prefix that runs a program in a running container's mount, network and UTS view."""
    return [nsenter, f"--target={pid}", "--mount", "--net", "--uts", "--wd", "--"]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
