"""Which local program runs a container image.

The sandbox has no container runtime: a known image maps to a program on this
machine. The Triton TensorRT-LLM image runs the Triton server bundled in the
`nvidia-pytriton` wheel; Python images run this environment's Python. Any
other image cannot run here and must fail the way a real node fails to pull it.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TRITON_IMAGE_PATTERNS = ("nvcr.io/nvidia/tritonserver:*",)
PYTHON_IMAGE_PATTERNS = ("python:*", "llmfleet/operator:*")
SHELL_IMAGE_PATTERNS = ("busybox:*",)
PYTHON_COMMANDS = ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}")
TRITON_COMMANDS = ("tritonserver", "/opt/tritonserver/bin/tritonserver")
# TensorRT-LLM's multi-GPU launcher starts one tritonserver per rank with MPI.
# The emulated engine has no ranks, so the sandbox runs one server for the group.
TRITON_LAUNCHER = "launch_triton_server.py"


class ImageNotRunnable(Exception):
    """The sandbox cannot run this image or command; the message says why."""


@dataclass(frozen=True)
class Program:
    argv: list[str]
    env: dict[str, str]


def known_image_patterns() -> tuple[str, ...]:
    return TRITON_IMAGE_PATTERNS + PYTHON_IMAGE_PATTERNS + SHELL_IMAGE_PATTERNS


def _matches(image: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(image, pattern) for pattern in patterns)


def resolve(image: str, command: list[str], args: list[str], state_dir: Path) -> Program:
    """Map a container's image, command and args to a local program."""
    if _matches(image, TRITON_IMAGE_PATTERNS):
        return _resolve_triton_image(image, command + args, state_dir)
    if _matches(image, PYTHON_IMAGE_PATTERNS):
        return _resolve_generic(image, (command or ["python3"]) + args)
    if _matches(image, SHELL_IMAGE_PATTERNS):
        return _resolve_generic(image, (command or ["sh"]) + args)
    raise ImageNotRunnable(
        f'image "{image}" has no local program in the sandbox; runnable images: '
        + ", ".join(known_image_patterns())
    )


def _resolve_generic(image: str, argv: list[str]) -> Program:
    if not argv:
        raise ImageNotRunnable(f'image "{image}": container has no command or args to run')
    program = argv[0]
    if program in PYTHON_COMMANDS or program.endswith(PYTHON_COMMANDS):
        return Program([sys.executable, *argv[1:]], {})
    resolved = shutil.which(program)
    if resolved is None:
        raise ImageNotRunnable(f'image "{image}": command "{program}" is not available in the sandbox')
    return Program([resolved, *argv[1:]], {})


def _resolve_triton_image(image: str, argv: list[str], state_dir: Path) -> Program:
    if not argv:
        raise ImageNotRunnable(f'image "{image}": container has no command; give tritonserver or '
                               f"{TRITON_LAUNCHER} as the command")
    program = argv[0]
    if program in TRITON_COMMANDS:
        return triton_program(argv[1:], state_dir)
    if program in PYTHON_COMMANDS and len(argv) > 1 and argv[1].endswith(TRITON_LAUNCHER):
        return triton_program(_launcher_to_server_args(argv[2:]), state_dir)
    return _resolve_generic(image, argv)


def _launcher_to_server_args(launcher_args: list[str]) -> list[str]:
    """Translate launch_triton_server.py flags to one tritonserver's flags."""
    server_args = []
    values = dict(arg.lstrip("-").split("=", 1) for arg in launcher_args if "=" in arg)
    if "model_repo" in values:
        server_args.append(f"--model-repository={values['model_repo']}")
    for launcher_flag, server_flag in (("http_port", "http-port"), ("grpc_port", "grpc-port"),
                                       ("metrics_port", "metrics-port")):
        if launcher_flag in values:
            server_args.append(f"--{server_flag}={values[launcher_flag]}")
    return server_args


def pytriton_root() -> Path:
    import pytriton

    return Path(pytriton.__file__).parent / "tritonserver"


def python_backend_dir(state_dir: Path) -> Path:
    """A Triton backend directory whose python backend uses this Python's stub."""
    backends = state_dir / "triton-backends"
    python_dir = backends / "python"
    if not (python_dir / "triton_python_backend_stub").exists():
        python_dir.mkdir(parents=True, exist_ok=True)
        source = pytriton_root()
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        for path in (source / "backends" / "python").iterdir():
            if path.is_file():
                shutil.copy2(path, python_dir / path.name)
        shutil.copy2(source / "python_backend_stubs" / version / "triton_python_backend_stub",
                     python_dir / "triton_python_backend_stub")
    return backends


def triton_program(server_args: list[str], state_dir: Path) -> Program:
    root = pytriton_root()
    libs = root.parent.parent / "nvidia_pytriton.libs"
    args = list(server_args)
    if not any(arg.startswith("--backend-directory") for arg in args):
        args.append(f"--backend-directory={python_backend_dir(state_dir)}")
    # The python backend stub embeds libpython: it must be the interpreter this
    # environment was made from (its lib dir first, before the wheel's own copy).
    # The embedded interpreter finds its prefix from the `python3` first on PATH,
    # so this environment's bin dir goes first and model code sees its packages.
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join([sysconfig.get_config_var("LIBDIR"), str(libs)]),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return Program([str(root / "bin" / "tritonserver"), *args], env)
