"""The llmapi runtime's objects: held to the llmapi release record, planned within what the
release can load (published checkpoints), prepared without a GPU."""

from __future__ import annotations

import pytest
import yaml

from llmfleet.api import LLMDeployment
from llmfleet.catalog.release_record import check_model_yaml, load_release_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, engine_cache_key, render, revision_hash
from llmfleet.render.inference_pool import picker_config
from llmfleet.render.layout import checkpoint_dir
from llmfleet.render.llmapi import llm_arguments
from llmfleet.render.yaml_text import yaml_text
from llmfleet_dev.release_checks import (
    check_model_code_paths,
    check_model_repository,
    check_mpirun_command,
    check_tritonserver_command,
)

RECORD = load_release_record("llmapi-25.05")


def manifest(model: str = "llama-3.1-8b", source: str = "meta-llama/Llama-3.1-8B-Instruct",
             **plan_pins) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10"},
        "spec": {
            "model": {"name": model, "source": f"hf://{source}"},
            "engine": {"runtime": "llmapi"},
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            "workload": {"inputTokensMean": 512, "inputTokensP99": 2048, "outputTokensMean": 128,
                         "outputTokensP99": 512, "peakRequestsPerSecond": 2, "prefixSharingFraction": 0.25},
            "resources": {"allowedGpuTypes": ["H100-SXM-80GB"]},
            **({"plan": plan_pins} if plan_pins else {}),
        },
    }


def rendered(**kwargs):
    deployment = LLMDeployment.from_manifest(manifest(**kwargs))
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible, chosen.rationale
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(), serving_replicas=1)
    return deployment, chosen, {obj["kind"]: obj for obj in objects}


def test_model_repository_and_model_yaml_match_the_record():
    deployment, chosen, objects = rendered(gpuType="H100-SXM-80GB", tensorParallelSize=2, quantization="FP8",
                                           kvCacheDtype="FP8", replicas=1)
    files = {item["path"]: objects["ConfigMap"]["data"][item["key"]]
             for item in objects["Deployment"]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]}
    assert sorted(files) == ["tensorrt_llm/1/model.yaml", "tensorrt_llm/config.pbtxt"]
    assert check_model_repository(RECORD, files) == []
    arguments = yaml.safe_load(files["tensorrt_llm/1/model.yaml"])
    assert check_model_yaml(RECORD, arguments) == []
    key = engine_cache_key(deployment.spec, chosen)
    assert arguments["model"] == checkpoint_dir(key)
    assert (arguments["tensor_parallel_size"], arguments["pytorch_backend_config"]["kv_cache_dtype"]) == (2, "fp8")
    assert arguments["kv_cache_config"]["enable_block_reuse"] is True
    assert arguments["triton_config"] == {"max_batch_size": 0, "decoupled": True}


@pytest.mark.parametrize("pins", [{}, {"tensorParallelSize": 2, "quantization": "FP8", "kvCacheDtype": "FP8"}])
def test_model_yaml_is_the_text_the_pure_python_dumper_writes(pins):
    """The served file (and so the revision hash an operator upgrade compares) is unchanged by
    writing it with libyaml's emitter."""
    deployment, chosen, objects = rendered(gpuType="H100-SXM-80GB", replicas=1, **pins)
    arguments = llm_arguments(deployment.spec, chosen, engine_cache_key(deployment.spec, chosen))
    assert objects["ConfigMap"]["data"].values() and yaml_text(arguments) in objects["ConfigMap"]["data"].values()
    assert yaml_text(arguments) == yaml.safe_dump(arguments, sort_keys=False)
    assert yaml_text(picker_config()) == yaml.safe_dump(picker_config(), sort_keys=False)


def test_a_wrong_model_yaml_key_fails_the_record_check():
    assert check_model_yaml(RECORD, {"max_seq_len": 4096}) != []
    assert check_model_yaml(RECORD, {"kv_cache_config": {"dtype": "fp8"}}) != []
    assert check_model_yaml(RECORD, {"backend": "tensorrt"}) != []


def test_prepare_job_fetches_the_published_checkpoint_without_a_gpu():
    _, _, objects = rendered(gpuType="H100-SXM-80GB", tensorParallelSize=1, quantization="FP8",
                             kvCacheDtype="FP8", replicas=1)
    pod = objects["Job"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["CHECKPOINT_REPO_ID"] == "nvidia/Llama-3.1-8B-Instruct-FP8"
    assert "nvidia.com/gpu" not in container["resources"]["requests"] and "affinity" not in pod
    assert "trtllm-build" not in container["command"][2] and "huggingface-cli download" in container["command"][2]
    assert container["image"] == RECORD.image
    assert objects["Job"]["metadata"]["name"].endswith("-prepare")


def test_serving_pod_copies_the_llmapi_model_code_and_runs_the_rank_group():
    _, _, objects = rendered(gpuType="H100-SXM-80GB", tensorParallelSize=2, quantization="BF16",
                             kvCacheDtype="BF16", replicas=1)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    copied = [line.split('"')[1] for line in init["command"][2].splitlines() if line.startswith('cp "')]
    # tensorrtllm_backend's llmapi model at the release's tag, from the operator's image (the
    # Triton image has no /app).
    assert init["image"] == RenderSettings().model_code_image
    assert copied == [f"/opt/llmfleet/upstream/tensorrtllm_backend/v0.19.0/all_models/llmapi/tensorrt_llm/1/{name}"
                      for name in ("model.py", "helpers.py")]
    assert check_model_code_paths(RECORD, copied) == []
    assert check_model_code_paths(RECORD, [copied[0].replace("v0.19.0", "v0.16.0")]) != []
    command = pod["containers"][0]["command"]
    assert check_mpirun_command(RECORD, command, "tensorrt_llm") == []
    single = rendered(gpuType="H100-SXM-80GB", tensorParallelSize=1, quantization="BF16",
                      kvCacheDtype="BF16", replicas=1)[2]["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert check_tritonserver_command(RECORD, single["command"][1:]) == []


def test_the_planner_offers_only_formats_with_a_checkpoint():
    unpinned = LLMDeployment.from_manifest(manifest(model="mistral-7b", source="mistralai/Mistral-7B-Instruct-v0.1"))
    chosen = plan(plan_request_from_spec(unpinned.spec))
    assert chosen.feasible and chosen.quantization == "BF16"
    pinned = LLMDeployment.from_manifest(manifest(model="mistral-7b", source="mistralai/Mistral-7B-Instruct-v0.1",
                                                  gpuType="H100-SXM-80GB", tensorParallelSize=1, quantization="FP8",
                                                  kvCacheDtype="FP8", replicas=1))
    refused = plan(plan_request_from_spec(pinned.spec))
    assert not refused.feasible
    assert any("serves FP8 only from a published checkpoint and there is none of mistralai/Mistral-7B-Instruct-v0.1"
               in reason for reason in refused.rationale + tuple(r.reason for r in refused.rejected))


@pytest.mark.parametrize("quantization, kv, words", [
    ("BF16", "FP8", "builds a FP8 KV cache only with FP8, NVFP4 weights"),
    ("INT4AWQ", "BF16", "cannot serve INT4AWQ"),
])
def test_pins_the_release_cannot_serve_are_refused(quantization, kv, words):
    deployment = LLMDeployment.from_manifest(manifest(gpuType="H100-SXM-80GB", tensorParallelSize=1,
                                                      quantization=quantization, kvCacheDtype=kv, replicas=1))
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert not chosen.feasible
    assert any(words in line for line in chosen.rationale + tuple(r.reason for r in chosen.rejected))


def test_a_checkpoint_on_a_claim_is_copied_into_the_cache_and_served_unquantised():
    weights = manifest()
    weights["spec"]["model"]["source"] = "pvc://weights/llama-8b"
    deployment = LLMDeployment.from_manifest(weights)
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible and chosen.quantization == "BF16"
    objects = {obj["kind"]: obj for obj in render(deployment, chosen, revision_hash(deployment.spec, chosen),
                                                   RenderSettings(), serving_replicas=1)}
    (container,) = objects["Job"]["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["MODEL_SOURCE_DIR"] == "/model-source/llama-8b" and "CHECKPOINT_REPO_ID" not in env
    assert 'cp -R "$MODEL_SOURCE_DIR/."' in container["command"][2] and "huggingface-cli" not in container["command"][2]
    pinned = manifest(gpuType="H100-SXM-80GB", tensorParallelSize=1, quantization="FP8", kvCacheDtype="FP8", replicas=1)
    pinned["spec"]["model"]["source"] = "pvc://weights/llama-8b"
    refused = plan(plan_request_from_spec(LLMDeployment.from_manifest(pinned).spec))
    assert any("only from a published checkpoint and there is none of pvc://weights/llama-8b" in reason
               for reason in refused.rationale + tuple(r.reason for r in refused.rejected))
