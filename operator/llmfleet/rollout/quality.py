"""The quality gate: golden prompts answered with greedy decoding by a stable replica (the
reference) and by every canary replica, compared answer by answer.

Two numbers: the exact-match rate (answers equal to the reference, over prompts times canary
replicas) and the token agreement (whitespace-separated words equal to the reference's at the
same position, over the longer answer's words). A canary answer that failed counts as wrong;
a reference that failed gives no verdict (Inconclusive), as the stable revision is not on trial.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api import QualityGate
from llmfleet.rollout.analysis import Outcome, Verdict

# How much of a differing answer the verdict quotes.
QUOTED_CHARACTERS = 60


@dataclass(frozen=True)
class PodAnswers:
    """One replica's answers to the golden prompts, in order; None where the request failed
    (`errors` then holds why)."""

    pod: str
    answers: tuple[str | None, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class GoldenAnswers:
    prompts: tuple[str, ...] = ()
    stable: PodAnswers | None = None
    canary: tuple[PodAnswers, ...] = ()
    error: str | None = None  # the check could not run (no pod to ask, prompts unreadable)


def token_agreement(reference: str, answer: str) -> tuple[int, int]:
    """(words equal at the same position, words compared: the longer answer's length)."""
    expected, got = reference.split(), answer.split()
    return sum(a == b for a, b in zip(expected, got)), max(len(expected), len(got))


def _quote(text: str | None) -> str:
    if text is None:
        return "(failed)"
    return repr(text if len(text) <= QUOTED_CHARACTERS else text[:QUOTED_CHARACTERS] + "...")


def judge_quality(golden: GoldenAnswers, gate: QualityGate) -> Verdict:
    if golden.error is not None:
        return Verdict(Outcome.ERROR, golden.error)
    stable = golden.stable
    if stable is None or not golden.canary:
        return Verdict(Outcome.INCONCLUSIVE, "no ready stable and canary replicas to ask")
    if None in stable.answers:
        return Verdict(Outcome.INCONCLUSIVE, f"stable replica {stable.pod} gave no reference answer: "
                                             f"{(stable.errors or ('request failed',))[0]}")
    exact = answers = agreed = compared = 0
    first_difference = None
    for pod in golden.canary:
        for index, (reference, answer) in enumerate(zip(stable.answers, pod.answers)):
            answers += 1
            same, words = token_agreement(reference, answer) if answer is not None else (0, len(reference.split()))
            agreed, compared = agreed + same, compared + words
            if answer == reference:
                exact += 1
            elif first_difference is None:
                first_difference = (f"prompt {index + 1} on {pod.pod}: {_quote(answer)} where stable answered "
                                    f"{_quote(reference)}")
    exact_percent = 100.0 * exact / answers
    agreement_percent = 100.0 * agreed / compared if compared else 100.0
    numbers = (f"exact match {exact_percent:.0f}% (min {gate.min_exact_match_percent:g}%), token agreement "
               f"{agreement_percent:.0f}% (min {gate.min_token_agreement_percent:g}%) over "
               f"{len(golden.prompts)} prompt(s) x {len(golden.canary)} canary replica(s)")
    if exact_percent < gate.min_exact_match_percent or agreement_percent < gate.min_token_agreement_percent:
        return Verdict(Outcome.FAILED, f"{numbers}; first difference: {first_difference}")
    return Verdict(Outcome.SUCCESSFUL, numbers)


def parse_prompts(text: str) -> tuple[str, ...]:
    """The prompts of a ConfigMap value: one per non-empty line."""
    return tuple(line.strip() for line in text.splitlines() if line.strip())
