"""How long one in-flight-batching step of the emulated engine takes (pure).

    step_ms = decodeStepBaseMs
            + prefillMsPerToken       x prompt tokens computed in the step
            + prefillFixedMs          x prompts whose last chunk is in the step (their LM head)
            + decodeStepMsPerSequence x decoding sequences in the step
            + decodeStepMsPerKvToken  x KV tokens those sequences read (their contexts)

then multiplied by log-normal jitter of mean 1. The closed forms below are what an idle engine
should show; the emulator itself only ever uses `step_duration_ms`, so queueing and batch
interference come from the schedule, not from these predictions.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from llmfleet.simulation.profile import EngineProfile


@dataclass(frozen=True)
class StepWork:
    prefill_tokens: int = 0
    prompts_completed: int = 0
    decode_sequences: int = 0
    kv_tokens_read: int = 0


def step_duration_ms(profile: EngineProfile, work: StepWork) -> float:
    duration_ms = profile.decode_step_base_ms
    duration_ms += profile.prefill_ms_per_token * work.prefill_tokens
    duration_ms += profile.prefill_fixed_ms * work.prompts_completed
    duration_ms += profile.decode_step_ms_per_sequence * work.decode_sequences
    duration_ms += profile.decode_step_ms_per_kv_token * work.kv_tokens_read
    return duration_ms


def jitter_multiplier(rng: random.Random, jitter_fraction: float) -> float:
    """Log-normal factor with mean exactly 1: steps are sometimes much slower, never negative."""
    if jitter_fraction <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(jitter_fraction ** 2))
    return math.exp(rng.gauss(-sigma * sigma / 2, sigma))


def expected_ttft_ms(profile: EngineProfile, prompt_tokens: int, reused_tokens: int = 0) -> float:
    """TTFT of one request on an idle engine: its prefill chunks, the last of which emits token 1."""
    computed_tokens = prompt_tokens - reused_tokens
    steps = max(1, math.ceil(computed_tokens / profile.max_num_tokens))
    return (steps * profile.decode_step_base_ms + profile.prefill_fixed_ms
            + profile.prefill_ms_per_token * computed_tokens)


def expected_tpot_ms(profile: EngineProfile, batch: int, context_tokens_per_sequence: float = 0) -> float:
    """Time per output token of a pure decode step with `batch` sequences of the given context."""
    return (profile.decode_step_base_ms + profile.decode_step_ms_per_sequence * batch
            + profile.decode_step_ms_per_kv_token * batch * context_tokens_per_sequence)


def expected_mean_tpot_ms(profile: EngineProfile, prompt_tokens: int, output_tokens: int) -> float:
    """Mean gap between the tokens of one request decoding alone: its context grows each step.

    Decode step k (k = 1 .. output_tokens - 1) reads the prompt plus the k tokens produced so far.
    """
    gaps = output_tokens - 1
    if gaps < 1:
        raise ValueError("a request with fewer than 2 output tokens has no TPOT")
    mean_context = prompt_tokens + (1 + gaps) / 2
    return expected_tpot_ms(profile, 1, mean_context)
