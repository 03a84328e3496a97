"""The llmapi runtime's serving pod, as the sandbox runs it: the real Triton server on the
rendered `tensorrt_llm` config and model.yaml, the image's LLM-API model (the emulated engine)
loading the checkpoint the prepare Job fetched, driven by `llmfleet load`."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from llmfleet.inference.golden import Replica, ask_golden_prompts
from llmfleet.api import LLMDeployment
from llmfleet.catalog import load_catalog
from llmfleet.catalog.release_record import load_release_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, engine_cache_key, layout, render, revision_hash
from llmfleet.render.layout import REQUEST_MODEL
from llmfleet_sandbox import hub, trtllm_image
from llmfleet_sandbox.emulator.checkpoint import engine_config_from_checkpoint
from llmfleet_sandbox.emulator.profile import profile_for_engine
from triton_process import copy_model_code, serve_repository

pytestmark = pytest.mark.integration  # each test serves the model on a real Triton
GPU_TYPE = "A100-SXM-80GB"


def deployment(tensor_parallel_size: int = 1) -> LLMDeployment:
    return LLMDeployment.from_manifest({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10"},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"runtime": "llmapi", "maxBatchSize": 16, "maxNumTokens": 512},
            "slo": {"ttftP99Ms": 5000, "tpotP99Ms": 200},
            "workload": {"inputTokensMean": 200, "inputTokensP99": 400, "outputTokensMean": 40,
                         "outputTokensP99": 80, "peakRequestsPerSecond": 1},
            "plan": {"gpuType": GPU_TYPE, "tensorParallelSize": tensor_parallel_size, "quantization": "BF16",
                     "kvCacheDtype": "BF16", "replicas": 1},
        },
    })


def pod_files(work_dir: Path, tensor_parallel_size: int = 1, edit_model_yaml=None):
    """(image, repository, profile): the prepare Job's cache entry and the init container's
    repository, from the rendered objects."""
    llm = deployment(tensor_parallel_size)
    chosen = plan(plan_request_from_spec(llm.spec))
    objects = {obj["kind"]: obj for obj in render(llm, chosen, revision_hash(llm.spec, chosen), RenderSettings(),
                                                   serving_replicas=1)}
    key = engine_cache_key(llm.spec, chosen)
    engines = work_dir / "engines"
    job_env = {item["name"]: item["value"] for item in objects["Job"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    hub.download(job_env["CHECKPOINT_REPO_ID"], engines / key / layout.CHECKPOINT_SUBDIR)
    image = trtllm_image.image_filesystem(work_dir / "state")
    repository = work_dir / "models"
    items = objects["Deployment"]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    for item in items:
        content = objects["ConfigMap"]["data"][item["key"]].replace(f"{layout.ENGINE_CACHE_PATH}/", f"{engines}/")
        (repository / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (repository / item["path"]).write_text(content)
    model_yaml = repository / layout.TENSORRT_LLM_MODEL / "1" / "model.yaml"
    if edit_model_yaml is not None:
        model_yaml.write_text(yaml.safe_dump(edit_model_yaml(yaml.safe_load(model_yaml.read_text()))))
    copy_model_code(repository, load_release_record("llmapi-25.05"), work_dir / "state")
    arguments = yaml.safe_load(model_yaml.read_text())
    arguments.pop("triton_config")
    profile = profile_for_engine(engine_config_from_checkpoint(Path(arguments["model"]), arguments),
                                 load_catalog().gpu(GPU_TYPE), arguments["kv_cache_config"]["free_gpu_memory_fraction"],
                                 arguments["kv_cache_config"]["enable_block_reuse"])
    return image, repository, profile


LLMAPI_ENV = {trtllm_image.RELEASE_VARIABLE: "llmapi-25.05"}


def load(target: str, output_dir: Path, *flags: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "llmfleet", "load", "--target", target, "--output-dir",
                             str(output_dir), "--quiet", "--seed", "1", *flags],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr + result.stdout
    return json.loads((output_dir / "summary.json").read_text())


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_llmapi_pod_streams_text_from_the_fetched_checkpoint(tmp_path, tensor_parallel_size):
    image, repository, profile = pod_files(tmp_path, tensor_parallel_size)
    label = load_catalog().gpu(GPU_TYPE).gfd_product
    with serve_repository(tmp_path, image, repository, tensor_parallel_size, label, profile, LLMAPI_ENV) as server:
        # No --model: the load generator finds the llmapi model and speaks its inputs.
        summary = load(server.grpc_url, tmp_path / "load", "--schedule", "constant:4", "--duration-s", "3",
                       "--input-tokens", "fixed:64", "--output-tokens", "fixed:8")
        with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
            metrics = response.read().decode()
        # The quality gate's greedy requests, in the model's own input names.
        golden = ask_golden_prompts(Replica("stable", server.grpc_url), [Replica("canary", server.grpc_url)],
                                    REQUEST_MODEL["llmapi"], ["Name a colour.", "What is two plus two?"], 6)
    assert golden.stable.answers == golden.canary[0].answers and golden.stable.errors == ()
    assert [len(answer.split()) for answer in golden.stable.answers] == [6, 6]
    assert summary["requests"] >= 8 and summary["completed"] == summary["requests"] and summary["errors"] == 0
    # Each streamed response is one token: the text so far grows by one word.
    assert summary["output_tokens"] == 8 * summary["requests"]
    assert profile.tensor_parallel_size == tensor_parallel_size
    # The release's metric set: Triton's first-response histogram, no TensorRT-LLM backend series.
    assert 'nv_inference_first_response_histogram_ms_count{model="tensorrt_llm",version="1"}' in metrics
    assert "nv_trt_llm_" not in metrics


def test_an_argument_the_release_does_not_know_fails_the_load(tmp_path):
    image, repository, profile = pod_files(tmp_path, edit_model_yaml=lambda args: {**args, "max_seq_len": 4096})
    label = load_catalog().gpu(GPU_TYPE).gfd_product
    with pytest.raises(RuntimeError, match="exited"):
        with serve_repository(tmp_path, image, repository, 1, label, profile, LLMAPI_ENV):
            pass
    assert "model.yaml: unknown key 'max_seq_len'" in (tmp_path / "triton.log").read_text()
