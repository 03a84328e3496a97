"""The sandbox's images laid out as a container runtime unpacks them: once, safely when many
pods of a fresh sandbox need the same image at the same moment (issue 31: two Triton pods
started together on a fresh sandbox lost one to a FileNotFoundError while both laid out the
image in one shared staging directory)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llmfleet_sandbox import trtllm_image

RACERS = 8
ROUNDS = 3


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below root (relative path -> content)."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def _race(function, state_dir: Path) -> list:
    """Call function(state_dir) from RACERS threads released at one moment; each one's result
    or exception."""
    start = threading.Barrier(RACERS)

    def racer(_):
        start.wait()
        try:
            return function(state_dir)
        except Exception as error:  # noqa: BLE001 - the test reports every racer's failure
            return error

    with ThreadPoolExecutor(RACERS) as pool:
        return list(pool.map(racer, range(RACERS)))


def _complete_triton_image(image: dict[str, Path]) -> None:
    home = image[trtllm_image.TRITON_HOME]
    assert os.access(home / "bin" / "tritonserver", os.X_OK)
    assert (home / "backends" / "python" / "triton_python_backend_stub").is_file()
    assert (home / "backends" / "python" / "triton_python_backend_stub").stat().st_size > 0
    assert "llmfleet_sandbox.emulator.model" in (home / "backends" / "tensorrtllm" / "model.py").read_text()
    assert (home.parents[1] / trtllm_image.COMPLETE_MARKER).is_file()


def _only_published_trees(images: Path) -> None:
    """No temporary or half-made directory is left beside the published trees."""
    leftovers = [path.name for path in images.iterdir() if ".tmp-" in path.name or path.name.endswith(".partial")]
    assert leftovers == []


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_pods_laying_out_one_fresh_triton_image_at_once_all_get_the_same_complete_tree(tmp_path, round_):
    results = _race(trtllm_image.image_filesystem, tmp_path)
    failures = [result for result in results if isinstance(result, Exception)]
    assert failures == [], f"{len(failures)} of {RACERS} racers failed: {failures}"
    assert all(result == results[0] for result in results)
    _complete_triton_image(results[0])
    _only_published_trees(tmp_path / "images")
    # What the last racer sees is what the first laid out: nothing was laid out twice over it.
    assert _tree(results[0][trtllm_image.TRITON_HOME]) == _tree(trtllm_image.image_filesystem(tmp_path)[
        trtllm_image.TRITON_HOME])


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_pods_laying_out_the_fresh_operator_image_at_once_all_get_every_upstream_file(tmp_path, round_):
    results = _race(trtllm_image.upstream_code_filesystem, tmp_path)
    failures = [result for result in results if isinstance(result, Exception)]
    assert failures == [], f"{len(failures)} of {RACERS} racers failed: {failures}"
    assert all(result == results[0] for result in results)
    for image_path, host in results[0].items():
        assert host.is_file(), image_path
    _only_published_trees(tmp_path / "images")


def _lay_out_in_a_process(state_dir: str, results) -> None:
    try:
        image = trtllm_image.image_filesystem(Path(state_dir))
        results.put(str(image[trtllm_image.TRITON_HOME]))
    except Exception as error:  # noqa: BLE001 - reported to the parent
        results.put(repr(error))


def test_processes_laying_out_one_fresh_image_at_once_wait_for_one_another(tmp_path):
    """The lock is the filesystem's: two node agents (or an agent and a test) on one state
    directory lay an image out once between them too."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_lay_out_in_a_process, args=(str(tmp_path), results)) for _ in range(4)]
    for process in processes:
        process.start()
    seen = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    assert len(set(seen)) == 1 and seen[0].endswith(trtllm_image.TRITON_HOME), seen
    _complete_triton_image(trtllm_image.image_filesystem(tmp_path))
    _only_published_trees(tmp_path / "images")


def test_a_tree_an_interrupted_layout_left_is_never_used(tmp_path):
    images = tmp_path / "images"
    name = f"tritonserver-trtllm.{trtllm_image.LAYOUT_VERSION}"
    # A layout killed half-way: its temporary directory, and a tree published without its marker.
    (images / f"{name}.tmp-killed" / "opt").mkdir(parents=True)
    half_made = images / name / "opt" / "tritonserver" / "bin"
    half_made.mkdir(parents=True)
    image = trtllm_image.image_filesystem(tmp_path)
    _complete_triton_image(image)
    _only_published_trees(images)


def test_a_failed_layout_leaves_nothing_and_the_next_pod_lays_it_out(tmp_path, monkeypatch):
    assemble = trtllm_image._assemble_python_backend

    def no_space(backends):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trtllm_image, "_assemble_python_backend", no_space)
    with pytest.raises(OSError, match="No space left"):
        trtllm_image.image_filesystem(tmp_path)
    assert sorted(path.name for path in (tmp_path / "images").iterdir()) == \
        [f"tritonserver-trtllm.{trtllm_image.LAYOUT_VERSION}.lock"]
    monkeypatch.setattr(trtllm_image, "_assemble_python_backend", assemble)
    _complete_triton_image(trtllm_image.image_filesystem(tmp_path))
