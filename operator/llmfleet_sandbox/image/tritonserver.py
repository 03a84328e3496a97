"""The image's /opt/tritonserver/bin/tritonserver: the Triton 2.51 server bundled in nvidia-pytriton.

The real configs carry `model_metrics` (fine TTFT histogram buckets), which Triton >= 2.52
(the 24.12 image's server is 2.53) reads and Triton 2.51 refuses: the model fails to load. The
sandbox must serve the rendered repository unchanged, so this wrapper is where the versions
differ: it serves a copy of each model repository with only the top-level `model_metrics`
blocks removed (the emulated backend exports that histogram itself, with the same buckets: it
reads them from the rendered config, kept beside the served one as `RENDERED_CONFIG`), and
passes every flag through otherwise. The copy goes to a fresh directory under the temp dir
($TMPDIR, else /tmp: the pod's own emptyDir), since /models is read-only in the pod.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

REPOSITORY_FLAGS = ("--model-repository", "--model-store")
BACKEND_DIRECTORY_FLAG = "--backend-directory"
REMOVED_BLOCK = "model_metrics"
RENDERED_CONFIG = "rendered-config.pbtxt"
_OPENING, _CLOSING = "{<[", "}>]"


def _string_end(text: str, start: int) -> int:
    """Index after the quoted string starting at `start` (escapes honoured)."""
    quote, index = text[start], start + 1
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == quote:
            return index + 1
        index += 1
    raise ValueError("unterminated string in config.pbtxt")


def _comment_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _block_end(text: str, start: int) -> int:
    """Index after the block whose opening bracket is at `start`."""
    depth, index = 0, start
    while index < len(text):
        char = text[index]
        if char in "\"'":
            index = _string_end(text, index)
            continue
        if char == "#":
            index = _comment_end(text, index)
            continue
        if char in _OPENING:
            depth += 1
        elif char in _CLOSING:
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    raise ValueError("unbalanced braces in config.pbtxt")


def _is_identifier(char: str) -> bool:
    return char.isalnum() or char == "_"


def remove_top_level_field(text: str, field: str) -> str:
    """`text` (protobuf text format) without the top-level message field `field`; strings,
    comments and nested fields of the same name are left alone."""
    kept, index, depth = [], 0, 0
    while index < len(text):
        char = text[index]
        if char in "\"'":
            end = _string_end(text, index)
        elif char == "#":
            end = _comment_end(text, index)
        elif (depth == 0 and text.startswith(field, index)
              and (index == 0 or not _is_identifier(text[index - 1]))
              and not _is_identifier(text[index + len(field):index + len(field) + 1])):
            body = index + len(field)
            while body < len(text) and (text[body].isspace() or text[body] == ":"):
                body += 1
            if body < len(text) and text[body] in "{<":
                index = _block_end(text, body)
                continue
            end = index + 1
        else:
            depth += char in _OPENING
            depth -= char in _CLOSING
            end = index + 1
        kept.append(text[index:end])
        index = end
    return "".join(kept)


def served_copy(repository: Path, target: Path) -> None:
    """Copy `repository` to `target` with `model_metrics` removed from every model's config.pbtxt
    (the rendered one kept beside it)."""
    shutil.copytree(repository, target, symlinks=False)
    for config in target.glob("*/config.pbtxt"):
        rendered = config.read_text()
        (config.parent / RENDERED_CONFIG).write_text(rendered)
        config.write_text(remove_top_level_field(rendered, REMOVED_BLOCK))


def rewrite_arguments(arguments: list[str], copy_root: Path) -> list[str]:
    """The arguments with every model repository replaced by its served copy under `copy_root`."""
    rewritten, index = [], 0
    while index < len(arguments):
        argument = arguments[index]
        flag, separator, value = argument.partition("=")
        if flag in REPOSITORY_FLAGS:
            if not separator:
                index += 1
                if index == len(arguments):
                    raise ValueError(f"{flag} needs a value")
                value = arguments[index]
            copy = copy_root / str(len(list(copy_root.iterdir())))
            served_copy(Path(value), copy)
            argument = f"{flag}={copy}"
        rewritten.append(argument)
        index += 1
    return rewritten


def main(real_binary: str, library_dirs: list[str], python_bin_dir: str, backend_directory: str) -> None:
    """Exec the real server on the served copies.

    `backend_directory` is the image's backends directory next to this wrapper: in a pod it is
    /opt/tritonserver/backends, the server's own default, so passing it changes nothing there;
    outside a pod's mount namespace (tests) it is where the assembled backends are.

    The python backend stub embeds libpython: it must be the interpreter this environment was
    made from (its lib dir first, before the wheel's own copy). The embedded interpreter finds
    its prefix from the `python3` first on PATH, so this environment's bin dir goes first and
    model code sees its packages.
    """
    copy_root = Path(tempfile.mkdtemp(prefix="tritonserver-models-"))
    try:
        arguments = rewrite_arguments(sys.argv[1:], copy_root)
        if not any(argument.partition("=")[0] == BACKEND_DIRECTORY_FLAG for argument in arguments):
            arguments.append(f"{BACKEND_DIRECTORY_FLAG}={backend_directory}")
    except (OSError, ValueError) as error:
        print(f"tritonserver: cannot prepare the model repository: {error}", file=sys.stderr)
        sys.exit(1)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*library_dirs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    env["PATH"] = os.pathsep.join([python_bin_dir, env.get("PATH", os.defpath)])
    os.execve(real_binary, [real_binary, *arguments], env)
