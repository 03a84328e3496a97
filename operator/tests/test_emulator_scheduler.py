"""Step composition, admission and KV accounting of the emulated in-flight batching scheduler."""

import pytest

from llmfleet.simulation.kvcache import prompt_block_hashes
from llmfleet.simulation.profile import EngineProfile
from llmfleet.simulation.scheduler import RequestNeverFits, Scheduler, Sequence
from llmfleet.simulation.timing import expected_ttft_ms, step_duration_ms

PROFILE = {
    "gpuType": "H100-SXM-80GB", "tensorParallelSize": 1, "quantization": "FP8", "kvCacheDtype": "FP8",
    "prefillMsPerToken": 0.1, "prefillFixedMs": 2.0, "decodeStepBaseMs": 10.0,
    "decodeStepMsPerSequence": 0.5, "decodeStepMsPerKvToken": 0.001,
    "kvBlockTokens": 16, "kvBlocksTotal": 100, "maxBatchSize": 4, "maxNumTokens": 100,
}


def _scheduler(**overrides):
    return Scheduler(EngineProfile.from_json_dict({**PROFILE, **overrides}))


def _sequence(request_id, prompt_tokens, max_output_tokens, words=None):
    hashes = prompt_block_hashes(words, 16) if words else ()
    return Sequence(request_id, prompt_tokens, max_output_tokens, prompt_block_hashes=hashes)


def _run_step(scheduler):
    plan = scheduler.plan_step()
    return plan, scheduler.complete_step(plan)


def test_long_prompt_is_chunked_and_the_last_chunk_yields_the_first_token():
    scheduler = _scheduler()
    sequence = _sequence("a", 250, 3)
    scheduler.submit(sequence)
    chunks = []
    for _ in range(3):
        plan, outcome = _run_step(scheduler)
        chunks.append(plan.prefill_tokens)
    assert chunks == [100, 100, 50]
    assert outcome.emitted == (sequence,) and sequence.output_tokens == 1
    assert plan.prompts_completed == 1
    # 250 prompt tokens plus the first output token's KV: 16 blocks.
    assert len(sequence.blocks) == 16


def test_decode_tokens_come_first_and_prompts_take_the_remaining_budget():
    scheduler = _scheduler()
    first, second = _sequence("a", 50, 5), _sequence("b", 120, 5)
    scheduler.submit(first)
    _run_step(scheduler)  # first is prefilled and has its first token
    scheduler.submit(second)
    plan, outcome = _run_step(scheduler)
    assert plan.decode_sequences == (first,)
    assert plan.prefill_chunks == ((second, 99),)  # 100-token budget minus one decode token
    assert plan.kv_tokens_read == 51
    assert outcome.emitted == (first,) and first.output_tokens == 2
    assert plan.work.decode_sequences == 1 and plan.work.prefill_tokens == 99


def test_sequences_finish_after_max_tokens_and_free_their_blocks():
    scheduler = _scheduler()
    sequence = _sequence("a", 20, 3)
    scheduler.submit(sequence)
    emitted_counts = []
    while scheduler.has_work:
        _, outcome = _run_step(scheduler)
        emitted_counts.append(sequence.output_tokens)
    assert emitted_counts == [1, 2, 3]
    assert outcome.finished == (sequence,)
    assert scheduler.kv.used_blocks == 0 and sequence.released


def test_batch_slots_limit_admission_and_the_rest_wait_in_order():
    scheduler = _scheduler()
    sequences = [_sequence(index, 10, 2) for index in range(6)]
    for sequence in sequences:
        scheduler.submit(sequence)
    plan, _ = _run_step(scheduler)
    assert plan.admitted == tuple(sequences[:4])
    assert list(scheduler.waiting) == sequences[4:]
    assert scheduler.stats().waiting_requests == 2 and scheduler.stats().active_requests == 4
    plan, outcome = _run_step(scheduler)  # the first four finish
    assert len(outcome.finished) == 4 and plan.admitted == ()
    plan, _ = _run_step(scheduler)
    assert plan.admitted == tuple(sequences[4:])


def test_kv_exhaustion_queues_requests_until_blocks_are_freed():
    # Each request needs ceil((100 + 60) / 16) = 10 blocks at full length; the cache has 25.
    scheduler = _scheduler(kvBlocksTotal=25, maxNumTokens=400)
    sequences = [_sequence(index, 100, 60) for index in range(3)]
    for sequence in sequences:
        scheduler.submit(sequence)
    plan, _ = _run_step(scheduler)
    # Admission reserves the full length, though only 7 blocks each are used so far.
    assert plan.admitted == tuple(sequences[:2]) and scheduler.kv.used_blocks == 14
    assert list(scheduler.waiting) == [sequences[2]]
    finished_before_third_admitted = 0
    while sequences[2].prefilled_tokens == 0:
        _, outcome = _run_step(scheduler)
        finished_before_third_admitted += len(outcome.finished)
        assert scheduler.kv.used_blocks <= 25
    assert finished_before_third_admitted == 2


def test_a_request_larger_than_the_whole_cache_is_refused_at_once():
    scheduler = _scheduler(kvBlocksTotal=10)
    with pytest.raises(RequestNeverFits, match="needs 11 KV blocks"):
        scheduler.submit(_sequence("big", 150, 20))


def test_cancelling_frees_blocks_of_running_and_removes_waiting_requests():
    scheduler = _scheduler(maxBatchSize=1)
    running, waiting = _sequence("a", 50, 10), _sequence("b", 50, 10)
    scheduler.submit(running)
    scheduler.submit(waiting)
    plan = scheduler.plan_step()
    scheduler.cancel(running)  # while its step runs
    outcome = scheduler.complete_step(plan)
    assert outcome.emitted == () and scheduler.kv.used_blocks == 0
    scheduler.cancel(waiting)
    assert not scheduler.has_work


def test_prefix_reuse_skips_the_shared_full_blocks_of_the_prompt():
    scheduler = _scheduler(enablePrefixReuse=True)
    system_prompt = [f"s{index}" for index in range(64)]
    first = _sequence("a", 70, 1, system_prompt + ["a"] * 6)
    scheduler.submit(first)
    _run_step(scheduler)
    second = _sequence("b", 70, 1, system_prompt + ["b"] * 6)
    scheduler.submit(second)
    plan, _ = _run_step(scheduler)
    assert second.reused_tokens == 64 and plan.prefill_tokens == 6
    assert scheduler.stats().kv_blocks_reused_total == 4


def test_a_fully_cached_prompt_still_computes_its_last_block():
    scheduler = _scheduler(enablePrefixReuse=True)
    words = [f"w{index}" for index in range(32)]
    for request_id in ("a", "b"):
        scheduler.submit(_sequence(request_id, 32, 1, words))
        plan, _ = _run_step(scheduler)
    assert plan.prefill_tokens == 16


def test_queueing_raises_ttft_in_virtual_time():
    """Many simultaneous prompts: the later ones wait for budget and slots, as on a real engine."""
    scheduler = _scheduler(maxBatchSize=4, maxNumTokens=256)
    profile = scheduler.profile
    sequences = [_sequence(index, 200, 20) for index in range(8)]
    for sequence in sequences:
        scheduler.submit(sequence)
    now_ms, ttft_ms = 0.0, {}
    while scheduler.has_work:
        plan, outcome = _run_step(scheduler)
        now_ms += step_duration_ms(profile, plan.work)
        for sequence in outcome.emitted:
            ttft_ms.setdefault(sequence.request_id, now_ms)
    # The first prompt shares its step with the start of the second.
    assert ttft_ms[0] == pytest.approx(expected_ttft_ms(profile, 200) + profile.prefill_ms_per_token * 56)
    assert [ttft_ms[index] for index in range(8)] == sorted(ttft_ms.values())
    assert ttft_ms[7] > 5 * ttft_ms[0]
