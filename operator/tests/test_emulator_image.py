"""The sandbox image's stand-ins without a server: engine config, tokenizer, profile derivation,
the tritonserver wrapper's config edit and the launcher's command."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest

from llmfleet.catalog import load_catalog
from llmfleet.catalog.release_record import load_release_record, release_names
from llmfleet.planner.latency import build_engine, prefill_seconds, step_seconds
from llmfleet.render import RenderSettings, serving
from llmfleet.render.model_repo import KV_CACHE_FREE_GPU_MEM_FRACTION, model_repository_files
from llmfleet_sandbox import trtllm_image
from llmfleet_sandbox.emulator.engine_config import (EngineConfigError, engine_config_from_json_dict,
                                                     kv_cache_quant_algo_for, quant_algo_for, read_engine_config)
from llmfleet.simulation.profile import ProfileError
from llmfleet.simulation.timing import expected_tpot_ms, expected_ttft_ms
from llmfleet_sandbox.emulator.profile import engine_profile, gpu_for_product, profile_for_engine, ranks_per_node
from llmfleet_sandbox.emulator.tokenizer import VOCABULARY, TokenizerError, WordTokenizer, tokenizer_config
from llmfleet_sandbox.image import mpirun
from llmfleet_sandbox.image.tritonserver import RENDERED_CONFIG, remove_top_level_field, rewrite_arguments
from triton_process import deployment_spec, engine_config_for


def test_catalog_quantisations_map_to_tensorrt_llm_names_and_back():
    catalog = load_catalog()
    assert [quant_algo_for(name) for name in catalog.quantizations] == \
        [None, None, "FP8", "W8A16", "W4A16_AWQ", "W8A8_SQ_PER_CHANNEL", "NVFP4"]
    assert [kv_cache_quant_algo_for(name) for name in catalog.kv_cache_dtypes] == [None, None, "FP8", "INT8"]
    for quantization in ("BF16", "FP8", "INT8WeightOnly", "INT4AWQ", "INT8SmoothQuant"):
        for kv_dtype in ("BF16", "FP8", "INT8"):
            spec = deployment_spec(gpu_type="H100-SXM-80GB", quantization=quantization, kv_cache_dtype=kv_dtype)
            config = engine_config_from_json_dict(json.loads(json.dumps(engine_config_for(spec).to_json_dict())))
            assert (config.catalog_quantization(), config.catalog_kv_cache_dtype()) == (quantization, kv_dtype)
    fp16 = engine_config_for(deployment_spec(quantization="FP16", kv_cache_dtype="FP16"))
    assert (fp16.dtype, fp16.catalog_quantization(), fp16.catalog_kv_cache_dtype()) == ("float16", "FP16", "FP16")


def test_engine_config_errors_name_the_file_and_key(tmp_path):
    with pytest.raises(EngineConfigError, match="does not exist"):
        read_engine_config(tmp_path / "missing")
    with pytest.raises(EngineConfigError, match="has no config.json"):
        read_engine_config(tmp_path)
    data = engine_config_for(deployment_spec()).to_json_dict()
    del data["build_config"]["max_num_tokens"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(EngineConfigError, match="build_config.max_num_tokens is missing"):
        read_engine_config(tmp_path)
    data = engine_config_for(deployment_spec()).to_json_dict()
    data["pretrained_config"]["moe"] = {"num_experts": 0, "top_k": 0}  # how TensorRT-LLM writes a dense model
    assert engine_config_from_json_dict(data).num_experts == 1


def test_profile_reproduces_the_planners_idle_engine():
    spec = deployment_spec("llama-3.1-70b", "H100-SXM-80GB", "FP8", "BF16", 2, max_num_tokens=4096)
    config = engine_config_for(spec)
    gpu = gpu_for_product("NVIDIA-H100-80GB-HBM3")
    profile = profile_for_engine(config, gpu, KV_CACHE_FREE_GPU_MEM_FRACTION, enable_prefix_reuse=True)
    assert (profile.gpu_type, profile.tensor_parallel_size, profile.quantization, profile.kv_cache_dtype) == \
        ("H100-SXM-80GB", 2, "FP8", "BF16")
    assert (profile.max_batch_size, profile.max_num_tokens, profile.enable_prefix_reuse) == (16, 4096, True)
    catalog = load_catalog()
    engine = build_engine(catalog.model("llama-3.1-70b"), gpu, catalog.quantization("FP8"),
                          catalog.kv_cache_dtype("BF16"), 2, catalog.calibration, max_batch_size=16,
                          max_num_tokens=4096, kv_cache_free_gpu_mem_fraction=KV_CACHE_FREE_GPU_MEM_FRACTION)
    assert profile.kv_capacity_tokens == pytest.approx(engine.fit.kv_capacity_tokens, abs=profile.kv_block_tokens)
    # A linearisation of a roofline: close to the planner, exact only at the ends of its secants.
    empty_step_ms = step_seconds(engine, 0, 0) * 1000
    for prompt_tokens in (512, 4096):
        planner_ttft_ms = prefill_seconds(engine, prompt_tokens, 0, 0, 0) * 1000
        assert planner_ttft_ms * 0.9 <= expected_ttft_ms(profile, prompt_tokens) <= planner_ttft_ms * 1.1 + empty_step_ms
    for batch, context in ((1, 1024), (16, 1024)):
        assert expected_tpot_ms(profile, batch, context) == pytest.approx(step_seconds(engine, batch, context) * 1000,
                                                                          rel=0.25)
    # A smaller KV fraction leaves fewer blocks and changes nothing else.
    smaller = profile_for_engine(config, gpu, KV_CACHE_FREE_GPU_MEM_FRACTION / 2, enable_prefix_reuse=True)
    assert smaller.kv_blocks_total < profile.kv_blocks_total
    assert smaller.decode_step_base_ms == profile.decode_step_base_ms


def test_a_rank_group_spanning_nodes_pays_the_planners_network_hand_off():
    """Llama 3.1 405B BF16 as TP8 PP2 on H100: its stages on two nodes (eight ranks per node, as
    mpirun places them) pay the pipeline hand-offs over the network, on one node of 16 over NVLink;
    the difference is the planner's, and the engine's PP is in the profile at all."""
    spec = deployment_spec("llama-3.1-405b", "H100-SXM-80GB", "BF16", "BF16", 8, max_num_tokens=4096)
    config = dataclasses.replace(engine_config_for(spec), world_size=16, pp_size=2)
    gpu = gpu_for_product("NVIDIA-H100-80GB-HBM3")
    catalog = load_catalog()
    two_nodes, one_node = (profile_for_engine(config, gpu, KV_CACHE_FREE_GPU_MEM_FRACTION, True, gpus_per_node=ranks)
                           for ranks in (ranks_per_node({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}), 16))
    hand_offs_crossing = 2  # the forward one between the nodes and the sampled token back
    network_ms = hand_offs_crossing * (gpu.inter_node_latency_us - catalog.calibration.allreduce_latency_us) / 1000
    assert two_nodes.decode_step_base_ms - one_node.decode_step_base_ms == pytest.approx(network_ms, rel=1e-3)
    assert two_nodes.decode_step_ms_per_sequence > one_node.decode_step_ms_per_sequence
    # Undeclared placement: whole nodes of the GPU type, as the planner fills them.
    assert profile_for_engine(config, gpu, KV_CACHE_FREE_GPU_MEM_FRACTION, True) == two_nodes
    assert ranks_per_node({}) is None
    with pytest.raises(ProfileError, match="OMPI_COMM_WORLD_LOCAL_SIZE='0'"):
        ranks_per_node({"OMPI_COMM_WORLD_LOCAL_SIZE": "0"})


def test_unknown_or_missing_gpu_product_is_a_clear_error():
    with pytest.raises(ProfileError, match="LLMFLEET_SANDBOX_GPU_PRODUCT is not set"):
        gpu_for_product(None)
    with pytest.raises(ProfileError, match="'NVIDIA-GeForce-RTX-4090' is not a GPU product of the catalog"):
        gpu_for_product("NVIDIA-GeForce-RTX-4090")
    assert gpu_for_product("NVIDIA-H200").name == "H200-SXM-141GB"


def test_engine_profile_reads_the_engine_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(engine_config_for(deployment_spec()).to_json_dict()))
    profile = engine_profile(tmp_path, "NVIDIA-A100-SXM4-80GB", KV_CACHE_FREE_GPU_MEM_FRACTION, False)
    assert (profile.gpu_type, profile.quantization, profile.max_batch_size) == ("A100-SXM-80GB", "BF16", 16)


def test_tokenizer_is_one_stable_id_per_word(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        WordTokenizer.from_dir(tmp_path / "missing")
    with pytest.raises(TokenizerError, match="has no tokenizer_config.json"):
        WordTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(128256)))
    tokenizer = WordTokenizer.from_dir(tmp_path)
    ids = tokenizer.encode("  the quick\tbrown fox  the ")
    assert len(ids) == 5 and ids[0] == ids[4] and all(0 <= token < 128256 for token in ids)
    assert tokenizer.encode(" ".join(VOCABULARY[:3])) == [0, 1, 2]
    assert tokenizer.decode([0, 1, 2]) == " ".join(VOCABULARY[:3])


def test_wrapper_removes_only_top_level_model_metrics(tmp_path):
    spec = deployment_spec()
    rendered = model_repository_files(spec, "key")["tensorrt_llm/config.pbtxt"]
    assert "model_metrics {" in rendered
    edited = remove_top_level_field(rendered, "model_metrics")
    assert "model_metrics" not in edited and "histogram_options" not in edited
    assert edited.rstrip() == rendered[:rendered.index("model_metrics {")].rstrip()  # it is the last field
    text = ('name: "m"  # model_metrics { in a comment }\n'
            'parameters { key: "model_metrics" value { string_value: "a } { b" } }\n'
            'model_metrics: { metric_control [ { histogram_options { buckets: [ 1.0 ] } } ] }\n'
            'nested { model_metrics { x: 1 } }\nlast: 1\n')
    assert remove_top_level_field(text, "model_metrics") == (
        'name: "m"  # model_metrics { in a comment }\n'
        'parameters { key: "model_metrics" value { string_value: "a } { b" } }\n'
        '\nnested { model_metrics { x: 1 } }\nlast: 1\n')


def test_wrapper_serves_copies_of_every_repository(tmp_path):
    repository = tmp_path / "models"
    (repository / "m" / "1").mkdir(parents=True)
    (repository / "m" / "config.pbtxt").write_text('name: "m"\nmodel_metrics { x: 1 }\n')
    copies = tmp_path / "copies"
    copies.mkdir()
    arguments = rewrite_arguments(["--model-repository", str(repository), "--http-port=8000",
                                   f"--model-store={repository}"], copies)
    assert arguments == [f"--model-repository={copies / '0'}", "--http-port=8000", f"--model-store={copies / '1'}"]
    assert (copies / "0" / "m" / "config.pbtxt").read_text() == 'name: "m"\n\n'
    # The rendered config stays beside it: the emulated backend reads its TTFT buckets there.
    assert (copies / "0" / "m" / RENDERED_CONFIG).read_text() == 'name: "m"\nmodel_metrics { x: 1 }\n'
    assert (repository / "m" / "config.pbtxt").read_text().endswith("model_metrics { x: 1 }\n")


def test_mpirun_parses_the_rendered_rank_group_and_runs_rank_zero():
    command = serving.triton_command(SimpleNamespace(tensor_parallel_size=4, pipeline_parallel_size=1),
                                     RenderSettings())
    contexts = mpirun.parse(command[1:])
    assert [context.processes for context in contexts] == [1, 1, 1, 1]
    assert contexts[0].argv[0] == "tritonserver" and "--model-control-mode=none" in contexts[0].argv
    assert all("--load-model=tensorrt_llm" in context.argv for context in contexts[1:])


@pytest.mark.parametrize("argv, message", [
    (["--bogus", "-n", "1", "tritonserver"], "unknown option --bogus"),
    (["-n", "0", "tritonserver"], "-n needs a positive process count"),
    (["-n", "1", "tritonserver", ":", "-n", "1"], "app context 1 names no executable"),
])
def test_mpirun_refuses_what_openmpi_would(argv, message):
    with pytest.raises(mpirun.UsageError, match=message):
        mpirun.parse(argv)


def test_image_filesystem_has_the_stand_ins_at_their_image_paths(tmp_path):
    image = trtllm_image.image_filesystem(tmp_path)
    assert image == trtllm_image.image_filesystem(tmp_path)  # assembled once
    home = image[trtllm_image.TRITON_HOME]
    assert (home / "bin" / "tritonserver").stat().st_mode & 0o111
    assert "llmfleet_sandbox.emulator.model" in (home / "backends" / "tensorrtllm" / "model.py").read_text()
    assert (home / "backends" / "python" / "triton_python_backend_stub").is_file()
    assert os.access(image[trtllm_image.MPIRUN_PATH], os.X_OK)
    assert all(path.startswith("/") for path in image)
    # As the real image, no /app: the model code is in the operator's image.
    assert not [path for path in image if path.startswith("/app")]


def test_the_operator_image_carries_every_recorded_upstream_file(tmp_path):
    files = trtllm_image.upstream_code_filesystem(tmp_path)
    recorded = {file.image_path for name in release_names() for file in load_release_record(name).model_code}
    assert set(files) == recorded and all(host.is_file() for host in files.values())
    tokenizer = "/opt/llmfleet/upstream/tensorrtllm_backend/v0.16.0/all_models/inflight_batcher_llm/preprocessing/1/model.py"
    assert "PreprocessingModel" in files[tokenizer].read_text()
