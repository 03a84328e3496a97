"""Engine profile parsing and the step-duration model of the emulator."""

import random
import re
import statistics

import pytest

from llmfleet.simulation.profile import EngineProfile, ProfileError
from llmfleet.simulation.timing import (
    StepWork,
    expected_mean_tpot_ms,
    expected_tpot_ms,
    expected_ttft_ms,
    jitter_multiplier,
    step_duration_ms,
)

PROFILE_JSON = {
    "gpuType": "H100-SXM-80GB", "tensorParallelSize": 2, "quantization": "FP8", "kvCacheDtype": "FP8",
    "prefillMsPerToken": 0.1, "prefillFixedMs": 4.0, "decodeStepBaseMs": 10.0,
    "decodeStepMsPerSequence": 0.25, "decodeStepMsPerKvToken": 0.001,
    "kvBlockTokens": 64, "kvBlocksTotal": 1000, "maxBatchSize": 64, "maxNumTokens": 2048,
}


def _profile(**overrides):
    return EngineProfile.from_json_dict({**PROFILE_JSON, **overrides})


def test_profile_reads_camel_case_keys_and_defaults_the_optional_ones():
    profile = _profile()
    assert profile.tensor_parallel_size == 2 and profile.kv_block_tokens == 64
    assert (profile.jitter_fraction, profile.enable_prefix_reuse, profile.seed) == (0.0, False, 0)
    assert profile.kv_capacity_tokens == 64_000
    assert EngineProfile.from_json_dict(profile.to_json_dict()) == profile


@pytest.mark.parametrize("data, message", [
    ({k: v for k, v in PROFILE_JSON.items() if k != "kvBlocksTotal"}, "missing required key 'kvBlocksTotal'"),
    ({**PROFILE_JSON, "kvBlockSize": 64}, "unknown keys ['kvBlockSize']"),
    ({**PROFILE_JSON, "maxBatchSize": 0}, "'maxBatchSize' must be a positive integer"),
    ({**PROFILE_JSON, "maxBatchSize": 8.5}, "'maxBatchSize' must be a positive integer"),
    ({**PROFILE_JSON, "prefillMsPerToken": -1}, "'prefillMsPerToken' must be a non-negative number"),
    ({**PROFILE_JSON, "decodeStepBaseMs": "10"}, "'decodeStepBaseMs' must be a non-negative number"),
    ({**PROFILE_JSON, "enablePrefixReuse": "yes"}, "'enablePrefixReuse' must be true or false"),
    ({**PROFILE_JSON, "jitterFraction": 1.5}, "'jitterFraction' must be below 1"),
    ({**PROFILE_JSON, "gpuType": ""}, "'gpuType' must be a non-empty string"),
    ({**PROFILE_JSON, "maxNumTokens": 32}, "maxNumTokens (32) must be at least maxBatchSize (64)"),
    ([1, 2], "must be a JSON object"),
])
def test_invalid_profiles_are_rejected_with_the_key_named(data, message):
    with pytest.raises(ProfileError, match=re.escape(message)):
        EngineProfile.from_json_dict(data)


def test_profile_from_json_text_rejects_broken_json():
    with pytest.raises(ProfileError, match="not valid JSON"):
        EngineProfile.from_json("{")


def test_step_duration_adds_prefill_decode_and_kv_read_costs():
    profile = _profile()
    assert step_duration_ms(profile, StepWork()) == 10.0
    assert step_duration_ms(profile, StepWork(prefill_tokens=1000)) == pytest.approx(10 + 100)
    assert step_duration_ms(profile, StepWork(prefill_tokens=1000, prompts_completed=2)) == pytest.approx(118)
    assert step_duration_ms(profile, StepWork(decode_sequences=8, kv_tokens_read=8000)) == pytest.approx(10 + 2 + 8)


def test_expected_ttft_counts_one_base_cost_per_prefill_chunk():
    profile = _profile()
    assert expected_ttft_ms(profile, 1000) == pytest.approx(10 + 4 + 100)
    # 5000 tokens need three 2048-token chunks; only the last yields the first token.
    assert expected_ttft_ms(profile, 5000) == pytest.approx(3 * 10 + 4 + 500)
    assert expected_ttft_ms(profile, 1000, reused_tokens=896) == pytest.approx(10 + 4 + 10.4)


def test_expected_tpot_grows_with_batch_and_context():
    profile = _profile()
    assert expected_tpot_ms(profile, 1) == pytest.approx(10.25)
    assert expected_tpot_ms(profile, 32, 1000) == pytest.approx(10 + 8 + 32)
    # Alone, a 100-token prompt with 11 outputs decodes 10 steps over contexts 101..110.
    assert expected_mean_tpot_ms(profile, 100, 11) == pytest.approx(10.25 + 0.001 * 105.5)
    with pytest.raises(ValueError):
        expected_mean_tpot_ms(profile, 100, 1)


def test_jitter_has_mean_one_and_the_asked_spread_and_is_reproducible():
    rng = random.Random(3)
    samples = [jitter_multiplier(rng, 0.1) for _ in range(40_000)]
    assert statistics.fmean(samples) == pytest.approx(1.0, abs=0.003)
    assert statistics.stdev(samples) == pytest.approx(0.1, rel=0.05)
    assert min(samples) > 0
    assert jitter_multiplier(random.Random(3), 0.1) == samples[0]
    assert jitter_multiplier(rng, 0.0) == 1.0
