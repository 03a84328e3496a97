"""`llmfleet plan` and `llmfleet estimate`: output keys, exit codes and the messages of bad input."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from llmfleet.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "llama-8b.yaml"
INVALID_EXAMPLES = sorted((REPO_ROOT / "examples" / "invalid").glob("*.yaml"))
CONSOLE_SCRIPT = Path(sys.executable).parent / "llmfleet"

PLAN_KEYS = {"feasible", "gpuType", "tensorParallelSize", "pipelineParallelSize", "quantization", "kvCacheDtype",
             "replicas", "gpusTotal", "predicted", "rationale", "rejected", "revision"}
PREDICTED_KEYS = {"ttftP99Ms", "tpotP99Ms", "kvBytesPerToken", "kvCapacityTokens", "maxConcurrentRequests",
                  "maxThroughputTokensPerSec"}
ESTIMATE_KEYS = {"kvBytesPerToken", "kvCapacityTokens", "maxConcurrentRequests", "maxThroughputTokensPerSec",
                 "ttftMs", "tpotMs"}
LLAMA_8B_H100_BF16 = ["--gpu", "H100-SXM-80GB", "--tp", "1", "--quantization", "BF16", "--kv-dtype", "BF16",
                      "--isl", "1024", "--osl", "256"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_manifest(tmp_path: Path, **spec_changes) -> Path:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"].update(spec_changes)
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def field_of(invalid_example: Path) -> str:
    """The field an invalid example is about, from its `# field: ...` header."""
    header = invalid_example.read_text().splitlines()[0]
    assert header.startswith("# field: "), invalid_example
    return header.removeprefix("# field: ")


def test_plan_json_of_the_example_is_feasible_with_exactly_the_documented_keys(capsys):
    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE), "-o", "json")
    body = json.loads(out)
    assert code == 0 and body["feasible"] is True
    assert set(body) == PLAN_KEYS and set(body["predicted"]) == PREDICTED_KEYS
    assert all(set(r) == {"option", "reason"} for r in body["rejected"])
    assert body["gpuType"] in {"H100-SXM-80GB", "H200-SXM-141GB", "A100-SXM-80GB", "L40S-48GB"}
    assert body["tensorParallelSize"] in (1, 2, 4) and body["gpusTotal"] <= 8
    assert body["predicted"]["ttftP99Ms"] <= 500 and body["predicted"]["tpotP99Ms"] <= 50


def test_plan_table_shows_the_choice_and_the_rejected_alternatives(capsys):
    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE))
    assert code == 0
    assert out.splitlines()[0].split() == ["feasible", "yes"]
    assert "rationale:" in out and "rejected:" in out


def test_plan_reads_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(EXAMPLE.read_text()))
    code, out, _ = run(capsys, "plan", "-f", "-", "-o", "json")
    assert code == 0 and json.loads(out)["feasible"] is True


def test_pinned_plan_is_printed_as_pinned(capsys, tmp_path):
    path = write_manifest(tmp_path, plan={"gpuType": "H100-SXM-80GB", "tensorParallelSize": 2,
                                          "quantization": "BF16", "kvCacheDtype": "BF16"})
    code, out, _ = run(capsys, "plan", "-f", str(path), "-o", "json")
    body = json.loads(out)
    assert code == 0
    assert (body["gpuType"], body["tensorParallelSize"], body["quantization"], body["kvCacheDtype"]) == (
        "H100-SXM-80GB", 2, "BF16", "BF16")


def test_a_pin_the_release_cannot_build_is_refused_with_the_reason(capsys, tmp_path):
    path = write_manifest(tmp_path, plan={"gpuType": "H100-SXM-80GB", "tensorParallelSize": 2,
                                          "quantization": "BF16", "kvCacheDtype": "FP8"})
    code, out, _ = run(capsys, "plan", "-f", str(path), "-o", "json")
    body = json.loads(out)
    assert code != 0 and body["feasible"] is False
    assert any("llmapi-25.05 builds a FP8 KV cache only with FP8, NVFP4 weights" in rejected["reason"]
               for rejected in body["rejected"]), body["rejected"]


def test_quality_budget_excludes_formats_from_the_plan(capsys, tmp_path):
    path = write_manifest(tmp_path, slo={"ttftP99Ms": 500, "tpotP99Ms": 50,
                                         "quality": {"allowedQuantizations": ["BF16", "FP16"]}})
    code, out, _ = run(capsys, "plan", "-f", str(path), "-o", "json")
    body = json.loads(out)
    assert code == 0 and body["quantization"] in ("BF16", "FP16")
    assert {r["option"].split()[2] for r in body["rejected"]} <= {"BF16", "FP16"}


def test_infeasible_plan_exits_1_with_the_reason_and_the_closest_option(capsys, tmp_path):
    path = write_manifest(tmp_path, model={"name": "llama-3.1-405b"},
                          resources={"gpuBudget": 1, "allowedTensorParallelSizes": [1]})
    code, out, err = run(capsys, "plan", "-f", str(path), "-o", "json")
    body = json.loads(out)
    assert code == 1 and body["feasible"] is False and body["gpusTotal"] == 0
    rationale = " ".join(body["rationale"])
    assert "no configuration fits" in rationale and "closest:" in rationale and "memory" in rationale
    assert "no configuration meets the spec" in err


def test_infeasible_slo_miss_prints_valid_json(capsys, tmp_path):
    path = write_manifest(tmp_path, slo={"ttftP99Ms": 1, "tpotP99Ms": 1})
    code, out, _ = run(capsys, "plan", "-f", str(path), "-o", "json")
    body = json.loads(out)
    assert code == 1 and body["feasible"] is False
    assert any(line.startswith("infeasible; closest option") for line in body["rationale"])


@pytest.mark.parametrize("invalid_example", INVALID_EXAMPLES, ids=lambda path: path.stem)
def test_invalid_manifest_exits_2_naming_the_field(capsys, invalid_example):
    code, out, err = run(capsys, "plan", "-f", str(invalid_example))
    assert code == 2 and out == ""
    assert f"  {field_of(invalid_example)}: " in err


def test_invalid_manifest_lists_every_problem_as_path_and_message(capsys, tmp_path):
    path = write_manifest(tmp_path, slo={"ttftP99Ms": 0, "tpotP99Ms": -5})
    code, _, err = run(capsys, "plan", "-f", str(path))
    assert code == 2
    assert err.splitlines() == [
        f"llmfleet plan: -f {path} is not a valid LLMDeployment:",
        "  spec.slo.ttftP99Ms: Input should be greater than or equal to 1",
        "  spec.slo.tpotP99Ms: Input should be greater than or equal to 1",
    ]


def test_quantization_lists_with_nothing_in_common_exit_2(capsys, tmp_path):
    path = write_manifest(tmp_path, resources={"allowedQuantizations": ["BF16"]},
                          slo={"ttftP99Ms": 500, "tpotP99Ms": 50, "quality": {"allowedQuantizations": ["FP8"]}})
    code, _, err = run(capsys, "plan", "-f", str(path))
    assert code == 2 and "spec.slo.quality.allowedQuantizations: " in err


@pytest.mark.parametrize("content, message", [
    (None, "cannot read it"),
    ("spec: [", "not valid YAML"),
    ("- a list\n", "expected one YAML mapping"),
])
def test_unusable_file_exits_2(capsys, tmp_path, content, message):
    path = tmp_path / "manifest.yaml"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "plan", "-f", str(path))
    assert code == 2 and err.startswith(f"llmfleet plan: -f {path}: {message}")


def test_estimate_json_keys_and_the_worked_kv_example(capsys):
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16, "-o", "json")
    body = json.loads(out)
    assert code == 0 and set(body) == ESTIMATE_KEYS
    # domain.md: 32 layers x 2 x 8 KV heads x 128 x 2 bytes.
    assert body["kvBytesPerToken"] == 131072
    assert body["maxConcurrentRequests"] >= 1 and body["ttftMs"] > 0 and body["tpotMs"] > 0


def test_estimate_concurrency_raises_tpot(capsys):
    _, one, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16, "-o", "json")
    _, many, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16, "--concurrency", "64",
                     "-o", "json")
    assert json.loads(many)["tpotMs"] > json.loads(one)["tpotMs"]


def test_estimate_table(capsys):
    code, out, _ = run(capsys, "estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16)
    assert code == 0 and out.splitlines()[0].split() == ["KV", "bytes/token", "131072"]


def test_estimate_model_from_an_architecture_file_or_a_manifest(capsys, tmp_path):
    architecture = {"numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 8, "headDim": 128,
                    "vocabSize": 128256, "intermediateSize": 14336, "parameterCountBillions": 8.03}
    plain = tmp_path / "architecture.json"
    plain.write_text(json.dumps(architecture))
    manifest = write_manifest(tmp_path, model={"architecture": architecture})
    outputs = [run(capsys, "estimate", *source, *LLAMA_8B_H100_BF16, "-o", "json")
               for source in (["--model", "llama-3.1-8b"], ["-f", str(plain)], ["-f", str(manifest)])]
    assert [code for code, _, _ in outputs] == [0, 0, 0]
    assert len({out for _, out, _ in outputs}) == 1


def test_estimate_invalid_architecture_file_names_the_field(capsys, tmp_path):
    path = tmp_path / "architecture.yaml"
    path.write_text("numLayers: 0\n")
    code, _, err = run(capsys, "estimate", "-f", str(path), *LLAMA_8B_H100_BF16)
    assert code == 2 and "is not a valid model architecture" in err
    assert "  numLayers: Input should be greater than or equal to 1" in err and "  hiddenSize: Field required" in err


def test_estimate_architecture_rule_names_the_field_it_is_about(capsys, tmp_path):
    path = tmp_path / "architecture.yaml"
    path.write_text(yaml.safe_dump({"numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 7,
                                    "headDim": 128, "vocabSize": 128256, "intermediateSize": 14336,
                                    "parameterCountBillions": 8.03}))
    code, _, err = run(capsys, "estimate", "-f", str(path), *LLAMA_8B_H100_BF16)
    assert code == 2 and "\n  numKvHeads: spec.model.architecture.numKvHeads must divide numAttentionHeads" in err


@pytest.mark.parametrize("flag, value, known", [
    ("--model", "llama-9b", "llama-3.1-8b"),
    ("--gpu", "H100", "H100-SXM-80GB"),
    ("--quantization", "INT4", "INT4AWQ"),
    ("--kv-dtype", "FP4", "INT8"),
])
def test_estimate_unknown_name_exits_2_naming_the_flag_and_the_choices(capsys, flag, value, known):
    argv = ["estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16]
    argv[argv.index(flag) + 1] = value
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"llmfleet estimate: {flag}: unknown ") and f"'{value}'" in err
    assert "choose one of: " in err and known in err


@pytest.mark.parametrize("changes, reason", [
    ({"--tp": "3"}, "TP3 does not divide 32 attention heads"),
    ({"--model": "llama-3.1-405b"}, "do not fit"),
    ({"--gpu": "A100-SXM-80GB", "--quantization": "FP8"}, "does not run FP8"),
])
def test_estimate_configuration_that_cannot_run_exits_1_with_the_reason(capsys, changes, reason):
    argv = ["estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16]
    for flag, value in changes.items():
        argv[argv.index(flag) + 1] = value
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.startswith("llmfleet estimate: this configuration cannot run: ") and reason in err


def test_estimate_rejects_a_non_positive_count(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["estimate", "--model", "llama-3.1-8b", *LLAMA_8B_H100_BF16, "--concurrency", "0"])
    assert exited.value.code == 2
    assert "argument --concurrency: must be at least 1, got 0" in capsys.readouterr().err


def test_console_script_plans_the_example():
    completed = subprocess.run([str(CONSOLE_SCRIPT), "plan", "-f", str(EXAMPLE), "-o", "json"],
                               capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    assert set(json.loads(completed.stdout)) == PLAN_KEYS


def test_a_reader_that_goes_away_ends_the_output_quietly():
    # Like `llmfleet plan ... | head -1`: the reader closes the pipe before anything is written.
    process = subprocess.Popen([str(CONSOLE_SCRIPT), "plan", "-f", str(EXAMPLE)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141
    assert stderr == ""


def test_help_describes_both_commands(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "plan" in out and "estimate" in out


def test_plan_names_the_revision_the_operator_makes(capsys, tmp_path):
    from datetime import datetime, timezone

    from llmfleet.reconcile import OperatorSettings
    from reconcile_builders import decide_pass

    code, out, _ = run(capsys, "plan", "-f", str(EXAMPLE), "-o", "json")
    assert code == 0
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"].update(namespace="default", uid="uid-1", generation=1)
    outcome = decide_pass(manifest, [], OperatorSettings(), datetime(2026, 12, 3, tzinfo=timezone.utc))
    assert json.loads(out)["revision"] == outcome.status["currentRevision"]
    manifest["spec"]["engine"] = {**manifest["spec"].get("engine", {}), "revision": "v2"}
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(manifest))
    code, other, _ = run(capsys, "plan", "-f", str(tmp_path / "v2.yaml"), "-o", "json")
    assert json.loads(other)["revision"] != json.loads(out)["revision"]
