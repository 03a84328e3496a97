"""The emulated engine as a serving pod runs it: the real Triton server (nvidia-pytriton's, through
the sandbox image's wrapper) on the operator's rendered model repository, streamed over gRPC
through the ensemble (preprocessing -> tensorrt_llm -> postprocessing)."""

from __future__ import annotations

import queue
import re
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from llmfleet.api import QualityGate
from llmfleet.catalog.release_record import RUNTIME_RELEASES, load_release_record
from llmfleet.inference.golden import Replica, ask_golden_prompts
from llmfleet.render.layout import REQUEST_MODEL
from llmfleet.render.model_repo import KV_CACHE_FREE_GPU_MEM_FRACTION
from llmfleet.render.ttft_buckets import deployment_ttft_bounds_ms
from llmfleet.rollout import Outcome
from llmfleet.rollout.quality import judge_quality
from llmfleet_dev.release_checks import check_metric
from llmfleet_sandbox.emulator.engine import STATS_PERIOD_S
from llmfleet.simulation.timing import expected_mean_tpot_ms, expected_ttft_ms
from triton_process import ENGINE_MODEL, MODEL, deployment_spec, metric_value, start_triton

# Llama 3.1 8B in BF16 on an A100: 14.5 ms decode steps, 0.08 ms per prompt token; slow enough
# for 2 CPU cores to keep up, fast enough for the file to run in about a minute.
SPEC = deployment_spec()
# A prompt short enough that its TTFT is mostly what the host adds: the ensemble's python hops
# (preprocessing before the engine, postprocessing after it) and the client's round trip.
PROBE_PROMPT_TOKENS = 8
SMALL_KV_BLOCKS = 10  # two 300-token requests at a time (64-token blocks)


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with start_triton(tmp_path_factory.mktemp("triton"), SPEC) as server:
        yield server


@pytest.fixture(scope="module")
def small_kv_triton(triton, tmp_path_factory):
    # The KV pool is linear in the fraction beyond the fixed reserve: scale it to SMALL_KV_BLOCKS.
    fraction = KV_CACHE_FREE_GPU_MEM_FRACTION * (SMALL_KV_BLOCKS + 0.5) / triton.profile.kv_blocks_total
    with start_triton(tmp_path_factory.mktemp("triton-small-kv"), SPEC, fraction) as server:
        assert server.profile.kv_blocks_total == SMALL_KV_BLOCKS
        yield server


@dataclass
class StreamResult:
    ttft_ms: float
    token_gaps_ms: list[float]
    tokens: list[str]
    error: str | None
    end_s: float


def _inputs(prompt: str, output_tokens: int, stream: bool | None) -> list:
    values = [("text_input", "BYTES", np.array([[prompt.encode()]], dtype=np.object_)),
              ("max_tokens", "INT32", np.array([[output_tokens]], dtype=np.int32))]
    if stream is not None:
        values.append(("stream", "BOOL", np.array([[stream]])))
    inputs = []
    for name, datatype, value in values:
        tensor = grpcclient.InferInput(name, list(value.shape), datatype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def _prompt(tokens: int, seed: int = 0) -> str:
    return " ".join(f"w{seed}_{index}" for index in range(tokens))


def _stream_one(url: str, prompt_tokens: int, output_tokens: int, prompt_seed: int = 0) -> StreamResult:
    """One request over its own gRPC stream, timing every token as the client sees it."""
    client = grpcclient.InferenceServerClient(url)
    arrivals: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrivals.put((time.monotonic(), result, error)))
    start_s = time.monotonic()
    client.async_stream_infer(MODEL, _inputs(_prompt(prompt_tokens, prompt_seed), output_tokens, True),
                              enable_empty_final_response=True)
    times, tokens, error = [], [], None
    while True:
        arrived_s, result, failure = arrivals.get(timeout=60)
        if failure is not None:
            error = str(failure)
            break
        response = result.get_response()
        if result.as_numpy("text_output") is not None:
            times.append(arrived_s)
            tokens.append(result.as_numpy("text_output").reshape(-1)[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    gaps = [(later - earlier) * 1000 for earlier, later in zip(times, times[1:])]
    return StreamResult((times[0] - start_s) * 1000 if times else float("nan"), gaps, tokens, error, time.monotonic())


def test_low_load_ttft_and_tpot_match_the_profile(triton):
    profile = triton.profile
    prompt_tokens, output_tokens = 1000, 40
    # The host's share of TTFT is measured on this machine, not assumed: the model's share is
    # what is checked.
    probes = [_stream_one(triton.grpc_url, PROBE_PROMPT_TOKENS, 1, prompt_seed=100 + i) for i in range(5)]
    host_ms = max(0.0, statistics.median(probe.ttft_ms for probe in probes)
                  - expected_ttft_ms(profile, PROBE_PROMPT_TOKENS))
    results = [_stream_one(triton.grpc_url, prompt_tokens, output_tokens, prompt_seed=i) for i in range(5)]
    assert all(result.error is None and len(result.tokens) == output_tokens for result in results)
    ttft_ms = statistics.median(result.ttft_ms for result in results)
    tpot_ms = statistics.median(statistics.mean(result.token_gaps_ms) for result in results)
    expected_ttft = expected_ttft_ms(profile, prompt_tokens)
    expected_tpot = expected_mean_tpot_ms(profile, prompt_tokens, output_tokens)
    print(f"TTFT {ttft_ms:.2f} ms (expected {expected_ttft:.2f} + host {host_ms:.2f}), "
          f"TPOT {tpot_ms:.2f} ms (expected {expected_tpot:.2f})")
    # Tight from below (a token never comes early, whatever the host adds), loose from above:
    # lateness is host load on a shared CI machine, measured by benchmarks/bench_emulator.py rather
    # than asserted here. The host estimate is itself noisy under load, so only the upper bound uses it.
    assert 0.95 * expected_ttft <= ttft_ms and ttft_ms - host_ms <= 1.5 * expected_ttft
    assert 0.95 * expected_tpot <= tpot_ms <= 1.5 * expected_tpot


def _burst(url: str, concurrency: int, prompt_tokens: int, output_tokens: int) -> tuple[float, float, float]:
    """`concurrency` simultaneous requests: (median TTFT ms, mean TPOT ms, output tokens per second)."""
    start_s = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda i: _stream_one(url, prompt_tokens, output_tokens, prompt_seed=i),
                                range(concurrency)))
    assert all(result.error is None and len(result.tokens) == output_tokens for result in results)
    elapsed_s = max(result.end_s for result in results) - start_s
    ttft_ms = statistics.median(result.ttft_ms for result in results)
    tpot_ms = statistics.mean(gap for result in results for gap in result.token_gaps_ms)
    return ttft_ms, tpot_ms, concurrency * output_tokens / elapsed_s


def test_rising_concurrency_saturates_throughput_and_raises_ttft(triton):
    by_concurrency = {concurrency: _burst(triton.grpc_url, concurrency, 200, 40) for concurrency in (1, 4, 16, 48)}
    for concurrency, (ttft, tpot, tokens_per_s) in by_concurrency.items():
        print(f"concurrency {concurrency}: TTFT {ttft:.1f} ms, TPOT {tpot:.2f} ms, {tokens_per_s:.0f} tokens/s")
    ttfts = [values[0] for values in by_concurrency.values()]
    tpots = [values[1] for values in by_concurrency.values()]
    throughputs = [values[2] for values in by_concurrency.values()]
    assert ttfts == sorted(ttfts) and ttfts[-1] > 5 * ttfts[0]
    # Other requests' prompt chunks share the decode steps of a burst (batch interference).
    assert tpots[2] > tpots[0]
    assert throughputs[1] > 2 * throughputs[0]
    # maxBatchSize 16: beyond it requests queue (their first token waits for a free slot) and
    # throughput never passes a full batch every decode step. How close 16 and 48 come to that
    # bound depends on this host's cores (one CI run measured 284 against 197 tokens/s), so the
    # saturation itself is checked in virtual time (test_emulator_scheduler: batch slots limit
    # admission) and measured by bench_emulator.py.
    assert ttfts[3] > 3 * ttfts[2]
    profile = triton.profile
    assert throughputs[3] < profile.max_batch_size * 1000 / profile.decode_step_base_ms


def test_non_streaming_request_gets_one_response_with_the_whole_text(triton):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer(MODEL, _inputs("hello there", 7, stream=None))
    result, error = responses.get(timeout=10)
    client.stop_stream()
    client.close()
    assert error is None
    assert len(result.as_numpy("text_output").reshape(-1)[0].decode().split()) == 7
    assert responses.empty()


def test_same_prompt_gives_the_same_text(triton):
    first, second = (_stream_one(triton.grpc_url, 30, 6, prompt_seed=3) for _ in range(2))
    assert first.tokens == second.tokens and len(set(first.tokens)) > 1


def _engine_inputs(token_ids: list[int], output_tokens: int) -> list:
    """A streaming request straight to the tensorrt_llm model, in token ids."""
    values = [("input_ids", np.array([token_ids], dtype=np.int32)),
              ("input_lengths", np.array([[len(token_ids)]], dtype=np.int32)),
              ("request_output_len", np.array([[output_tokens]], dtype=np.int32)),
              ("streaming", np.array([[True]]))]
    inputs = []
    for name, value in values:
        tensor = grpcclient.InferInput(name, list(value.shape), "BOOL" if value.dtype == bool else "INT32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_client_cancellation_frees_the_blocks(triton):
    # Straight to the engine model: Triton's ensemble checks for cancellation only between its
    # steps, so a cancelled ensemble stream does not reach a tensorrt_llm request already running.
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    tokens: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: tokens.put(error))
    client.async_stream_infer(ENGINE_MODEL, _engine_inputs(list(range(150)), 20_000))
    for _ in range(5):
        assert tokens.get(timeout=10) is None
    used = {"kv_cache_block_type": "used", "model": ENGINE_MODEL}
    # The engine publishes its iteration stats once per STATS_PERIOD_S, so the blocks show up
    # within a period of the request's start (a previous test's stats may have been published
    # just before it).
    deadline = time.monotonic() + 2 * STATS_PERIOD_S + 5
    while metric_value(triton.metrics(), "nv_trt_llm_kv_cache_block_metrics", **used) == 0:
        assert time.monotonic() < deadline, "the running request's blocks never showed as used"
        time.sleep(0.1)
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 5
    while metric_value(triton.metrics(), "nv_trt_llm_kv_cache_block_metrics", **used) > 0:
        assert time.monotonic() < deadline, "blocks of the cancelled request were not freed"
        time.sleep(0.1)
    assert metric_value(triton.metrics(), "nv_trt_llm_request_metrics", request_type="active") == 0


def test_a_killed_clients_backlog_is_dropped_and_nothing_more_is_computed(small_kv_triton):
    """A client with more requests than the KV cache holds (250-token prompts: two run, ten
    wait, about 5 s of work) goes away: the running ones stop, the waiting ones never start,
    and the engine falls idle within a couple of cancellation polls."""
    metrics = small_kv_triton.metrics
    first_tokens: queue.Queue = queue.Queue()
    clients = [grpcclient.InferenceServerClient(small_kv_triton.grpc_url) for _ in range(12)]
    for number, stream in enumerate(clients):
        stream.start_stream(callback=lambda result, error: first_tokens.put(error))
        stream.async_stream_infer(ENGINE_MODEL, _engine_inputs(list(range(number, number + 250)), 60))
    assert first_tokens.get(timeout=10) is None  # the engine is at work
    used = {"kv_cache_block_type": "used", "model": ENGINE_MODEL}
    deadline = time.monotonic() + 2  # the gauges follow the engine's steps
    while metric_value(metrics(), "nv_trt_llm_kv_cache_block_metrics", **used) == 0:
        assert time.monotonic() < deadline, "the running requests hold no blocks"
        time.sleep(0.05)
    for stream in clients:  # the client dies: its streams are cancelled
        stream.stop_stream(cancel_requests=True)
        stream.close()
    deadline = time.monotonic() + 2
    while (metric_value(metrics(), "nv_trt_llm_kv_cache_block_metrics", **used) > 0
           or metric_value(metrics(), "nv_trt_llm_request_metrics", request_type="active") > 0):
        assert time.monotonic() < deadline, "the cancelled backlog still holds blocks or batch slots"
        time.sleep(0.1)
    # Nothing is left to compute: the engine's step counter stands still.
    steps = metric_value(metrics(), "nv_trt_llm_general_metrics", general_type="iteration_counter")
    time.sleep(1.5)
    assert metric_value(metrics(), "nv_trt_llm_general_metrics", general_type="iteration_counter") == steps


def test_prompt_over_the_engines_max_input_len_fails_clearly(triton):
    result = _stream_one(triton.grpc_url, SPEC.engine.max_input_len + 1, 5)
    assert result.error is not None and "exceeds maximum input length" in result.error


def test_kv_exhaustion_queues_requests_instead_of_failing(small_kv_triton):
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _stream_one(small_kv_triton.grpc_url, 280, 20, prompt_seed=i), range(8)))
    assert [result.error for result in results] == [None] * 8
    assert all(len(result.tokens) == 20 for result in results)
    ttfts = sorted(result.ttft_ms for result in results)
    # Only two fit in the cache at once: the last pair waits for three pairs before it.
    assert ttfts[-1] > 3 * ttfts[0]


def test_request_that_never_fits_fails_clearly(small_kv_triton):
    result = _stream_one(small_kv_triton.grpc_url, 700, 10)
    assert result.error is not None and "KV blocks" in result.error


def test_metrics_have_the_tensorrt_llm_names(triton):
    _stream_one(triton.grpc_url, 20, 5)
    time.sleep(0.3)
    text = triton.metrics()
    # The TTFT histogram has the buckets the deployment's config.pbtxt gives (model_metrics).
    bucket = r'nv_inference_first_response_histogram_ms_bucket\{model="tensorrt_llm",version="1",le="([0-9.e+]+)"\}'
    assert [float(le) for le in re.findall(bucket, text)] == [float(b) for b in deployment_ttft_bounds_ms(SPEC)]
    for expected in [
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 16',
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} '
        f'{triton.profile.kv_blocks_total}',
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64',
        'nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="generation_requests",'
        'model="tensorrt_llm",version="1"}',
        'nv_llm_input_token_len_bucket{model="tensorrt_llm",response_metric_type="total_input_tokens",'
        'version="1",le="50"}',
        'nv_llm_output_token_len_count{model="tensorrt_llm",response_metric_type="total_output_tokens",version="1"}',
        'nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="100"}',
        'llmfleet_emulator_step_overhead_ms{model="tensorrt_llm",stat="max",version="1"}',
    ]:
        assert expected in text, expected
    # Exactly the pinned release's backend series: each one recorded, every recorded value of
    # the families the autoscaler reads present (24.12 has no request_type="waiting").
    record = load_release_record(RUNTIME_RELEASES["engine"])
    exported: dict[str, set[tuple[str, str]]] = {}
    for line in text.splitlines():
        match = re.match(r"(nv_trt_llm_\w+)\{(.*)\} ", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            assert check_metric(record, match.group(1), labels) == [], line
            exported.setdefault(match.group(1), set()).update(
                (label, value) for label, value in labels.items() if label not in ("model", "version"))
    for family in ("nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"):
        (label, values), = ((label, values) for label, values in record.metrics[family].labels.items() if values)
        assert exported[family] == {(label, value) for value in values}


@pytest.mark.integration
def test_tensor_parallel_pod_serves_through_mpirun(tmp_path):
    spec = deployment_spec(tensor_parallel_size=2)
    with start_triton(tmp_path, spec) as server:
        assert server.profile.tensor_parallel_size == 2
        result = _stream_one(server.grpc_url, 100, 5)
        assert result.error is None and len(result.tokens) == 5
        # One process, rank 0, serves the group (the emulated engine models the other rank).
        assert "mpirun (sandbox): world size 2, 2 on this host; rank 0 runs here" in server.log_path.read_text()


@pytest.mark.integration
def test_missing_gpu_product_fails_the_model_load_naming_the_variable(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 1"):
        with start_triton(tmp_path, SPEC, gpu_product_label=None):
            pass
    assert "LLMFLEET_SANDBOX_GPU_PRODUCT is not set" in (tmp_path / "triton.log").read_text()


@pytest.mark.integration
def test_unbuilt_engine_fails_the_model_load_naming_the_directory(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 1"):
        with start_triton(tmp_path, SPEC, with_engine=False):
            pass
    log = (tmp_path / "triton.log").read_text()
    assert f"engine directory {tmp_path}/engines/" in log and "does not exist" in log
    assert "tokenizer directory" in log  # the tokenizer models fail as clearly


def test_injected_drift_changes_the_answers_and_injected_errors_count_as_ensemble_failures(triton, tmp_path):
    """The sandbox's faults for a bad canary: answers that leave the model's reference answer,
    and failed requests that Prometheus sees where the canary analysis counts them."""
    from llmfleet_sandbox import faults

    prompts = range(12)
    reference = [_stream_one(triton.grpc_url, 20, 8, prompt_seed=100 + i).tokens for i in prompts]
    golden_prompts = [f"golden prompt {i}" for i in range(4)]
    same = ask_golden_prompts(Replica("stable", triton.grpc_url), [Replica("canary", triton.grpc_url)],
                              REQUEST_MODEL["engine"], golden_prompts, 8)
    with start_triton(tmp_path, SPEC, env={faults.DRIFT_VARIABLE: "1.0", faults.ERROR_PERCENT_VARIABLE: "10"}) \
            as faulty:
        before = urllib.request.urlopen(faulty.metrics_url).read().decode()
        results = [_stream_one(faulty.grpc_url, 20, 8, prompt_seed=100 + i) for i in prompts]
        after = urllib.request.urlopen(faulty.metrics_url).read().decode()
        drifted = ask_golden_prompts(Replica("stable", triton.grpc_url), [Replica("canary", faulty.grpc_url)],
                                     REQUEST_MODEL["engine"], golden_prompts, 8)
    # The quality gate's greedy requests: one engine answers itself alike, a drifting one does not.
    assert same.stable.answers == same.canary[0].answers and None not in same.stable.answers
    assert all(len(answer.split()) == 8 for answer in same.stable.answers)
    assert judge_quality(same, QualityGate(prompts=golden_prompts)).outcome == Outcome.SUCCESSFUL
    assert judge_quality(drifted, QualityGate(prompts=golden_prompts)).outcome == Outcome.FAILED
    errors = [result.error for result in results if result.error is not None]
    assert len(errors) in (1, 2) and all("injected fault" in error for error in errors)
    answered = [(result.tokens, expected) for result, expected in zip(results, reference) if result.error is None]
    assert all(tokens != expected for tokens, expected in answered)
    failures = [metric_value(text, "nv_inference_request_failure", model="ensemble", reason="OTHER")
                for text in (before, after)]
    # This Triton counts a failed ensemble request more than once (two per failure here), so the
    # analysis' error rate errs high, on the side of rolling back.
    assert failures[1] - failures[0] >= len(errors)
