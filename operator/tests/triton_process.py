"""A real Triton server (nvidia-pytriton's, through the sandbox image's wrapper and backends)
serving the operator's rendered model repository on an emulated engine, on free local ports:
for the emulator and load-generator tests and the emulator benchmarks.

What a serving pod has is laid out under a work directory as the pod would see it: the image
from `trtllm_image.image_filesystem`, an engine cache entry (config.json in TensorRT-LLM's
layout, the sandbox tokenizer), the repository from `model_repository_files` plus the tokenizer
models' code copied from the image as the init container does, and LLMFLEET_SANDBOX_GPU_PRODUCT
set as on a GPU node.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import tritonclient.grpc as grpcclient

from llmfleet.api import LLMDeploymentSpec
from llmfleet.catalog import load_catalog
from llmfleet.catalog.release_record import RUNTIME_RELEASES, load_release_record
from llmfleet.render import RenderSettings, layout, serving
from llmfleet.render.model_repo import (KV_CACHE_FREE_GPU_MEM_FRACTION, TOKENIZER_INSTANCE_COUNT, model_repository_files)
from llmfleet.render.identity import prefix_reuse_enabled
from llmfleet.simulation.profile import EngineProfile
from llmfleet_sandbox import images, trtllm_image
from llmfleet_sandbox.emulator import tokenizer
from llmfleet_sandbox.emulator.engine_config import (EngineConfig, dtype_for, kv_cache_quant_algo_for,
                                                     quant_algo_for)
from llmfleet_sandbox.emulator.profile import GPU_PRODUCT_VARIABLE, engine_profile

MODEL = layout.ENSEMBLE_MODEL  # what clients call
ENGINE_MODEL = layout.TENSORRT_LLM_MODEL  # what the engine's metrics are labelled with
ENGINE_CACHE_KEY = "0123456789abcdef0123"
READY_TIMEOUT_S = 60


@dataclass
class TritonServer:
    grpc_url: str
    metrics_url: str
    log_path: Path
    profile: EngineProfile | None  # what the backend derived (the same call it makes)

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


def deployment_spec(model: str = "llama-3.1-8b", gpu_type: str = "A100-SXM-80GB", quantization: str = "BF16",
                    kv_cache_dtype: str = "BF16", tensor_parallel_size: int = 1, *, max_batch_size: int = 16,
                    max_num_tokens: int = 512, max_input_len: int = 2048, max_seq_len: int = 4096,
                    prefix_sharing_fraction: float = 0.0) -> LLMDeploymentSpec:
    """An LLMDeployment spec with its configuration pinned (the engine the test serves)."""
    return LLMDeploymentSpec.model_validate({
        "model": {"name": model},
        "engine": {"maxBatchSize": max_batch_size, "maxInputLen": max_input_len, "maxSeqLen": max_seq_len,
                   "maxNumTokens": max_num_tokens},
        "slo": {"ttftP99Ms": 5000, "tpotP99Ms": 200},
        "workload": {"inputTokensMean": 200, "inputTokensP99": 400, "outputTokensMean": 40,
                     "outputTokensP99": 80, "peakRequestsPerSecond": 1,
                     "prefixSharingFraction": prefix_sharing_fraction},
        "resources": {"allowedGpuTypes": [gpu_type]},
        "plan": {"tensorParallelSize": tensor_parallel_size, "quantization": quantization,
                 "kvCacheDtype": kv_cache_dtype, "replicas": 1},
    })


def engine_config_for(spec: LLMDeploymentSpec) -> EngineConfig:
    """The config.json the build writes for `spec`'s pinned configuration (the build contract)."""
    model = load_catalog().model(spec.model.name.value)
    quantization, kv_cache_dtype = spec.plan.quantization.value, spec.plan.kv_cache_dtype.value
    tp = spec.plan.tensor_parallel_size
    return EngineConfig(
        version="0.16.0", architecture="LlamaForCausalLM", dtype=dtype_for(quantization, kv_cache_dtype),
        num_hidden_layers=model.num_layers, hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_kv_heads, head_size=model.head_dim, vocab_size=model.vocab_size,
        max_position_embeddings=model.max_position_embeddings, quant_algo=quant_algo_for(quantization),
        kv_cache_quant_algo=kv_cache_quant_algo_for(kv_cache_dtype), world_size=tp, tp_size=tp, pp_size=1,
        max_batch_size=spec.engine.max_batch_size, max_input_len=spec.engine.max_input_len,
        max_seq_len=spec.engine.max_seq_len, max_num_tokens=spec.engine.max_num_tokens,
        num_experts=model.num_experts, experts_per_token=model.experts_per_token,
        tie_word_embeddings=model.tie_word_embeddings)


def gpu_product(spec: LLMDeploymentSpec) -> str:
    return load_catalog().gpu(spec.resources.allowed_gpu_types[0].value).gfd_product


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _write_engine(engines: Path, spec: LLMDeploymentSpec) -> None:
    entry = engines / ENGINE_CACHE_KEY
    (entry / layout.ENGINE_SUBDIR).mkdir(parents=True)
    (entry / layout.ENGINE_SUBDIR / "config.json").write_text(json.dumps(engine_config_for(spec).to_json_dict()))
    (entry / layout.TOKENIZER_SUBDIR).mkdir()
    model = load_catalog().model(spec.model.name.value)
    (entry / layout.TOKENIZER_SUBDIR / tokenizer.CONFIG_FILE).write_text(
        json.dumps(tokenizer.tokenizer_config(model.vocab_size)))
    (entry / layout.BUILD_COMPLETE_MARKER).write_text(ENGINE_CACHE_KEY)


def _write_repository(repository: Path, engines: Path, state_dir: Path, spec: LLMDeploymentSpec,
                      kv_cache_free_gpu_mem_fraction: float) -> None:
    for path, content in model_repository_files(spec, ENGINE_CACHE_KEY).items():
        # A pod sees the engine cache at /engines; here it is a plain directory.
        content = content.replace(f'"{layout.ENGINE_CACHE_PATH}/', f'"{engines}/')
        if path == f"{ENGINE_MODEL}/config.pbtxt":
            rendered = f'string_value: "{KV_CACHE_FREE_GPU_MEM_FRACTION}"'
            assert rendered in content, content
            content = content.replace(rendered, f'string_value: "{kv_cache_free_gpu_mem_fraction}"')
        (repository / path).parent.mkdir(parents=True, exist_ok=True)
        (repository / path).write_text(content)
    copy_model_code(repository, load_release_record(RUNTIME_RELEASES["engine"]), state_dir)


def copy_model_code(repository: Path, release, state_dir: Path) -> None:
    """As the serving pod's init container: the release's model code from the operator's image."""
    upstream = trtllm_image.upstream_code_filesystem(state_dir)
    for image_path, repository_path in serving.model_code_files(release):
        shutil.copy(upstream[image_path], repository / repository_path)


NODE_LABEL = object()  # the GPU product of the spec's GPU type, as its node's label says


@contextlib.contextmanager
def start_triton(work_dir: Path, spec: LLMDeploymentSpec,
                 kv_cache_free_gpu_mem_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION, *,
                 gpu_product_label: str | None | object = NODE_LABEL,
                 with_engine: bool = True, env: dict[str, str] | None = None) -> Iterator[TritonServer]:
    """Serve `spec`'s engine with its pod's command (one GPU: tritonserver; more: mpirun); stop
    the server (and its python backend stubs) on exit. `kv_cache_free_gpu_mem_fraction` replaces
    the rendered parameter (to make a small KV cache); `gpu_product_label` None leaves
    LLMFLEET_SANDBOX_GPU_PRODUCT unset and `with_engine` False leaves the engine unbuilt (for
    load failures); `env` is added to the server's environment (the sandbox's faults)."""
    image = trtllm_image.image_filesystem(work_dir / "state")
    engines, repository = work_dir / "engines", work_dir / "models"
    if with_engine:
        _write_engine(engines, spec)
    _write_repository(repository, engines, work_dir / "state", spec, kv_cache_free_gpu_mem_fraction)
    label = gpu_product(spec) if gpu_product_label is NODE_LABEL else gpu_product_label
    profile = engine_profile(engines / ENGINE_CACHE_KEY / layout.ENGINE_SUBDIR, label,
                             kv_cache_free_gpu_mem_fraction, prefix_reuse_enabled(spec)) \
        if with_engine and label is not None else None

    with serve_repository(work_dir, image, repository, spec.plan.tensor_parallel_size, label, profile,
                          env) as triton:
        if profile is not None:
            warm_up(triton)
        yield triton


@contextlib.contextmanager
def serve_repository(work_dir: Path, image: dict[str, Path], repository: Path, tensor_parallel_size: int,
                     gpu_product_label: str | None, profile, env: dict[str, str] | None = None,
                     ) -> Iterator[TritonServer]:
    """Run the pod's rendered server command on `repository`, with this machine's paths and free
    ports in place of the pod's; stop it (and its python backend stubs) on exit."""
    tmp = work_dir / "tmp"
    tmp.mkdir(exist_ok=True)
    http_port, grpc_port, metrics_port = free_ports(3)
    local = {"tritonserver": str(image[trtllm_image.TRITON_HOME] / "bin" / "tritonserver"),
             serving.MPIRUN: str(image[trtllm_image.MPIRUN_PATH]),
             f"--model-repository={layout.MODEL_REPOSITORY_PATH}": f"--model-repository={repository}",
             f"--http-port={layout.HTTP_PORT}": f"--http-port={http_port}",
             f"--grpc-port={layout.GRPC_PORT}": f"--grpc-port={grpc_port}",
             f"--metrics-port={layout.METRICS_PORT}": f"--metrics-port={metrics_port}"}
    rendered = serving.triton_command(SimpleNamespace(tensor_parallel_size=tensor_parallel_size,
                                                      pipeline_parallel_size=1), RenderSettings())
    command = [local.get(arg, arg) for arg in rendered]
    server_env = {key: value for key, value in os.environ.items() if key != GPU_PRODUCT_VARIABLE}
    server_env["TMPDIR"] = str(tmp)
    # As in the image: python3 (the stand-ins' interpreter) is this environment's.
    server_env["PATH"] = f"{images.ENVIRONMENT_BIN}:{server_env.get('PATH', '/usr/bin:/bin')}"
    if gpu_product_label is not None:
        server_env[GPU_PRODUCT_VARIABLE] = gpu_product_label
    server_env.update(env or {})
    log_path = work_dir / "triton.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=server_env,
                                   start_new_session=True)
    triton = TritonServer(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics", log_path, profile)
    try:
        wait_ready(process, triton)
        yield triton
    finally:
        _stop(process)


def wait_ready(process: subprocess.Popen, triton: TritonServer) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {process.returncode}:\n"
                                   f"{triton.log_path.read_text()[-4000:]}")
            try:
                if client.is_server_ready():
                    return
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver not ready in {READY_TIMEOUT_S} s:\n"
                                   f"{triton.log_path.read_text()[-4000:]}")
            time.sleep(0.2)
    finally:
        client.close()


def warm_up(triton: TritonServer) -> None:
    """One small request per tokenizer model instance: each instance's first request takes
    hundreds of milliseconds, which would land in the TTFT of the requests a test measures."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES"), grpcclient.InferInput("max_tokens", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([[b"warm up"]], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([[1]], dtype=np.int32))
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put(error))
    try:
        for _ in range(2 * TOKENIZER_INSTANCE_COUNT):  # one at a time, so each lands on the next instance
            client.async_stream_infer(MODEL, inputs)
            error = responses.get(timeout=READY_TIMEOUT_S)
            if error is not None:
                raise RuntimeError(f"warm-up request failed: {error}")
    finally:
        client.stop_stream()
        client.close()


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
