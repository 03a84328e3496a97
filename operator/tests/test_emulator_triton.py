"""The emulator served by the real Triton server bundled in nvidia-pytriton, streamed over gRPC."""

from __future__ import annotations

import queue
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from llmfleet_sandbox.emulator.profile import EngineProfile
from llmfleet_sandbox.emulator.timing import expected_mean_tpot_ms, expected_ttft_ms
from triton_process import MODEL, metric_value, start_triton

# Slow enough that 2 CPU cores keep up, fast enough for the whole file to run in well under a minute.
BASE_PROFILE = {
    "gpuType": "H100-SXM-80GB", "tensorParallelSize": 1, "quantization": "FP8", "kvCacheDtype": "FP8",
    "prefillMsPerToken": 0.2, "prefillFixedMs": 10.0, "decodeStepBaseMs": 8.0,
    "decodeStepMsPerSequence": 0.5, "decodeStepMsPerKvToken": 0.002,
    "kvBlockTokens": 16, "kvBlocksTotal": 4096, "maxBatchSize": 16, "maxNumTokens": 512,
    "jitterFraction": 0.02, "enablePrefixReuse": False, "seed": 7,
}
SMALL_KV_PROFILE = {**BASE_PROFILE, "kvBlocksTotal": 40}  # two 300-token requests at a time


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    with start_triton(tmp_path_factory.mktemp("triton"), BASE_PROFILE) as server:
        yield server


@pytest.fixture(scope="module")
def small_kv_triton(tmp_path_factory):
    with start_triton(tmp_path_factory.mktemp("triton-small-kv"), SMALL_KV_PROFILE) as server:
        yield server


@dataclass
class StreamResult:
    ttft_ms: float
    token_gaps_ms: list[float]
    tokens: list[str]
    error: str | None
    end_s: float


def _stream_one(url: str, prompt_tokens: int, output_tokens: int, prompt_seed: int = 0) -> StreamResult:
    """One request over its own gRPC stream, timing every token as the client sees it."""
    client = grpcclient.InferenceServerClient(url)
    arrivals: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrivals.put((time.monotonic(), result, error)))
    prompt = " ".join(f"w{prompt_seed}_{index}" for index in range(prompt_tokens))
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("max_tokens", [1], "INT32"),
              grpcclient.InferInput("stream", [1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([output_tokens], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([True]))
    start_s = time.monotonic()
    client.async_stream_infer(MODEL, inputs, enable_empty_final_response=True)
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
    profile = EngineProfile.from_json_dict(BASE_PROFILE)
    prompt_tokens, output_tokens = 400, 60
    results = [_stream_one(triton.grpc_url, prompt_tokens, output_tokens, prompt_seed=i) for i in range(5)]
    assert all(result.error is None and len(result.tokens) == output_tokens for result in results)
    ttft_ms = statistics.median(result.ttft_ms for result in results)
    tpot_ms = statistics.median(statistics.mean(result.token_gaps_ms) for result in results)
    expected_ttft = expected_ttft_ms(profile, prompt_tokens)
    expected_tpot = expected_mean_tpot_ms(profile, prompt_tokens, output_tokens)
    print(f"TTFT {ttft_ms:.2f} ms (expected {expected_ttft:.2f}), TPOT {tpot_ms:.2f} ms (expected {expected_tpot:.2f})")
    assert ttft_ms == pytest.approx(expected_ttft, rel=0.10)
    assert tpot_ms == pytest.approx(expected_tpot, rel=0.10)


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
    assert tpots[2] > tpots[0]  # a bigger decode batch makes every token slower
    assert throughputs[1] > 2 * throughputs[0]
    # maxBatchSize 16: beyond it requests queue, so throughput stops growing.
    assert throughputs[3] < 1.25 * throughputs[2]


def test_non_streaming_request_gets_one_response_with_the_whole_text(triton):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("max_tokens", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([b"hello there"], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([7], dtype=np.int32))
    client.async_stream_infer(MODEL, inputs)
    result, error = responses.get(timeout=10)
    client.stop_stream()
    client.close()
    assert error is None
    assert len(result.as_numpy("text_output").reshape(-1)[0].decode().split()) == 7
    assert responses.empty()


def test_client_cancellation_frees_the_blocks(triton):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    tokens: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: tokens.put(error))
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("max_tokens", [1], "INT32"),
              grpcclient.InferInput("stream", [1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([b"a long story " * 50], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([20_000], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([True]))
    client.async_stream_infer(MODEL, inputs)
    for _ in range(5):
        assert tokens.get(timeout=10) is None
    assert metric_value(triton.metrics(), "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") > 0
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 5
    while metric_value(triton.metrics(), "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") > 0:
        assert time.monotonic() < deadline, "blocks of the cancelled request were not freed"
        time.sleep(0.1)
    assert metric_value(triton.metrics(), "nv_trt_llm_request_metrics", request_type="active") == 0


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
    for expected in [
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 16',
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 4096',
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 16',
        'nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="generation_requests",'
        'model="tensorrt_llm",version="1"}',
        'nv_llm_input_token_len_bucket{model="tensorrt_llm",response_metric_type="total_input_tokens",'
        'version="1",le="50"}',
        'nv_llm_output_token_len_count{model="tensorrt_llm",response_metric_type="total_output_tokens",version="1"}',
        'nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="100"}',
        'llmfleet_emulator_step_overhead_ms{model="tensorrt_llm",stat="max",version="1"}',
    ]:
        assert expected in text, expected
    for request_type in ("active", "scheduled", "context", "waiting"):
        assert f'request_type="{request_type}"' in text
    for block_type in ("free", "used", "reused", "fraction"):
        assert f'kv_cache_block_type="{block_type}"' in text
