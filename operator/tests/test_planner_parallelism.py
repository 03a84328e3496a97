"""Layouts beyond tensor parallelism (issue 28, part 2): pipeline and expert parallelism and
attention data parallelism, each chosen when, and only when, the model says why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.api import LLMDeployment
from llmfleet.catalog import load_catalog, model_from_numbers
from llmfleet.catalog.release_record import load_release_record
from llmfleet.planner import PlanRequest, SearchSpace, SloTargets, Workload, plan
from llmfleet.planner.latency import (
    build_engine,
    gemm_flops_per_token,
    prefill_attention_flops,
    prefill_seconds,
    rank_imbalance_slowdown,
    rank_local_gemm_flops_per_token,
    step_seconds,
)
from llmfleet.planner.layout import Layout, stage_layer_ranges
from llmfleet.planner.memory import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from llmfleet.planner.spec_adapter import plan_from_status, plan_status_from_plan
from llmfleet.render import RenderError, RenderSettings, render
from render_builders import manifest

CATALOG = load_catalog()
DEEPSEEK = CATALOG.model("deepseek-r1")
CHAT = Workload(input_tokens_mean=1000, input_tokens_p99=4000, output_tokens_mean=500, output_tokens_p99=2000,
                peak_requests_per_sec=2)
LONG = Workload(input_tokens_mean=4000, input_tokens_p99=8000, output_tokens_mean=1000, output_tokens_p99=4000,
                peak_requests_per_sec=8)


def deepseek_plan(gpu: str, quantizations: tuple[str, ...] = ("FP8",), workload: Workload = CHAT,
                  **space: object):
    # A budget that admits NVFP4 (6.2 % in the catalog) with an FP8 cache.
    return plan(PlanRequest(DEEPSEEK, workload, SloTargets(5000, 100, max_quality_loss_percent=7.0),
                            SearchSpace(gpu_types=(gpu,), quantizations=quantizations, kv_cache_dtypes=("FP8",),
                                        **space)), CATALOG)


def engine(layout: Layout, gpu: str = "H100-SXM-80GB"):
    return build_engine(DEEPSEEK, CATALOG.gpu(gpu), CATALOG.quantization("FP8"), CATALOG.kv_cache_dtype("FP8"),
                        layout, CATALOG.calibration, max_batch_size=256, max_num_tokens=8192,
                        kv_cache_free_gpu_mem_fraction=0.9)


def test_deepseek_r1_on_h100_needs_two_nodes_one_stage_each():
    result = deepseek_plan("H100-SXM-80GB")
    assert result.feasible
    assert (result.tensor_parallel_size, result.pipeline_parallel_size, result.nodes_per_replica) == (8, 2, 2)
    assert result.layout.gpus == 16
    layout_line = next(line for line in result.rationale if line.startswith("layout TP8 PP2"))
    assert "no TP size alone holds the weights on one H100-SXM-80GB" in layout_line
    assert "spans 2 node(s)" in layout_line and "over the network between nodes" in layout_line
    others = next(line for line in result.rationale if line.startswith("other layouts:"))
    assert "TP (best H100-SXM-80GB TP8 FP8 KV FP8): memory: weights 80.7 GiB" in others
    assert result.to_json_dict()["nodesPerReplica"] == 2


def test_deepseek_r1_on_h200_fits_one_node_of_eight():
    result = deepseek_plan("H200-SXM-141GB")
    assert result.feasible
    assert (result.layout.gpus, result.pipeline_parallel_size, result.nodes_per_replica) == (8, 1, 1)
    # EP and ADP meet the SLO with as many GPUs here: the simpler layout is kept, and said so.
    assert result.layout.is_tensor_parallel_only
    others = next(line for line in result.rationale if line.startswith("other layouts:"))
    assert "TP x EP + ADP (best H200-SXM-141GB TP8 EP8 ADP FP8 KV FP8 x1): not-chosen" in others
    assert "TP8 does with less communication than TP8 EP8 ADP" in others


def test_deepseek_r1_on_b200_in_nvfp4_needs_fewer_gpus_than_a_node():
    result = deepseek_plan("B200-180GB", quantizations=("NVFP4",))
    assert result.feasible and result.quantization == "NVFP4"
    assert result.layout.gpus < 8 and result.nodes_per_replica == 1


def test_attention_data_parallel_is_chosen_when_the_latent_cache_would_repeat_on_every_rank():
    busy = deepseek_plan("H200-SXM-141GB", workload=LONG)
    assert busy.layout == Layout(8, 1, 8, attention_data_parallel=True)
    line = next(line for line in busy.rationale if line.startswith("layout TP8 EP8 ADP"))
    assert "its own sequences' KV" in line and "MoE all-to-all" in line
    tensor_only = next(line for line in busy.rationale if line.startswith("other layouts:"))
    assert "TP (best H200-SXM-141GB TP8 FP8 KV FP8" in tensor_only and "needs" in tensor_only
    # At a quiet load TP alone holds enough: no reason for ADP.
    quiet = deepseek_plan("H200-SXM-141GB", workload=replace(LONG, peak_requests_per_sec=1))
    assert quiet.layout.is_tensor_parallel_only


def test_a_release_without_expert_parallelism_gets_no_expert_layout():
    engine_release = load_release_record("engine-24.12")
    result = deepseek_plan("H200-SXM-141GB", workload=LONG, release=engine_release.release,
                           release_support=replace(engine_release.support, gpu_types=("H200-SXM-141GB",),
                                                   quantizations=("FP8",), kv_cache_dtypes=("FP8",),
                                                   kv_cache_dtype_requires_quantization={}))
    assert result.feasible
    assert result.expert_parallel_size == 1 and not result.attention_data_parallel
    assert not any("EP" in r.option for r in result.rejected)


def test_expert_parallelism_is_chosen_when_tp_cannot_split_the_experts():
    # 1,004 columns per expert: TP8 cannot split them, four ranks can (EP2 x expert TP4).
    model = model_from_numbers(name="odd-experts", num_layers=16, hidden_size=4096, num_attention_heads=32,
                               num_kv_heads=8, intermediate_size=14336, vocab_size=32000, num_experts=16,
                               experts_per_token=2, expert_intermediate_size=1004)
    space = SearchSpace(gpu_types=("H100-SXM-80GB",), tensor_parallel_sizes=(8,), quantizations=("BF16",),
                        kv_cache_dtypes=("BF16",))
    result = plan(PlanRequest(model, CHAT, SloTargets(5000, 100), space), CATALOG)
    assert result.feasible and result.layout == Layout(8, 1, 2)
    assert any("TP8 does not divide expert intermediate size 1004" in r.reason for r in result.rejected)


def test_a_dense_model_that_fits_a_node_searches_no_other_layout():
    request = PlanRequest(CATALOG.model("llama-3.1-70b"), CHAT, SloTargets(2000, 50),
                          SearchSpace(gpu_types=("H100-SXM-80GB", "H200-SXM-141GB")))
    result = plan(request, CATALOG)
    assert result.layout.is_tensor_parallel_only
    assert not any(" PP" in r.option or " EP" in r.option for r in result.rejected)
    assert not any(line.startswith(("layout", "other layouts")) for line in result.rationale)
    assert result == plan(replace(request, space=replace(request.space, pipeline_parallel_sizes=(1,))), CATALOG)


def test_stages_split_the_layers_and_their_memory():
    assert [len(r) for r in stage_layer_ranges(61, 2)] == [31, 30]
    # DeepSeek's latent cache per token in FP8: 576 B per layer, the larger stage's 31 layers.
    assert kv_bytes_per_token_per_gpu(DEEPSEEK, CATALOG.kv_cache_dtype("FP8"), Layout(8, 2)) == 31 * 576
    one_stage = weight_bytes_per_gpu(DEEPSEEK, CATALOG.quantization("FP8"), 8)
    two_stages = weight_bytes_per_gpu(DEEPSEEK, CATALOG.quantization("FP8"), Layout(8, 2))
    assert 0.5 * one_stage < two_stages < 0.55 * one_stage


def test_attention_data_parallel_holds_each_ranks_own_sequences():
    tensor = engine(Layout(8), "H200-SXM-141GB").fit
    adp = engine(Layout(8, 1, 8, attention_data_parallel=True), "H200-SXM-141GB").fit
    # Attention whole on every rank: more weights, less KV pool per GPU, but eight sequence shards.
    assert adp.weight_bytes_per_gpu > tensor.weight_bytes_per_gpu
    assert adp.kv_capacity_tokens > 4 * tensor.kv_capacity_tokens
    assert adp.kv_bytes_read_per_sequence(4096) == tensor.kv_bytes_read_per_sequence(4096) / 8


def test_stage_handoffs_cross_nodes_over_the_pools_network():
    h100 = CATALOG.gpu("H100-SXM-80GB")
    cal = CATALOG.calibration
    two_nodes = engine(Layout(8, 2))
    # Two hops around the ring (forward, and the sampled token back), both between the nodes.
    assert two_nodes.handoff_seconds_per_step == pytest.approx(2 * h100.inter_node_latency_us * 1e-6)
    network = h100.inter_node_bandwidth_bytes_per_sec * cal.interconnect_efficiency
    assert two_nodes.handoff_seconds_per_token == pytest.approx(DEEPSEEK.hidden_size * 2 / network / 2)
    # Two stages of TP4 share one node: NVLink and its latency.
    one_node = engine(Layout(4, 2), "H200-SXM-141GB")
    assert one_node.handoff_seconds_per_step == pytest.approx(2 * cal.allreduce_latency_us * 1e-6)
    assert engine(Layout(8)).handoff_seconds_per_step == 0


def test_a_prompt_waits_out_the_pipeline_bubble():
    staged = engine(Layout(8, 2))
    with_prompt = step_seconds(staged, 0.0, 0.0, 2000, prefill_attention_flops(DEEPSEEK, 2000, 0.0),
                               prefill_sequences=1.0)
    alone = step_seconds(staged, 0.0, 0.0)
    # Its one chunk passes the second stage after the first: once more its own work.
    assert prefill_seconds(staged, 2000, 0.0, 0.0, 0.0) == pytest.approx(
        with_prompt + (with_prompt - alone), rel=1e-3)


def test_all_to_all_only_under_attention_data_parallelism():
    assert engine(Layout(8, 1, 8)).alltoall_seconds_per_token == 0
    adp = engine(Layout(8, 1, 8, attention_data_parallel=True), "H200-SXM-141GB")
    assert adp.allreduce_seconds_per_token == 0 and adp.alltoall_seconds_per_token > 0


def test_under_attention_data_parallelism_a_prompts_own_layers_run_on_its_rank():
    # DeepSeek-R1: of 71.4 GFLOPs per token, the routed experts' 8 x 58 x 44 M weights are spread
    # over the EP ranks; attention, dense-first layers and the shared expert (30.5 GFLOPs) are not.
    assert gemm_flops_per_token(DEEPSEEK) / 1e9 == pytest.approx(71.40, abs=0.01)
    assert rank_local_gemm_flops_per_token(DEEPSEEK) / 1e9 == pytest.approx(30.53, abs=0.01)
    adp = engine(Layout(8, 1, 8, attention_data_parallel=True), "H200-SXM-141GB")
    tensor = engine(Layout(8, 1, 8), "H200-SXM-141GB")
    attention = prefill_attention_flops(DEEPSEEK, 2000, 0.0)
    # A lone prompt's TTFT: its rank-local work on one rank of eight, the experts' on all.
    local_s = ((2000 * rank_local_gemm_flops_per_token(DEEPSEEK) + 2 * DEEPSEEK.vocab_size * DEEPSEEK.hidden_size)
               / adp.prefill_gemm_flops_per_sec + attention / adp.prefill_attention_flops_per_sec)
    shared_s = 2000 * (gemm_flops_per_token(DEEPSEEK) - rank_local_gemm_flops_per_token(DEEPSEEK)) \
        / adp.prefill_gemm_flops_per_sec
    fixed_s = adp.communication_seconds_per_step + adp.overhead_seconds_per_step
    weights_s = step_seconds(adp, 0.0, 0.0) - fixed_s
    assert prefill_seconds(adp, 2000, 0.0, 0.0, 0.0) == pytest.approx(
        max(weights_s, shared_s) + fixed_s + 2000 * adp.communication_seconds_per_token + 8 * local_s, rel=1e-6)
    # Without ADP every rank shares every prompt: the same step is far shorter.
    assert prefill_seconds(tensor, 2000, 0.0, 0.0, 0.0) < 0.5 * prefill_seconds(adp, 2000, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("balanced_s, rest_s, slowdown", [
    (0.0, 0.05, 1.0),        # no prompt work
    (0.01, 0.04, 4.161),     # each rank busy a fifth of a step: (1 - 0.8^8) / 0.2
    (0.05, 1e-9, 1.0),       # prompts keep every rank busy: no rank waits
    (1e-6, 0.05, 8.0),       # a rare prompt: its rank alone, the seven others wait
])
def test_ranks_wait_for_the_busiest_ranks_prompt_work(balanced_s, rest_s, slowdown):
    assert rank_imbalance_slowdown(8, balanced_s, rest_s) == pytest.approx(slowdown, rel=1e-3)
    assert rank_imbalance_slowdown(1, balanced_s, rest_s) == 1.0


def test_attention_data_parallel_throughput_pays_for_the_busiest_rank():
    adp = engine(Layout(8, 1, 8, attention_data_parallel=True), "H200-SXM-141GB")
    local = 3000 * rank_local_gemm_flops_per_token(DEEPSEEK) / adp.prefill_gemm_flops_per_sec
    with_prompts = step_seconds(adp, 256, 1500, 3000, 0.0)
    decode = step_seconds(adp, 256, 1500)
    # Three prompts' rank-local work, spread evenly over the eight ranks, plus their experts and
    # all-to-all would add under twice that work; on three ranks of eight the step waits about 5x.
    assert with_prompts - decode > 3 * local


def test_a_plan_spanning_nodes_is_explained_and_rendered_as_a_leader_worker_set():
    spanning = deepseek_plan("H100-SXM-80GB")
    status = plan_status_from_plan(spanning)
    assert (status.pipeline_parallel_size, status.nodes_per_replica) == (2, 2)
    assert plan_from_status(status).nodes_per_replica == 2
    deployment = LLMDeployment.model_validate(manifest(8))
    objects = render(deployment, plan_from_status(status), "rev", RenderSettings(), serving_replicas=1)
    (workload,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    assert workload["spec"]["leaderWorkerTemplate"]["size"] == 2


def test_a_layout_the_release_does_not_build_is_refused_at_render():
    deployment = LLMDeployment.model_validate(manifest(8))  # the engine runtime: no expert parallelism
    chosen = plan_from_status(plan_status_from_plan(deepseek_plan("H200-SXM-141GB", workload=LONG)))
    with pytest.raises(RenderError, match="engine-24.12 does not build expert parallelism"):
        render(deployment, chosen, "rev", RenderSettings(), serving_replicas=1)
