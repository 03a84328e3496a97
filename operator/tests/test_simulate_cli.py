"""`llmfleet simulate`: input errors exit 2 naming the flag or field; a small run writes its report."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import pytest

from llmfleet.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "llama-8b.yaml")


@pytest.mark.parametrize("flags, message", [
    (["--schedule", "steps:0:2,60"], "--schedule steps:0:2,60: point '60' must be TIME_S:RATE"),
    (["--schedule", "1", "--input-tokens", "uniform:9"], "--input-tokens uniform:9: 'uniform:9' is not a length"),
    (["--schedule", "1", "--duration-s", "0"], "--duration-s must be greater than 0"),
    (["--trace", "/nonexistent.csv"], "--trace: cannot read /nonexistent.csv"),
    (["--schedule", "0.001", "--duration-s", "1"], "no request arrives within --duration-s"),
])
def test_bad_traffic_exits_2_and_names_the_flag(flags, message, capsys, tmp_path):
    assert main(["simulate", "-f", EXAMPLE, "--output-dir", str(tmp_path / "out"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_invalid_manifest_exits_2_naming_the_field(tmp_path, capsys):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(Path(EXAMPLE).read_text().replace("ttftP99Ms: 500", "ttftP99Ms: -5"))
    assert main(["simulate", "-f", str(manifest), "--schedule", "1"]) == 2
    assert "spec.slo.ttftP99Ms" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--scrape-interval-seconds", "--reconcile-interval-seconds",
                                  "--start-up-delay-seconds"])
def test_bad_intervals_exit_2(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "-f", EXAMPLE, "--schedule", "1", flag, "-1"])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_traffic_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "-f", EXAMPLE])
    assert exit_info.value.code == 2
    assert "one of the arguments --schedule --trace is required" in capsys.readouterr().err


def test_a_trace_is_simulated_and_reported(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{second * 0.5},512,64\n" for second in range(120)))
    out = tmp_path / "out"
    assert main(["simulate", "-f", EXAMPLE, "--trace", str(trace), "--output-dir", str(out), "-o", "json",
                 "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["requests"] == 120 and summary["failed"] == 0
    assert summary["slo_attainment_percent"]["both"] == 100.0
    assert summary["autoscaling"] is True and summary["query_window_s"] == 60  # 4 scrapes of 15 s
    assert summary["replica_seconds"] > 0 and summary["gpu_hours"] > 0
    assert summary["reversals"] == 0
    assert all(event["signal"] and event["reversal"] is False for event in summary["scaling"])
    svg = ElementTree.parse(out / "timeline.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(svg.findall("{http://www.w3.org/2000/svg}circle")) == 120  # one dot per request


def test_a_replica_spanning_two_nodes_is_simulated_with_its_pipeline(tmp_path, capsys):
    """Llama 3.1 405B in BF16 needs 16 H100s: TP8 over two nodes with a pipeline stage on each. The
    simulated engine is that layout's (it once took the TP size alone, found no room for the KV
    cache on 8 GPUs and stopped)."""
    manifest = tmp_path / "405b.json"
    manifest.write_text(json.dumps({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "llama-405b"},
        "spec": {"model": {"name": "llama-3.1-405b", "source": "hf://meta-llama/Llama-3.1-405B-Instruct"},
                 "engine": {"maxBatchSize": 4, "maxInputLen": 1024, "maxSeqLen": 2048, "maxNumTokens": 2048},
                 "slo": {"ttftP99Ms": 5000, "tpotP99Ms": 200, "quality": {"allowedQuantizations": ["BF16"]}},
                 "workload": {"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 32,
                              "outputTokensP99": 64, "peakRequestsPerSecond": 0.5},
                 "resources": {"allowedGpuTypes": ["H100-SXM-80GB"]}}}))
    assert main(["simulate", "-f", str(manifest), "--schedule", "0.5", "--duration-s", "60", "--input-tokens",
                 "fixed:128", "--output-tokens", "fixed:32", "--output-dir", str(tmp_path / "out"), "-o", "json",
                 "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["plan"] == "H100x16 BF16" and summary["requests"] > 0 and summary["failed"] == 0
    assert summary["slo_attainment_percent"]["both"] == 100.0
