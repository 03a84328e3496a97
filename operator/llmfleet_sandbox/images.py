"""What a container image brings to a container in the sandbox.

There is no registry and no image store: a known image maps to the files it has at their paths
in the image (mounted into the container's root, which otherwise shows this machine's
filesystem), the directories its PATH puts first, its extra environment, its entrypoint and
CMD. The Triton TensorRT-LLM image gets its filesystem from `trtllm_image`; in every
mapped image `python`/`python3` is this environment's interpreter. Any other image cannot run
here and fails the way a real node fails to pull it.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from llmfleet.catalog.release_record import load_release_record, release_for_image, release_names
from llmfleet.render.group import OPERATOR_IMAGE_KUBECTL
from llmfleet_sandbox import objectstore, trtllm_image
from llmfleet_sandbox.config import SandboxConfig

TRITON_IMAGE_PATTERNS = ("nvcr.io/nvidia/tritonserver:*",)
PYTHON_IMAGE_PATTERNS = ("python:*",)
OPERATOR_IMAGE_PATTERNS = ("llmfleet/operator:*",)
SHELL_IMAGE_PATTERNS = ("busybox:*",)
# The AWS CLI v2 image (its entrypoint) runs Debian's AWS CLI v2, installed by `make`.
AWS_CLI_IMAGE_PATTERNS = ("amazon/aws-cli:*",)
AWS_CLI_ENTRYPOINT = "/usr/local/bin/aws"
# The PATH of a Debian-based image; the image's own directories go before it.
DEFAULT_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# This environment's bin directory: its python/python3 and the `llmfleet` entry point.
ENVIRONMENT_BIN = str(Path(sys.executable).parent)
# The source tree this sandbox runs (llmfleet, llmfleet_sandbox): the node agent's own, which is
# not the editable install's when the agent runs another checkout (PYTHONPATH, a git worktree).
ENVIRONMENT_SOURCE = str(Path(trtllm_image.__file__).resolve().parents[1])
# What this environment's interpreter needs at run time: the venv, the Python it was made
# from, and the sandbox's source tree.
ENVIRONMENT_PATHS = tuple(sorted({sys.prefix, sys.base_prefix, ENVIRONMENT_SOURCE}))
# Pods' Python imports the sandbox's own source, ahead of the editable install's: the stand-ins a
# pod runs are those of the sandbox that started it.
ENVIRONMENT_IMPORTS = {"PYTHONPATH": ENVIRONMENT_SOURCE}
PYTHON_ENV = {"LANG": "C.UTF-8",
              "PYTHON_VERSION": ".".join(str(part) for part in sys.version_info[:3]), **ENVIRONMENT_IMPORTS}


class ImageNotRunnable(Exception):
    """The sandbox cannot run this image; the message says why."""


@dataclass(frozen=True)
class Image:
    files: dict[str, Path]  # in-image absolute path -> the host file or directory seen there
    path_dirs: tuple[str, ...]  # put first on PATH
    env: dict[str, str]
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()

    @property
    def search_path(self) -> str:
        return ":".join(self.path_dirs + DEFAULT_PATH)

    def argv(self, command: list[str], args: list[str]) -> list[str]:
        """A container's command line, as Kubernetes combines it with the image's:
        `command` replaces the entrypoint and drops the image's CMD; `args` replace its CMD."""
        if command:
            return command + args
        return list(self.entrypoint) + (args or list(self.cmd))


def known_image_patterns() -> tuple[str, ...]:
    return (TRITON_IMAGE_PATTERNS + PYTHON_IMAGE_PATTERNS + OPERATOR_IMAGE_PATTERNS + SHELL_IMAGE_PATTERNS
            + AWS_CLI_IMAGE_PATTERNS)


def _matches(image: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(image, pattern) for pattern in patterns)


def _kubectl(state_dir: Path) -> dict[str, Path]:
    """The operator image's kubectl (Containerfile, stage kubectl: the release the control plane
    pins): the sandbox's own, built from that pin, from the bin directory `up` recorded."""
    settings = SandboxConfig(state_dir=state_dir).settings_file
    if not settings.exists():  # no sandbox started here (a unit test's state directory)
        return {}
    return {OPERATOR_IMAGE_KUBECTL: Path(json.loads(settings.read_text())["binDir"]) / "kubectl"}


def resolve(image: str, state_dir: Path) -> Image:
    """The filesystem, PATH, environment and default command of a known image."""
    if _matches(image, TRITON_IMAGE_PATTERNS):
        release = release_for_image(image)
        if release is None:
            raise ImageNotRunnable(
                f'image "{image}" is not a pinned release; the sandbox lays out the Triton images of '
                + ", ".join(load_release_record(name).image for name in release_names()))
        return Image(trtllm_image.image_filesystem(state_dir),
                     tuple(trtllm_image.IMAGE_PATH) + (ENVIRONMENT_BIN,),
                     {trtllm_image.RELEASE_VARIABLE: release.release, trtllm_image.HUB_EGRESS_VARIABLE: "1",
                      **ENVIRONMENT_IMPORTS})
    if _matches(image, PYTHON_IMAGE_PATTERNS):
        return Image({}, (ENVIRONMENT_BIN,), dict(PYTHON_ENV), cmd=("python3",))
    if _matches(image, OPERATOR_IMAGE_PATTERNS):
        return Image({**trtllm_image.upstream_code_filesystem(state_dir), **_kubectl(state_dir)}, (ENVIRONMENT_BIN,),
                     dict(PYTHON_ENV), ("llmfleet",), ("run",))
    if _matches(image, SHELL_IMAGE_PATTERNS):
        return Image({}, (ENVIRONMENT_BIN,), dict(ENVIRONMENT_IMPORTS), cmd=("sh",))
    if _matches(image, AWS_CLI_IMAGE_PATTERNS):
        if not Path(objectstore.AWS_CLI).exists():
            raise ImageNotRunnable(f'image "{image}" needs the AWS CLI at {objectstore.AWS_CLI}: '
                                   "apt-get install awscli (`make` does this)")
        return Image({AWS_CLI_ENTRYPOINT: Path(objectstore.AWS_CLI)}, (), {}, (AWS_CLI_ENTRYPOINT,))
    raise ImageNotRunnable(
        f'image "{image}" has no local filesystem in the sandbox; runnable images: '
        + ", ".join(known_image_patterns())
    )
