"""Release support, honestly (issue 28, part 4): a model whose architecture the pinned release
cannot run is planned all the same, marked with the release it needs (plan and status.plan), and
refused at render with a condition naming that release and the feature; a model it runs plans and
renders as before."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from llmfleet.api import LLMDeployment
from llmfleet.planner import plan
from llmfleet.planner.hf_config import architecture_from_hf_config
from llmfleet.planner.spec_adapter import plan_from_status, plan_request_from_spec, plan_status_from_plan
from llmfleet.render import RenderError, RenderSettings, render
from reconcile_builders import NOW, SETTINGS, body, condition, decide_pass

HF_CONFIGS = Path(__file__).parent / "data" / "hf_configs"
GPT_OSS_NEEDS = ("gpt-oss-120b needs sliding-window attention with attention sinks on alternate layers and MXFP4 "
                 "experts (GptOssForCausalLM), first served by TensorRT-LLM 1.1.0 (")
CANNOT_RUN = "the pinned release llmapi-25.05 (TensorRT-LLM 0.19.0) cannot run it"


def manifest(model: str, source: str, *, runtime: str = "llmapi", max_seq_len: int = 8192) -> dict:
    """The reconcile tests' deployment (H100s) serving `model`, requests up to `max_seq_len` tokens."""
    manifest = copy.deepcopy(body())
    manifest["spec"]["model"] = {"name": model, "source": source}
    manifest["spec"]["engine"] = {"runtime": runtime, "maxSeqLen": max_seq_len}
    return manifest


def planned(manifest: dict):
    deployment = LLMDeployment.model_validate(manifest)
    return deployment, plan(plan_request_from_spec(deployment.spec))


def test_a_model_the_release_runs_is_planned_unmarked_and_rendered():
    deployment, chosen = planned(body())
    assert chosen.feasible and chosen.release_requirement is None
    assert "releaseRequired" not in chosen.to_json_dict()
    assert plan_status_from_plan(chosen).release_required is None
    assert not any(line.startswith("not rendered") for line in chosen.rationale)
    children = render(deployment, chosen, "rev", RenderSettings(), serving_replicas=1)
    assert {child["kind"] for child in children} >= {"ConfigMap", "Job", "Deployment", "Service"}


def test_deepseek_r1_runs_on_the_llmapi_release():
    _, chosen = planned(manifest("deepseek-r1", "hf://deepseek-ai/DeepSeek-R1"))
    assert chosen.release_requirement is None


def test_a_model_the_release_cannot_run_is_planned_and_marked_with_the_release_it_needs():
    _, chosen = planned(manifest("gpt-oss-120b", "hf://openai/gpt-oss-120b"))
    # Planned all the same: the user sees the configuration and why it is not served.
    assert chosen.feasible and chosen.gpu_type == "H100-SXM-80GB" and chosen.replicas >= 1
    needed = chosen.release_requirement
    assert (needed.architecture, needed.first_served_by, needed.release) == ("GptOssForCausalLM", "1.1.0",
                                                                             "llmapi-25.05")
    assert chosen.rationale[-1].startswith("not rendered: " + GPT_OSS_NEEDS)
    assert chosen.to_json_dict()["releaseRequired"]["tensorrtLlmVersion"] == "1.1.0"
    status = plan_status_from_plan(chosen).release_required
    assert (status.tensorrt_llm_version, status.runtime.value, status.architecture) == (
        "1.1.0", "llmapi", "GptOssForCausalLM")
    assert status.message.startswith(GPT_OSS_NEEDS) and CANNOT_RUN in status.message


def test_render_refuses_a_model_the_release_cannot_run_whatever_plan_it_is_given():
    deployment, chosen = planned(manifest("gpt-oss-120b", "hf://openai/gpt-oss-120b"))
    with pytest.raises(RenderError, match=r"^gpt-oss-120b needs sliding-window attention with attention sinks"):
        render(deployment, chosen, "rev", RenderSettings(), serving_replicas=1)
    # A plan stored without the mark (an older operator's) is refused too: render judges the spec.
    unmarked = plan_from_status(plan_status_from_plan(chosen).model_copy(update={"release_required": None}))
    with pytest.raises(RenderError, match=re.escape(CANNOT_RUN)):
        render(deployment, unmarked, "rev", RenderSettings(), serving_replicas=1)


def test_llama_4_runs_within_one_attention_chunk_and_needs_0_21_beyond_it():
    source = "hf://meta-llama/Llama-4-Scout-17B-16E-Instruct"
    deployment, short = planned(manifest("llama-4-scout", source))  # requests of at most 8192 tokens
    assert short.release_requirement is None
    render(deployment, short, "rev", RenderSettings(), serving_replicas=1)
    # The workload is as short as before; a longer request admitted is what matters.
    deployment, long = planned(manifest("llama-4-scout", source, max_seq_len=8193))
    assert (long.release_requirement.architecture, long.release_requirement.first_served_by) == (
        "chunked_attention", "0.21.0")
    with pytest.raises(RenderError, match="chunked attention over contexts longer than one chunk"):
        render(deployment, long, "rev", RenderSettings(), serving_replicas=1)


def test_the_engine_release_points_to_the_llmapi_release_that_runs_deepseek():
    pinned = manifest("deepseek-r1", "hf://deepseek-ai/DeepSeek-R1", runtime="engine")
    pinned["spec"]["resources"] = {"allowedGpuTypes": ["H200-SXM-141GB"]}
    pinned["spec"]["plan"] = {"gpuType": "H200-SXM-141GB", "tensorParallelSize": 8, "quantization": "FP8",
                              "kvCacheDtype": "FP8", "replicas": 1}
    pinned["spec"]["slo"]["quality"]["allowedQuantizations"] = ["FP8"]
    deployment, chosen = planned(pinned)
    assert chosen.release_requirement.alternatives == (("llmapi-25.05", "0.19.0", "llmapi"),)
    with pytest.raises(RenderError, match=r"engine-24.12 \(TensorRT-LLM 0.16.0\) cannot run it: set "
                                          r"spec.engine.runtime to llmapi"):
        render(deployment, chosen, "rev", RenderSettings(), serving_replicas=1)


def test_reconcile_plans_it_creates_nothing_and_says_which_release_it_needs():
    outcome = decide_pass(manifest("gpt-oss-120b", "hf://openai/gpt-oss-120b"), [], SETTINGS, NOW)
    assert outcome.apply == [] and outcome.delete == []
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RenderFailed")
    assert ready["message"].startswith(GPT_OSS_NEEDS) and CANNOT_RUN in ready["message"]
    assert condition(outcome, "Planned")["reason"] == "RenderFailed"
    required = outcome.status["plan"]["releaseRequired"]
    assert (required["tensorrtLlmVersion"], required["runtime"], required["architecture"]) == (
        "1.1.0", "llmapi", "GptOssForCausalLM")
    assert outcome.status["plan"]["gpuType"] == "H100-SXM-80GB"
    assert ("Warning", "RenderFailed") in [(event.type, event.reason) for event in outcome.events]


def test_an_imported_model_is_checked_by_the_class_its_config_names():
    """`model import` keeps config.json's class: an inline Qwen3 MoE is refused like the catalog's."""
    config = json.loads((HF_CONFIGS / "Qwen--Qwen3-30B-A3B_config.json").read_text())
    architecture = architecture_from_hf_config(config).architecture
    assert architecture.model_class == "Qwen3MoeForCausalLM"
    inline = manifest("qwen3-30b-a3b", "hf://Qwen/Qwen3-30B-A3B")
    inline["spec"]["model"] = {"source": "hf://Qwen/Qwen3-30B-A3B",
                               "architecture": architecture.model_dump(by_alias=True, exclude_none=True, mode="json")}
    deployment, chosen = planned(inline)
    assert chosen.feasible and chosen.release_requirement.architecture == "Qwen3MoeForCausalLM"
    with pytest.raises(RenderError, match=re.escape(CANNOT_RUN)):
        render(deployment, chosen, "rev", RenderSettings(), serving_replicas=1)
