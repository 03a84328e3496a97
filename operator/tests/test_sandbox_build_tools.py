"""The sandbox's stand-ins for the engine build's tools (huggingface-cli, quantize.py, trtllm-build).

The end-to-end tests run the build Job's real script, as the operator renders it, with bash and
the stand-ins on PATH: the sandbox adapts only the image's filesystem, never the Job.
"""

import json
import os
import re
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from llmfleet.api import LLMDeployment
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, render, revision_hash
from llmfleet.render.layout import BUILD_COMPLETE_MARKER, ENGINE_SUBDIR, TOKENIZER_SUBDIR
from llmfleet_sandbox import build_tools, hub
from llmfleet_sandbox.emulator.engine_config import read_engine_config
from llmfleet_sandbox.emulator.tokenizer import WordTokenizer
from llmfleet_sandbox.trtllm_image import BUILD_TOOLS, HUB_EGRESS_VARIABLE, UPSTREAM_STAND_INS

TOOL_PATHS = ("/usr/local/bin/huggingface-cli", "/usr/local/bin/trtllm-build")
# quantize.py is not in the image: the build Job's init container copies it from the operator's.
QUANTIZE_STAND_IN = UPSTREAM_STAND_INS["examples/quantization/quantize.py"]


def deployment_manifest(source: str, calibration_dataset: str | None = None) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10"},
        "spec": {
            "model": {"name": "llama-3.1-70b", "source": source,
                      "secretRef": {"name": "hub-token", "key": "token"}},
            "engine": {"runtime": "engine",
                       **({"calibrationDataset": calibration_dataset} if calibration_dataset else {})},
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            "workload": {"inputTokensMean": 512, "inputTokensP99": 2048, "outputTokensMean": 128,
                         "outputTokensP99": 512, "peakRequestsPerSecond": 2, "prefixSharingFraction": 0.25},
            "plan": {"gpuType": "H100-SXM-80GB", "tensorParallelSize": 2, "quantization": "FP8",
                     "kvCacheDtype": "FP8", "replicas": 1},
        },
    }


def rendered_build(source: str, calibration_dataset: str | None = None):
    """(deployment, plan, the build Job's container) as the operator renders them."""
    deployment = LLMDeployment.from_manifest(deployment_manifest(source, calibration_dataset))
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible, chosen.rationale
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(),
                     serving_replicas=0)
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return deployment, chosen, container


@pytest.fixture
def image_bin(tmp_path: Path) -> Path:
    """A bin dir as the sandbox image's PATH has it: the stand-ins, and python3 = this Python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for image_path in TOOL_PATHS[:2]:
        (bin_dir / Path(image_path).name).symlink_to(BUILD_TOOLS[image_path])
    python3 = bin_dir / "python3"
    # This Python, importing this checkout's packages (not whichever one the environment installed).
    packages = Path(build_tools.__file__).resolve().parents[1]
    python3.write_text(f'#!/bin/sh\nPYTHONPATH="{packages}" exec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    return bin_dir


# The Job's working directory is read-only (readOnlyRootFilesystem). Tests run as root, which may
# write almost anywhere here, but nothing can be created in /proc.
READ_ONLY_WORKING_DIR = "/proc"


def build_job_env(container: dict, image_bin: Path, cache_dir: Path, tmp_path: Path,
                  hostname: str = "chat-engine-build-x7k2p") -> dict[str, str]:
    env = {item["name"]: item["value"] for item in container["env"]}
    env.update({
        # What the sandbox's node agent provides instead of the image and the volumes (the
        # image's environment says its pods reach the sandbox's hub).
        HUB_EGRESS_VARIABLE: "1",
        "PATH": f"{image_bin}:/usr/bin:/bin",
        "QUANTIZE_SCRIPT": str(QUANTIZE_STAND_IN),
        "ENGINE_CACHE_DIR": str(cache_dir),
        "HOME": str(tmp_path),
        "HOSTNAME": hostname,
        build_tools.BUILD_SECONDS_ENV: "0",
    })
    return env


def run_build_job(container: dict, image_bin: Path, cache_dir: Path, tmp_path: Path):
    assert container["command"][:2] == ["/bin/bash", "-c"]
    return subprocess.run(["bash", "-c", container["command"][2]],
                          env=build_job_env(container, image_bin, cache_dir, tmp_path),
                          cwd=READ_ONLY_WORKING_DIR, capture_output=True, text=True, timeout=120)


def test_stand_ins_are_mounted_where_the_image_has_the_tools():
    assert set(TOOL_PATHS) <= set(BUILD_TOOLS)
    for host in [BUILD_TOOLS[image_path] for image_path in TOOL_PATHS] + [QUANTIZE_STAND_IN]:
        assert os.access(host, os.X_OK), host
        assert host.read_text().startswith("#!/usr/bin/env python3\n")


def test_build_script_builds_the_engine_cache_entry(image_bin, tmp_path):
    deployment, chosen, container = rendered_build("hf://meta-llama/Llama-3.1-70B-Instruct")
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["HF_TOKEN_PATH"]  # set, and the stand-in does not need the file
    cache = tmp_path / "engines"
    result = run_build_job(container, image_bin, cache, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[TRT-LLM] [I] Total time of building all engines" in result.stdout
    # The Hugging Face checkpoint only: Meta's original/ weights stay on the hub.
    assert "downloaded model.safetensors" in result.stderr
    assert "downloaded original/" not in result.stderr

    entry = cache / env["ENGINE_CACHE_KEY"]
    assert (entry / BUILD_COMPLETE_MARKER).is_file()
    assert sorted(path.name for path in cache.iterdir()) == [env["ENGINE_CACHE_KEY"]]  # no partial left
    assert sorted(path.name for path in entry.iterdir()) == sorted([BUILD_COMPLETE_MARKER, ENGINE_SUBDIR,
                                                                   TOKENIZER_SUBDIR])
    engine_json = json.loads((entry / ENGINE_SUBDIR / "config.json").read_text())
    pretrained, build = engine_json["pretrained_config"], engine_json["build_config"]
    assert engine_json["version"] == build_tools.TENSORRT_LLM_VERSION
    assert pretrained["architecture"] == "LlamaForCausalLM"
    assert (pretrained["num_hidden_layers"], pretrained["hidden_size"], pretrained["intermediate_size"],
            pretrained["num_attention_heads"], pretrained["num_key_value_heads"], pretrained["head_size"],
            pretrained["vocab_size"]) == (80, 8192, 28672, 64, 8, 128, 128256)
    assert pretrained["quantization"] == {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}
    assert pretrained["mapping"] == {"world_size": chosen.tensor_parallel_size,
                                     "tp_size": chosen.tensor_parallel_size, "pp_size": 1}
    engine_spec = deployment.spec.engine
    assert (build["max_batch_size"], build["max_input_len"], build["max_seq_len"], build["max_num_tokens"]) == (
        engine_spec.max_batch_size, engine_spec.max_input_len, engine_spec.max_seq_len, engine_spec.max_num_tokens)
    assert build["kv_cache_type"] == "PAGED"
    assert build["plugin_config"]["use_paged_context_fmha"] and build["plugin_config"]["gemm_plugin"] == "auto"
    assert sorted(path.name for path in (entry / ENGINE_SUBDIR).glob("rank*.engine")) == [
        f"rank{rank}.engine" for rank in range(chosen.tensor_parallel_size)]
    # The emulated backend reads what the stand-ins wrote.
    engine = read_engine_config(entry / ENGINE_SUBDIR)
    assert (engine.catalog_quantization(), engine.catalog_kv_cache_dtype()) == ("FP8", "FP8")

    tokenizer_dir = entry / TOKENIZER_SUBDIR
    # The tokenizer download takes the JSON files and no weights.
    assert sorted(path.name for path in tokenizer_dir.iterdir()) == ["config.json", "tokenizer_config.json"]
    assert json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["vocab_size"] == 128256
    assert WordTokenizer.from_dir(tokenizer_dir).vocab_size == 128256

    marker_mtime = (entry / BUILD_COMPLETE_MARKER).stat().st_mtime_ns
    again = run_build_job(container, image_bin, cache, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "is already in the cache; nothing to do" in again.stdout
    assert "[TRT-LLM]" not in again.stdout
    assert (entry / BUILD_COMPLETE_MARKER).stat().st_mtime_ns == marker_mtime


def test_build_script_fails_clearly_for_a_repo_the_hub_lacks(image_bin, tmp_path):
    _, _, container = rendered_build("hf://nobody/missing-model")
    env = {item["name"]: item["value"] for item in container["env"]}
    cache = tmp_path / "engines"
    result = run_build_job(container, image_bin, cache, tmp_path)
    assert result.returncode != 0
    assert "Repository Not Found" in result.stderr and "nobody/missing-model" in result.stderr
    assert not (cache / env["ENGINE_CACHE_KEY"]).exists()
    assert not list(cache.glob(f"*/{BUILD_COMPLETE_MARKER}"))


@pytest.mark.parametrize("stand_in", [BUILD_TOOLS[path] for path in TOOL_PATHS] + [QUANTIZE_STAND_IN],
                         ids=["huggingface-cli", "trtllm-build", "quantize.py"])
def test_each_stand_in_has_a_true_help(stand_in, image_bin):
    argv = [str(stand_in)] + (["download"] if stand_in.name == "huggingface-cli" else [])
    result = subprocess.run([*argv, "--help"], env={"PATH": f"{image_bin}:/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout and "sandbox" in result.stdout


# huggingface-cli download


@pytest.mark.parametrize(("include", "exclude", "expected"), [
    (None, None, ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                  "original/params.json", "tokenizer.model", "tokenizer_config.json"]),
    (["*.json", "tokenizer.model"], ["*.index.json"],
     ["config.json", "original/params.json", "tokenizer.model", "tokenizer_config.json"]),
    (None, ["original/"], ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                           "tokenizer.model", "tokenizer_config.json"]),
    (["original/*"], None, ["original/params.json"]),
    (["*.safetensors"], ["model-*"], []),
    ([], None, []),  # `--include` with no pattern allows nothing, as in huggingface_hub
])
def test_include_and_exclude_select_files_as_the_real_cli(include, exclude, expected):
    paths = ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
             "original/params.json", "tokenizer.model", "tokenizer_config.json"]
    assert hub.filter_paths(paths, include, exclude) == expected


def test_download_writes_the_catalog_model_config(tmp_path):
    written = hub.download("mistralai/Mixtral-8x7B-Instruct-v0.1", tmp_path, exclude=["*.safetensors"])
    assert sorted(path.name for path in written) == ["config.json", "tokenizer_config.json"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"] and config["model_type"] == "mixtral"
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["vocab_size"]) == (8, 2, 32000)


def test_weights_placeholder_is_a_tiny_valid_safetensors_file(tmp_path):
    hub.download("meta-llama/Llama-3.1-405B-Instruct", tmp_path, filenames=[hub.WEIGHTS_FILE])
    data = (tmp_path / hub.WEIGHTS_FILE).read_bytes()
    header_length = int.from_bytes(data[:8], "little")
    assert len(data) == 8 + header_length < 1024
    assert "__metadata__" in json.loads(data[8:])


def test_every_hub_repo_is_a_catalog_model():
    for repo_id in hub.HUB_REPOS:
        assert json.loads(hub.repo_files(repo_id)["config.json"])["num_hidden_layers"] > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["download", "nobody/missing-model"], "RepositoryNotFoundError: 404 Client Error"),
    (["download", "meta-llama/Llama-3.1-8B", "--revision", "v2"], "Revision Not Found"),
    (["download", "meta-llama/Llama-3.1-8B", "--repo-type", "dataset"], "Repository Not Found"),
    (["download", "meta-llama/Llama-3.1-8B", "tokenizer.json"], "Entry Not Found"),
])
def test_cli_fails_like_the_hub(argv, message, tmp_path, capsys):
    assert hub.huggingface_cli_main([*argv, "--local-dir", str(tmp_path / "out")]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_prints_the_local_dir(tmp_path, capsys):
    assert hub.huggingface_cli_main(["download", "Qwen/Qwen2.5-72B-Instruct", "--include", "*.json",
                                     "--local-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)
    assert not (tmp_path / hub.WEIGHTS_FILE).exists()


# quantize.py


def calibration_set(directory: Path, files: dict[str, str] | None = None) -> Path:
    """A directory as quantize.py reads one: a train split with a text column (JSON lines)."""
    for name, content in (files if files is not None else {
            "train.jsonl": "".join(json.dumps({"text": f"sample {row}"}) + "\n" for row in range(4))}).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(content)
    return directory


@pytest.fixture
def llama_8b(tmp_path: Path) -> Path:
    hub.download("meta-llama/Llama-3.1-8B-Instruct", tmp_path / "weights")
    return tmp_path / "weights"


def test_quantize_rejects_an_unknown_qformat_listing_the_valid_ones(llama_8b, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_tools.quantize_main(["--model_dir", str(llama_8b), "--qformat", "int3", "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'int3'" in err
    assert all(qformat in err for qformat in build_tools.QFORMATS)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tp_size", "3"], "tp_size 3 must divide num_attention_heads 32"),
    (["--pp_size", "64"], "pp_size 64 exceeds num_hidden_layers 32"),
    (["--tp_size", "0"], "at least 1"),
])
def test_quantize_rejects_a_split_the_model_cannot_take(argv, message, llama_8b, tmp_path, capsys):
    assert build_tools.quantize_main(["--model_dir", str(llama_8b), "--output_dir", str(tmp_path / "ckpt"),
                                      *argv]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


def test_quantize_needs_a_model_config(tmp_path, capsys):
    assert build_tools.quantize_main(["--model_dir", str(tmp_path), "--output_dir", str(tmp_path / "ckpt")]) == 1
    assert "does not appear to have a file named config.json" in capsys.readouterr().err


@pytest.mark.parametrize(("qformat", "kv_flag", "quant_algo", "kv_algo"), [
    ("fp8", None, "FP8", None),
    ("fp8", "fp8", "FP8", "FP8"),
    ("int8_wo", "int8", "W8A16", "INT8"),
    ("int4_awq", None, "W4A16_AWQ", None),
    ("full_prec", None, None, None),
])
def test_quantize_writes_the_checkpoint_layout(qformat, kv_flag, quant_algo, kv_algo, llama_8b, tmp_path, capsys,
                                              monkeypatch):
    monkeypatch.setenv(HUB_EGRESS_VARIABLE, "1")  # the calibrating formats load the default set from the hub
    argv = ["--model_dir", str(llama_8b), "--qformat", qformat, "--tp_size", "2", "--pp_size", "2",
            "--output_dir", str(tmp_path / "ckpt"), "--calib_size", "32"]
    argv += ["--kv_cache_dtype", kv_flag] if kv_flag else []
    assert build_tools.quantize_main(argv) == 0
    assert "ignores --calib_size" in capsys.readouterr().err
    checkpoint = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert checkpoint["quantization"] == {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_algo}
    assert checkpoint["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2}
    assert checkpoint["dtype"] == "bfloat16"  # auto: the model's torch_dtype
    assert sorted(path.name for path in (tmp_path / "ckpt").glob("rank*")) == [
        f"rank{rank}.safetensors" for rank in range(4)]


def test_cli_downloads_a_dataset_repo(tmp_path, capsys):
    assert hub.huggingface_cli_main(["download", "llmfleet-sandbox/calibration-text", "--repo-type", "dataset",
                                     "--local-dir", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "data" / "train-00000-of-00001.jsonl").read_text().splitlines()]
    assert len(rows) == hub.CALIBRATION_ROWS and all(set(row) == {"text"} for row in rows)
    # A dataset id is no model repo, nor the other way round.
    assert hub.huggingface_cli_main(["download", "llmfleet-sandbox/calibration-text",
                                     "--local-dir", str(tmp_path / "model")]) == 1
    assert "Repository Not Found" in capsys.readouterr().err


# quantize.py's calibration set: it fails where the real one would, never kinder

CALIBRATING = [("fp8", None), ("int8_sq", None), ("int4_awq", None), ("full_prec", "fp8"), ("int8_wo", "int8")]


def quantize_argv(llama_8b: Path, tmp_path: Path, qformat: str, kv_flag: str | None, *extra: str) -> list[str]:
    return ["--model_dir", str(llama_8b), "--qformat", qformat, "--output_dir", str(tmp_path / "ckpt"),
            *(["--kv_cache_dtype", kv_flag] if kv_flag else []), *extra]


@pytest.mark.parametrize(("qformat", "kv_flag"), CALIBRATING)
def test_without_hub_egress_a_calibrating_build_cannot_fetch_cnn_dailymail(qformat, kv_flag, llama_8b, tmp_path,
                                                                           capsys, monkeypatch):
    monkeypatch.delenv(HUB_EGRESS_VARIABLE, raising=False)
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, qformat, kv_flag)) == 1
    err = capsys.readouterr().err
    assert "Couldn't reach 'cnn_dailymail' on the Hub (no hub egress)" in err and "spec.engine.calibrationDataset" in err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("qformat", ["full_prec", "int8_wo", "int4_wo"])
def test_a_build_that_does_not_calibrate_reads_no_calibration_set(qformat, llama_8b, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(HUB_EGRESS_VARIABLE, raising=False)
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, qformat, None)) == 0
    assert "calibration" not in capsys.readouterr().out


def test_with_hub_egress_the_default_set_loads_from_the_sandbox_hub(llama_8b, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(HUB_EGRESS_VARIABLE, "1")
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, "fp8", "fp8")) == 0
    assert f"Loading calibration dataset cnn_dailymail: {hub.CALIBRATION_ROWS} sample(s)" in capsys.readouterr().out


@pytest.mark.parametrize(("files", "rows"), [
    ({"train.jsonl": '{"text": "a"}\n{"text": "b", "meta": 1}\n'}, 2),
    ({"data/train-00000-of-00001.jsonl": '{"text": "a"}\n', "data/test-00000-of-00001.jsonl": '{"text": "t"}\n'}, 1),
    ({"samples.json": '[{"text": "a"}, {"text": "b"}, {"text": "c"}]'}, 3),  # no split named: all train
    ({"train.csv": "id,text\n1,hello\n2,world\n"}, 2),
    ({"corpus.txt": "one line\nanother line\n", ".hidden.jsonl": "not json"}, 2),
], ids=["json-lines", "named-splits", "json-list", "csv", "text"])
def test_a_local_directory_is_read_as_its_train_splits_text_column(files, rows, llama_8b, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.delenv(HUB_EGRESS_VARIABLE, raising=False)
    directory = calibration_set(tmp_path / "calibration", files)
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, "int8_sq", None,
                                                   "--calib_dataset", str(directory))) == 0
    assert f"Loading calibration dataset {directory}: {rows} sample(s)" in capsys.readouterr().out


@pytest.mark.parametrize(("files", "message"), [
    (None, "Unsupported dataset name or local repo directory: "),
    ({}, "doesn't contain any data files"),
    ({"README.md": "# a card, no data"}, "doesn't contain any data files"),
    ({"test.jsonl": '{"text": "a"}\n', "validation.jsonl": '{"text": "b"}\n'},
     'Unknown split "train". Should be one of [\'test\', \'validation\']'),
    ({"train.jsonl": '{"article": "a", "id": "1"}\n'},
     "Column text not in the dataset. Current columns in the dataset: ['article', 'id']"),
    ({"train.jsonl": '{"text": 3}\n'}, "holds values that are not text"),
    ({"train.jsonl": ""}, "has no rows"),
    ({"train.jsonl": "{not json"}, "cannot read"),
    ({"train.parquet": "PAR1"}, "cannot read parquet files"),
    ({"train.jsonl": '{"text": "a"}\n', "train.csv": "text\nb\n"}, "mixes formats"),
], ids=["missing", "empty", "no-data-files", "no-train-split", "no-text-column", "not-text", "no-rows",
        "not-json", "parquet", "mixed"])
def test_a_local_directory_the_real_loader_refuses_fails_the_build(files, message, llama_8b, tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setenv(HUB_EGRESS_VARIABLE, "1")
    directory = tmp_path / "calibration"
    if files is not None:
        directory.mkdir()
        calibration_set(directory, files)
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, "fp8", None,
                                                   "--calib_dataset", str(directory))) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()


def test_a_directory_named_like_the_hub_dataset_is_fetched_from_the_hub(llama_8b, tmp_path, capsys, monkeypatch):
    """quantize.py checks for 'cnn_dailymail' in the value before it checks for a directory."""
    monkeypatch.delenv(HUB_EGRESS_VARIABLE, raising=False)
    directory = calibration_set(tmp_path / "cnn_dailymail")
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, "fp8", None,
                                                   "--calib_dataset", str(directory))) == 1
    assert "on the Hub (no hub egress)" in capsys.readouterr().err


def test_pileval_needs_the_internet(llama_8b, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(HUB_EGRESS_VARIABLE, "1")
    assert build_tools.quantize_main(quantize_argv(llama_8b, tmp_path, "fp8", None, "--calib_dataset", "pileval")) == 1
    assert "Couldn't reach https://the-eye.eu/" in capsys.readouterr().err


def test_build_script_downloads_a_hub_calibration_set(image_bin, tmp_path):
    """hf://datasets/<org>/<name>: downloaded with the hub stand-in beside the weights, passed as a
    local directory, and removed before the entry is published."""
    _, _, container = rendered_build("hf://meta-llama/Llama-3.1-70B-Instruct", "hf://datasets/llmfleet-sandbox/calibration-text")
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["CALIBRATION_REPO_ID"] == "llmfleet-sandbox/calibration-text"
    result = run_build_job(container, image_bin, tmp_path / "engines", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "downloaded data/train-00000-of-00001.jsonl" in result.stderr
    assert re.search(rf"Loading calibration dataset \S+/calibration: {hub.CALIBRATION_ROWS} sample", result.stdout)
    entry = tmp_path / "engines" / env["ENGINE_CACHE_KEY"]
    assert sorted(path.name for path in entry.iterdir()) == sorted([BUILD_COMPLETE_MARKER, ENGINE_SUBDIR, TOKENIZER_SUBDIR])


def test_build_script_without_hub_egress_fails_on_the_default_set(image_bin, tmp_path):
    """The stand-in catches a build that would reach for the hub where the pod has none."""
    _, _, container = rendered_build("hf://meta-llama/Llama-3.1-70B-Instruct")
    env = {**build_job_env(container, image_bin, tmp_path / "engines", tmp_path), HUB_EGRESS_VARIABLE: "0"}
    result = subprocess.run(["bash", "-c", container["command"][2]], env=env, cwd=READ_ONLY_WORKING_DIR,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "Couldn't reach 'cnn_dailymail' on the Hub" in result.stderr
    assert not list((tmp_path / "engines").glob(f"*/{BUILD_COMPLETE_MARKER}"))


# trtllm-build


def build_args(checkpoint_dir: Path, output_dir: Path, *extra: str) -> Namespace:
    return build_tools._build_parser().parse_args(
        ["--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir), *extra])


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch) -> Path:
    """The working directory of an in-process trtllm-build, which writes its timing cache there
    by default, as the real one does (never into the directory the tests were started from)."""
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    monkeypatch.chdir(work_dir)
    return work_dir


@pytest.fixture
def checkpoint(llama_8b: Path, tmp_path: Path, build_dir: Path) -> Path:
    build_tools.quantize(llama_8b, tmp_path / "ckpt", qformat="fp8", kv_cache_dtype="int8",
                         calib_dataset=str(calibration_set(tmp_path / "calibration")))
    return tmp_path / "ckpt"


def test_build_settles_values_as_the_real_build(checkpoint, build_dir, tmp_path, capsys):
    config = build_tools.trtllm_build(build_args(checkpoint, tmp_path / "engine", "--max_input_len", "200000",
                                                 "--max_num_tokens", "16", "--use_paged_context_fmha", "enable"), 0)
    assert (build_dir / "model.cache").is_file()  # the timing cache, in the working directory
    build = config["build_config"]
    assert build["max_seq_len"] == 131072  # deduced from max_position_embeddings
    assert build["max_input_len"] == 131072  # clipped to max_seq_len
    assert build["max_num_tokens"] == 64  # raised to tokens_per_block
    assert build["max_batch_size"] == 2048 and build["opt_num_tokens"] == 64
    assert build["plugin_config"]["use_paged_context_fmha"] is False  # not with an INT8 KV cache
    assert build["plugin_config"]["gemm_plugin"] is None  # the default: disabled
    out = capsys.readouterr().out
    assert out.count("[TRT-LLM] [W]") == 3
    assert json.loads((tmp_path / "engine" / "config.json").read_text()) == config


@pytest.mark.parametrize(("extra", "remove", "message"), [
    (["--kv_cache_type", "paged", "--paged_kv_cache", "disable"], None, "contradicts"),
    ([], "rank0.safetensors", "lacks the weights of rank0.safetensors"),
    ([], "config.json", "does not appear to have a file named config.json"),
])
def test_build_rejects_what_the_real_build_rejects(extra, remove, message, checkpoint, tmp_path, capsys):
    if remove:
        (checkpoint / remove).unlink()
    argv = ["--checkpoint_dir", str(checkpoint), "--output_dir", str(tmp_path / "engine"), *extra]
    assert build_tools.trtllm_build_main(argv) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "engine").exists()


def test_build_rejects_an_unknown_kv_cache_type(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit):
        build_args(checkpoint, tmp_path / "engine", "--kv_cache_type", "blocked")
    assert "Expected one of ['continuous', 'paged', 'disabled']" in capsys.readouterr().err


def test_build_takes_the_sandbox_build_time_with_progress(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(build_tools.BUILD_SECONDS_ENV, "0.3")
    assert build_tools.trtllm_build_main(["--checkpoint_dir", str(checkpoint),
                                          "--output_dir", str(tmp_path / "engine")]) == 0
    assert "building engines: 0%" in capsys.readouterr().out
    monkeypatch.setenv(build_tools.BUILD_SECONDS_ENV, "soon")
    assert build_tools.trtllm_build_main(["--checkpoint_dir", str(checkpoint),
                                          "--output_dir", str(tmp_path / "engine")]) == 1
    assert "is not a number of seconds" in capsys.readouterr().err


def test_racing_builds_of_one_key_leave_the_first_complete_entry_untouched(image_bin, tmp_path):
    """Two Jobs pass the "already built" check together; the first publishes while serving pods
    may start reading it, the second must neither delete nor replace it."""
    _, _, container = rendered_build("hf://meta-llama/Llama-3.1-70B-Instruct")
    cache, gates = tmp_path / "engines", tmp_path / "gates"
    gates.mkdir()
    # trtllm-build waits at a gate, so both Jobs are past the check before either publishes.
    gated = image_bin / "trtllm-build"
    gated.unlink()
    gated.write_text(f'#!/bin/bash\ntouch "{gates}/at-$HOSTNAME"\n'
                     f'while [ ! -e "{gates}/go-$HOSTNAME" ]; do sleep 0.05; done\n'
                     f'exec "{BUILD_TOOLS["/usr/local/bin/trtllm-build"]}" "$@"\n')
    gated.chmod(0o755)
    jobs = {name: subprocess.Popen(["bash", "-c", container["command"][2]], cwd=READ_ONLY_WORKING_DIR,
                                   env=build_job_env(container, image_bin, cache, tmp_path, hostname=name),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("build-first", "build-second")}
    try:
        for name in jobs:
            deadline = time.monotonic() + 60
            while not (gates / f"at-{name}").exists():
                assert jobs[name].poll() is None, jobs[name].communicate()
                assert time.monotonic() < deadline, f"{name} never reached trtllm-build"
                time.sleep(0.05)
        (gates / "go-build-first").touch()
        first_out, first_err = jobs["build-first"].communicate(timeout=60)
        assert jobs["build-first"].returncode == 0, first_out + first_err
        key = build_job_env(container, image_bin, cache, tmp_path)["ENGINE_CACHE_KEY"]
        entry = cache / key
        published = {path.relative_to(entry): (path.stat().st_ino, path.read_bytes())
                     for path in entry.rglob("*") if path.is_file()}
        entry_inode = entry.stat().st_ino

        (gates / "go-build-second").touch()
        second_out, second_err = jobs["build-second"].communicate(timeout=60)
        assert jobs["build-second"].returncode == 0, second_out + second_err
    finally:
        for job in jobs.values():
            job.kill()
    assert "published by another Job meanwhile; keeping that one" in second_out
    assert entry.stat().st_ino == entry_inode
    assert {path.relative_to(entry): (path.stat().st_ino, path.read_bytes())
            for path in entry.rglob("*") if path.is_file()} == published
    assert (entry / BUILD_COMPLETE_MARKER).is_file()
    assert sorted(path.name for path in cache.iterdir()) == [key]  # no work directory left


def test_build_reads_weights_in_place_from_a_claim(image_bin, tmp_path):
    """pvc://<claim>/<path>: the Job mounts the claim read-only and builds from it; the tokenizer
    files come from the same directory, the FP8 build's calibration set from a claim too; nothing
    is downloaded."""
    deployment = LLMDeployment.from_manifest(deployment_manifest("pvc://weights/llama-3.1-70b",
                                                                 "pvc://datasets/calibration/text"))
    chosen = plan(plan_request_from_spec(deployment.spec))
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(), serving_replicas=0)
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "model-source", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod["volumes"]
    assert {"name": "model-source", "mountPath": "/model-source", "readOnly": True} in container["volumeMounts"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["MODEL_SOURCE_DIR"] == "/model-source/llama-3.1-70b" and "MODEL_REPO_ID" not in env
    assert env["CALIBRATION_SOURCE_DIR"] == "/calibration-source/calibration/text"

    claim_dir = tmp_path / "claim" / "llama-3.1-70b"
    hub.download("meta-llama/Llama-3.1-70B-Instruct", claim_dir)
    calibration_dir = calibration_set(tmp_path / "datasets" / "calibration" / "text")
    job_env = {**build_job_env(container, image_bin, tmp_path / "engines", tmp_path), "MODEL_SOURCE_DIR": str(claim_dir),
               "CALIBRATION_SOURCE_DIR": str(calibration_dir)}
    del job_env[HUB_EGRESS_VARIABLE]  # nothing here needs the hub
    result = subprocess.run(["bash", "-c", container["command"][2]], env=job_env, cwd=READ_ONLY_WORKING_DIR,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "downloaded" not in result.stderr  # the hub stand-in was never asked
    assert f"Loading calibration dataset {calibration_dir}: 4 sample(s)" in result.stdout
    entry = tmp_path / "engines" / env["ENGINE_CACHE_KEY"]
    assert (entry / BUILD_COMPLETE_MARKER).is_file() and (entry / ENGINE_SUBDIR / "config.json").is_file()
    assert sorted(path.name for path in (entry / TOKENIZER_SUBDIR).iterdir()) == ["config.json", "tokenizer_config.json"]
    assert (claim_dir / "model.safetensors").is_file()  # read in place, left as it was
