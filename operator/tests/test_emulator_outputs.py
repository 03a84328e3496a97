"""The emulated engine's answers: greedy decoding as a function of prompt, weights and numerics."""

import itertools
import subprocess
import sys
from dataclasses import replace

from llmfleet_sandbox import faults
from llmfleet_sandbox.emulator.outputs import OutputModel, output_model_for_engine
from llmfleet_sandbox.emulator.tokenizer import VOCABULARY
from triton_process import deployment_spec, engine_config_for

ANSWER_TOKENS = 32
REFERENCE = OutputModel("llama-8b", "BF16/BF16/drift=0.0", 0.0, len(VOCABULARY))


def _answer(model: OutputModel, prompt: list[int]) -> list[int]:
    return list(itertools.islice(model.tokens(prompt), ANSWER_TOKENS))


def _prompts(count: int) -> list[list[int]]:
    return [[index, index + 1, 7] for index in range(count)]


def test_lossless_engines_of_one_model_answer_alike_and_other_weights_do_not():
    other_numerics = replace(REFERENCE, numerics_identity="FP16/FP16/drift=0.0")
    other_weights = replace(REFERENCE, weights_identity="llama-70b")
    for prompt in _prompts(20):
        assert _answer(other_numerics, prompt) == _answer(REFERENCE, prompt)
        assert _answer(other_weights, prompt) != _answer(REFERENCE, prompt)


def test_lossy_numerics_leave_the_reference_answer_at_the_rate_given_and_never_come_back():
    lossy = replace(REFERENCE, numerics_identity="FP8/FP8/drift=0.0", divergence_per_token=0.01)
    diverged = 0
    for prompt in _prompts(2000):
        reference, answer = _answer(REFERENCE, prompt), _answer(lossy, prompt)
        first = next((i for i, (a, b) in enumerate(zip(reference, answer)) if a != b), None)
        if first is not None:
            diverged += 1
            # After the first different token the rest is the lossy engine's own answer.
            later_agreement = sum(a == b for a, b in zip(reference[first + 1:], answer[first + 1:]))
            assert later_agreement <= 2
    expected = 1 - 0.99 ** ANSWER_TOKENS  # 27.5 %
    assert abs(diverged / 2000 - expected) < 0.04


def test_answers_are_the_same_in_another_process():
    """Pods of one revision are separate processes: the answer may not depend on hash seeds."""
    code = ("from llmfleet_sandbox.emulator.outputs import OutputModel; import itertools; "
            f"m = OutputModel('llama-8b', 'BF16/BF16/drift=0.0', 0.0, {len(VOCABULARY)}); "
            "print(list(itertools.islice(m.tokens([1, 2, 3]), 8)))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2)}
    assert runs == {f"{_answer(REFERENCE, [1, 2, 3])[:8]}\n"}


def test_the_engine_config_decides_the_numerics_and_a_drift_fault_adds_to_them():
    bf16 = output_model_for_engine(engine_config_for(deployment_spec(gpu_type="H100-SXM-80GB")), {})
    fp8 = output_model_for_engine(engine_config_for(deployment_spec(gpu_type="H100-SXM-80GB", quantization="FP8", kv_cache_dtype="FP8")), {})
    drifting = output_model_for_engine(engine_config_for(deployment_spec(gpu_type="H100-SXM-80GB")),
                                       {faults.DRIFT_VARIABLE: "0.05"})
    assert bf16.weights_identity == fp8.weights_identity == drifting.weights_identity
    assert bf16.divergence_per_token == 0.0
    assert 0 < fp8.divergence_per_token < 0.05
    assert drifting.divergence_per_token == 0.05 and drifting.numerics_identity != bf16.numerics_identity
