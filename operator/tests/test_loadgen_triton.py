"""`llmfleet load` against a real tritonserver serving the rendered ensemble on the emulated engine."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import threading
import time

import pytest

from llmfleet.cli import main
from llmfleet.simulation.timing import expected_mean_tpot_ms, expected_ttft_ms
# The emulator's own real-Triton test serves the same engine.
from triton_process import MODEL, deployment_spec, start_triton

RATE_PER_SECOND, DURATION_S, INPUT_TOKENS, OUTPUT_TOKENS = 4, 10, 100, 20


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with start_triton(tmp_path_factory.mktemp("triton-loadgen"), deployment_spec()) as server:
        yield server


def _csv_rows(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def test_open_loop_run_completes_every_request_with_plausible_latency(triton, tmp_path, capsys):
    exit_code = main(["load", "--model", MODEL, "--target", triton.grpc_url, "--schedule", f"constant:{RATE_PER_SECOND}",
                      "--duration-s", str(DURATION_S), "--input-tokens", str(INPUT_TOKENS),
                      "--output-tokens", str(OUTPUT_TOKENS), "--slo-ttft-ms", "500", "--slo-tpot-ms", "50",
                      "--seed", "3", "--output-dir", str(tmp_path), "--quiet"])
    printed = json.loads(capsys.readouterr().out)
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = _csv_rows(tmp_path / "requests.csv")
    assert exit_code == 0
    assert printed["requests"] == summary["requests"] == len(rows)
    expected = RATE_PER_SECOND * DURATION_S
    assert abs(summary["requests"] - expected) < 4 * expected ** 0.5
    assert summary["completed"] == summary["requests"] and summary["errors"] == summary["truncated"] == 0
    assert {row["status"] for row in rows} == {"ok"}
    assert {int(row["output_tokens"]) for row in rows} == {OUTPUT_TOKENS}

    profile = triton.profile
    ttft_ms = expected_ttft_ms(profile, INPUT_TOKENS)
    tpot_ms = expected_mean_tpot_ms(profile, INPUT_TOKENS, OUTPUT_TOKENS)
    print(f"TTFT p50 {summary['ttft_ms']['p50']} ms (idle engine {ttft_ms:.1f}), "
          f"TPOT p50 {summary['tpot_ms']['p50']} ms (alone {tpot_ms:.2f}), client {summary['client']}")
    # At 4 requests/s few requests overlap: TTFT is the idle prefill plus at most a step or two of
    # waiting; TPOT grows a little when two requests share a decode step.
    assert 0.9 * ttft_ms < summary["ttft_ms"]["p50"] < ttft_ms + 40
    assert 0.9 * tpot_ms < summary["tpot_ms"]["p50"] < 1.5 * tpot_ms
    assert summary["itl_ms"]["count"] == summary["requests"] * (OUTPUT_TOKENS - 1)
    assert summary["e2e_ms"]["p50"] > summary["ttft_ms"]["p50"] + (OUTPUT_TOKENS - 1) * 0.9 * tpot_ms
    assert summary["goodput"]["share"] > 0.9
    assert len(summary["windows"]) == math.ceil(summary["duration_s"] / 5)  # the drain is in the last one
    assert sum(window["arrivals"] for window in summary["windows"]) == summary["requests"]
    assert summary["client"]["in_flight_cap_hits"] == 0
    # Every send is timed; its tail on 2 shared cores is a benchmark figure (bench_loadgen.py),
    # not a test bound: the median shows the sender keeps its schedule.
    assert summary["client"]["send_lag_ms"]["count"] == summary["requests"]
    assert summary["client"]["send_lag_ms"]["p50"] < 20


def test_an_interrupt_ends_the_run_early_with_every_sent_request_finished(triton, tmp_path, capsys):
    # Python's own handler, or SIG_IGN where the test runs as a background job of a shell.
    handler_before = signal.getsignal(signal.SIGINT)
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    exit_code = main(["load", "--model", MODEL, "--target", triton.grpc_url, "--schedule", "constant:4",
                      "--duration-s", "60", "--input-tokens", str(INPUT_TOKENS), "--output-tokens",
                      str(OUTPUT_TOKENS), "--output-dir", str(tmp_path), "--quiet"])
    assert time.monotonic() - started < 15
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert exit_code == 0 and 1.5 < summary["stopped_at_s"] < 3
    assert 0 < summary["requests"] <= 4 * 3 and summary["completed"] == summary["requests"]
    assert signal.getsignal(signal.SIGINT) == handler_before  # the run's own handler is gone
    assert "sending no more requests" in capsys.readouterr().err


def test_trace_replay_sends_the_trace(triton, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.2, "input_tokens": 30 + i, "output_tokens": 5 + i}) + "\n"
                             for i in range(5)))
    assert main(["load", "--model", MODEL, "--endpoints", f"{triton.grpc_url},{triton.grpc_url}", "--trace", str(trace),
                 "--output-dir", str(tmp_path / "out"), "--quiet"]) == 0
    rows = _csv_rows(tmp_path / "out" / "requests.csv")
    assert [(int(row["input_tokens"]), int(row["output_tokens"])) for row in rows] == \
        [(30 + i, 5 + i) for i in range(5)]
    assert [float(row["arrival_s"]) for row in rows] == pytest.approx([0, 0.2, 0.4, 0.6, 0.8])


def test_sweep_writes_points_frontier_and_plot(triton, tmp_path, capsys):
    assert main(["load", "--model", MODEL, "--target", triton.grpc_url, "--sweep", "1,8", "--duration-s", "2",
                 "--input-tokens", "100", "--output-tokens", "20", "--output-dir", str(tmp_path), "--quiet"]) == 0
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    low, high = sweep["points"]
    assert (low["concurrency"], high["concurrency"]) == (1, 8)
    assert high["output_tokens_per_second"] > 2 * low["output_tokens_per_second"]
    assert high["tpot_p50_ms"] > low["tpot_p50_ms"]  # a bigger decode batch is slower per token
    assert sweep["pareto_frontier"]
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    assert len(_csv_rows(tmp_path / "requests-concurrency-8.csv")) == high["requests"]


def test_errors_and_truncations_are_recorded_per_request_and_exit_1(triton, tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    # Request 0 is longer than the engine's max_input_len (an error); request 1 would stream for
    # a minute but the run waits 1 s after the last arrival (truncated); request 2 is ordinary.
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,70000,5\n0.1,10,20000\n0.2,10,5\n")
    assert main(["load", "--model", MODEL, "--target", triton.grpc_url, "--trace", str(trace), "--drain-timeout-s", "1",
                 "--output-dir", str(tmp_path / "out"), "--quiet"]) == 1
    rows = _csv_rows(tmp_path / "out" / "requests.csv")
    assert [row["status"] for row in rows] == ["error", "truncated", "ok"]
    assert "exceeds maximum input length" in rows[0]["error"]
    assert 0 < int(rows[1]["output_tokens"]) < 20000
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["errors"], summary["truncated"], summary["completed"]) == (1, 1, 1)
    assert "exceeds maximum input length" in summary["first_error"]
