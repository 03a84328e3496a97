"""A real Triton server (the binary bundled in nvidia-pytriton) serving the emulator as the
`tensorrt_llm` model on free local ports: for the emulator and load-generator tests and the
emulator benchmark."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as grpcclient

MODEL = "tensorrt_llm"
READY_TIMEOUT_S = 60


@dataclass
class TritonServer:
    grpc_url: str
    metrics_url: str
    log_path: Path

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return response.read().decode()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of the first sample of `name` carrying all `labels` in Prometheus text."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        if line.startswith(name + "{") and all(label in line for label in wanted):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample of {name} {labels}")


def config_pbtxt(profile: dict) -> str:
    profile_json = json.dumps(json.dumps(profile))  # a pbtxt string literal holding the JSON
    return f"""name: "{MODEL}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "engine_profile_json" value: {{ string_value: {profile_json} }} }}
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def start_triton(work_dir: Path, profile: dict) -> Iterator[TritonServer]:
    """Serve `profile` from a model repository under `work_dir`; stop the server (and its
    python backend stubs) on exit."""
    import pytriton

    root = Path(pytriton.__file__).parent / "tritonserver"
    backend_dir = work_dir / "backends" / "python"
    backend_dir.mkdir(parents=True)
    for path in (root / "backends" / "python").iterdir():
        if path.is_file():
            shutil.copy2(path, backend_dir / path.name)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy2(root / "python_backend_stubs" / version / "triton_python_backend_stub", backend_dir)
    model_dir = work_dir / "repo" / MODEL
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(profile))
    (model_dir / "1" / "model.py").write_text("from llmfleet_sandbox.emulator.model import TritonPythonModel  # noqa: F401\n")

    http_port, grpc_port, metrics_port = free_ports(3)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "LD_LIBRARY_PATH": os.pathsep.join([sysconfig.get_config_var("LIBDIR"),
                                            str(root.parent.parent / "nvidia_pytriton.libs")]),
    }
    log_path = work_dir / "triton.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(root / "bin" / "tritonserver"), f"--model-repository={work_dir / 'repo'}",
             f"--backend-directory={work_dir / 'backends'}", f"--http-port={http_port}",
             f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}", "--log-verbose=0"],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = TritonServer(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics", log_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if client.is_model_ready(MODEL):
                    break
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver not ready in {READY_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        client.close()
        yield server
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    # The python backend stubs are in the server's session; make sure none outlive it.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


