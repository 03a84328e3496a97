"""Canary rollouts: the pure state machine, and the reconcile pass that carries it (replicas per
revision, pruning, conditions, status that is all a restarted operator needs)."""

from __future__ import annotations

import copy
import threading
import time
from datetime import timedelta

import pytest

from llmfleet.api import CanaryPhase, RolloutStep
from llmfleet.reconcile import Context
from llmfleet.reconcile.due import quality_query
from reconcile_builders import (
    NOW, SETTINGS, SilentGateway, canary_started, condition, decide_pass, kind, manifest_with_steps, stored_after,
    with_status)
from llmfleet.rollout import Command, Observed, advance, canary_replicas_for

STEPS = (RolloutStep(set_weight=25), RolloutStep.model_validate({"pause": {"durationSeconds": 60}}),
         RolloutStep(set_weight=40))


def seen(now=NOW, built=True, failed=False, canary_ready=0, stable=3, room=10, command=None, target="new"):
    return Observed(target, "old", built, failed, canary_ready, stable, room, now, Command.parse(command))


@pytest.mark.parametrize(("weight", "stable", "canary"), [
    (25, 3, 1), (50, 3, 3), (10, 3, 1), (20, 8, 2), (50, 1, 1), (100, 4, 4), (1, 2, 1)])
def test_weights_become_whole_canary_replicas_beside_stable(weight, stable, canary):
    assert canary_replicas_for(weight, stable) == canary


def test_a_good_canary_walks_its_steps_and_is_promoted():
    first = advance(None, STEPS, seen(built=False))
    assert first.state.phase == CanaryPhase.PREPARING and first.split.canary_replicas == 0
    warming = advance(first.state, STEPS, seen())
    assert (warming.state.phase, warming.split.canary_replicas) == (CanaryPhase.WARMING, 1)
    assert warming.split.weight_percent == 25
    # Warm: step 1 (setWeight 25) is met at once, step 2 (pause 60 s) starts.
    paused = advance(warming.state, STEPS, seen(canary_ready=1))
    assert (paused.state.phase, paused.state.step_index) == (CanaryPhase.PROGRESSING, 1)
    again = advance(paused.state, STEPS, seen(now=NOW + timedelta(seconds=59), canary_ready=1))
    assert again.state.step_index == 1, "the pause counts from when it began, across passes"
    half = advance(again.state, STEPS, seen(now=NOW + timedelta(seconds=61), canary_ready=1))
    assert (half.state.step_index, half.split.canary_replicas, half.split.weight_percent) == (2, 2, 40)
    promoting = advance(half.state, STEPS, seen(now=NOW + timedelta(seconds=90), canary_ready=2))
    assert promoting.state.phase == CanaryPhase.PROMOTING and promoting.split.canary_replicas == 3
    promoted = advance(promoting.state, STEPS, seen(now=NOW + timedelta(seconds=120), canary_ready=3))
    assert promoted.state.phase == CanaryPhase.PROMOTED
    assert [reason for reason, _ in first.events + warming.events + promoting.events + promoted.events] == [
        "CanaryStarted", "CanaryWarming", "CanaryPromoting", "CanaryPromoted"]


def test_a_failed_build_rolls_back_and_the_revision_is_not_tried_again_until_retry():
    failed = advance(advance(None, STEPS, seen(built=False)).state, STEPS, seen(built=False, failed=True))
    assert failed.state.phase == CanaryPhase.ROLLED_BACK and failed.split.canary_replicas == 0
    assert failed.state.failed_revisions == ("new",)
    # Next pass: same spec, nothing starts again.
    held = advance(failed.state, STEPS, seen(built=False, failed=True))
    assert held.state.phase == CanaryPhase.ROLLED_BACK and held.events == ()
    retried = advance(held.state, STEPS, seen(built=False, command="retry/1"))
    assert retried.state.phase == CanaryPhase.PREPARING and retried.state.failed_revisions == ()


def test_abort_scales_the_canary_to_zero_once_per_command():
    running = advance(advance(None, STEPS, seen()).state, STEPS, seen(canary_ready=1))
    aborted = advance(running.state, STEPS, seen(canary_ready=1, command="abort/7"))
    assert aborted.state.phase == CanaryPhase.ROLLED_BACK and aborted.split.canary_replicas == 0
    assert aborted.split.stable_replicas == 3, "stable is never scaled down"
    assert aborted.state.last_command == "abort/7"


def test_pause_resume_and_promote_by_hand():
    running = advance(advance(None, STEPS, seen()).state, STEPS, seen(canary_ready=1))
    paused = advance(running.state, STEPS, seen(canary_ready=1, command="pause/1"))
    assert paused.state.phase == CanaryPhase.PAUSED
    still = advance(paused.state, STEPS, seen(now=NOW + timedelta(hours=1), canary_ready=1, command="pause/1"))
    assert still.state.phase == CanaryPhase.PAUSED
    resumed = advance(still.state, STEPS, seen(canary_ready=1, command="resume/2"))
    assert resumed.state.phase == CanaryPhase.PROGRESSING and resumed.state.step_index == 2, "the pause step ends"
    promoted = advance(resumed.state, STEPS, seen(canary_ready=1, command="promote/3"))
    assert promoted.state.phase == CanaryPhase.PROMOTING and promoted.split.canary_replicas == 3


def test_a_pause_without_duration_waits_for_a_person():
    steps = (RolloutStep(set_weight=50), RolloutStep.model_validate({"pause": {"durationSeconds": 0}}))
    waiting = advance(advance(None, steps, seen()).state, steps, seen(canary_ready=3))
    assert waiting.state.phase == CanaryPhase.PAUSED and "resume" in waiting.state.message
    later = advance(waiting.state, steps, seen(now=NOW + timedelta(days=1), canary_ready=3))
    assert later.state.phase == CanaryPhase.PAUSED


def test_a_new_target_supersedes_the_running_canary():
    running = advance(advance(None, STEPS, seen()).state, STEPS, seen(canary_ready=1))
    newer = advance(running.state, STEPS, seen(target="newer", built=False))
    assert (newer.state.phase, newer.state.canary_revision) == (CanaryPhase.PREPARING, "newer")
    assert [reason for reason, _ in newer.events] == ["CanarySuperseded", "CanaryStarted"]


def test_the_gpu_budget_caps_the_canary_and_a_full_budget_pauses_it():
    capped = advance(advance(None, STEPS, seen(room=2)).state, STEPS, seen(room=2, canary_ready=1))
    assert capped.split.canary_replicas == 1
    no_room = advance(None, STEPS, seen(room=0))
    assert no_room.state.phase == CanaryPhase.PAUSED and "gpuBudget" in no_room.state.message


# --- through the reconcile pass ---------------------------------------------------------------

def test_a_spec_change_becomes_a_canary_beside_the_untouched_stable_revision():
    # Revision A rolls out directly (no stable revision yet), then becomes stable.
    first = decide_pass(manifest_with_steps("v1", 1), [], SETTINGS, NOW)
    job_a = with_status(kind(first, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    second = decide_pass(manifest_with_steps("v1", 1, first.status), [job_a], SETTINGS, NOW)
    serving_a = with_status(kind(second, "Deployment"), readyReplicas=2)
    children = [job_a, serving_a, kind(second, "ConfigMap"), kind(second, "Service")]
    stable = decide_pass(manifest_with_steps("v1", 1, second.status), children, SETTINGS, NOW)
    revision_a = stable.status["stableRevision"]
    assert revision_a == stable.status["currentRevision"] and stable.status.get("canary") is None

    # A spec change: revision B is prepared, then warms 2 replicas beside A's 2 (50%).
    changed = decide_pass(manifest_with_steps("v2", 2, stable.status), children, SETTINGS, NOW)
    revision_b = changed.status["currentRevision"]
    assert revision_b != revision_a and changed.status["stableRevision"] == revision_a
    assert changed.status["canary"]["phase"] == "Preparing"
    assert kind(changed, "Deployment", revision_b)["spec"]["replicas"] == 0
    assert [m["kind"] for m in changed.delete] == ["Job"], "only A's finished build Job goes; stable A stays"
    job_b = with_status(kind(changed, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    warming = decide_pass(manifest_with_steps("v2", 2, changed.status), children + [job_b], SETTINGS, NOW)
    assert warming.status["canary"]["phase"] == "Warming"
    assert kind(warming, "Deployment", revision_b)["spec"]["replicas"] == 2
    assert warming.status["canary"]["weightPercent"] == 50
    assert condition(warming, "Ready")["status"] == "True", "stable A serves throughout"
    assert all(m["metadata"]["labels"].get("llmfleet.io/revision") != revision_a for m in warming.apply), \
        "stable A is never re-applied (never restarted)"

    # Ready canary: the pause without duration holds it; an abort rolls it back.
    serving_b = with_status(kind(warming, "Deployment", revision_b), readyReplicas=2)
    canary_children = children + [job_b, serving_b]
    held = decide_pass(manifest_with_steps("v2", 2, warming.status), canary_children, SETTINGS, NOW + timedelta(seconds=30))
    assert held.status["canary"]["phase"] == "Paused"
    aborted_body = manifest_with_steps("v2", 2, held.status)
    aborted_body["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "abort/1"}
    aborted = decide_pass(aborted_body, canary_children, SETTINGS, NOW + timedelta(seconds=40))
    assert aborted.status["canary"]["phase"] == "RolledBack"
    assert kind(aborted, "Deployment", revision_b)["spec"]["replicas"] == 0
    assert condition(aborted, "Degraded")["reason"] == "CanaryRolledBack"
    assert ("Warning", "CanaryRolledBack") in [(e.type, e.reason) for e in aborted.events]
    assert aborted.status["stableRevision"] == revision_a
    assert not any(m["metadata"]["labels"].get("llmfleet.io/revision") == revision_a and m["kind"] != "Job"
                   for m in aborted.delete)

    # Reverting the spec to A ends the rollout; A is untouched, B's objects go.
    reverted = decide_pass(manifest_with_steps("v1", 3, aborted.status), canary_children, SETTINGS, NOW + timedelta(seconds=50))
    assert reverted.status["currentRevision"] == revision_a
    assert {m["metadata"]["labels"].get("llmfleet.io/revision") for m in reverted.delete} == {revision_b}


def test_a_promotion_makes_the_canary_stable_and_removes_the_old_revision():
    _, warming, children = canary_started()
    revision_b = warming.status["currentRevision"]
    serving_a = children[1]
    body = manifest_with_steps("v2", 2, warming.status)
    body["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "promote/1"}
    promoted = decide_pass(body, children, SETTINGS, NOW + timedelta(seconds=10))
    assert promoted.status["canary"]["phase"] == "Promoted"
    assert promoted.status["stableRevision"] == revision_b
    assert serving_a in promoted.delete and condition(promoted, "Ready")["status"] == "True"


# --- the metric gate ----------------------------------------------------------------------------

from llmfleet.api import RolloutGates  # noqa: E402
from llmfleet.render.ttft_buckets import UNRECORDED_BOUNDS_MS, ttft_bounds_ms  # noqa: E402
from llmfleet.rollout import HistogramBounds, Outcome, RevisionSample, Samples, Verdict, judge  # noqa: E402

GATES = RolloutGates(min_requests=20)
SLO_TTFT_P99_MS = 1000  # above every p99 below: these cases are about the comparison
# Both revisions with the same bounds (10, 25, 50, 75, 100, ... ms), as the cases below read them.
SAME_BOUNDS = HistogramBounds(UNRECORDED_BOUNDS_MS, UNRECORDED_BOUNDS_MS)


def sample(succeeded=100.0, failed=0.0, ttft=200.0, mean=None) -> RevisionSample:
    return RevisionSample(succeeded, failed, ttft, mean)


@pytest.mark.parametrize(("stable", "canary", "outcome", "words"), [
    (sample(), sample(ttft=210.0), Outcome.SUCCESSFUL, "+5%"),
    (sample(), sample(ttft=400.0), Outcome.FAILED, "maxTtftP99RegressionPercent"),
    (sample(), sample(succeeded=90.0, failed=10.0), Outcome.FAILED, "error rate 10.0%"),
    (sample(), sample(succeeded=5.0), Outcome.INCONCLUSIVE, "canary: 5 requests"),
    (sample(succeeded=None, failed=None, ttft=None), sample(), Outcome.INCONCLUSIVE, "stable: 0 requests"),
    (sample(), sample(ttft=None), Outcome.INCONCLUSIVE, "no p99 TTFT"),
    # +100 % interpolated, but within what the buckets can tell apart (10, 25, 50 ms): no failure.
    (sample(ttft=24.8), sample(ttft=49.0), Outcome.SUCCESSFUL, "(+98%)"),
    # 3x slower: the canary's bucket (50, 75] starts above stable's (10, 25] plus the margin.
    (sample(ttft=24.0), sample(ttft=72.0), Outcome.FAILED, "bucket starts at 50 ms, stable's ends at 25 ms"),
    # 3x slower in neighbouring buckets (bench_rollout at 10d51d4 promoted it): the exact means tell.
    (sample(ttft=25.0, mean=12.0), sample(ttft=50.0, mean=36.0), Outcome.FAILED,
     "mean TTFT canary 36.0 ms vs stable 12.0 ms (+200%) exceeds maxTtftMeanRegressionPercent 50%"),
    # Means within the margin (noise between replicas): the p99s decide.
    (sample(ttft=24.8, mean=12.0), sample(ttft=49.0, mean=16.0), Outcome.SUCCESSFUL, "(+98%)"),
])
def test_the_gate_compares_canary_with_stable(stable, canary, outcome, words):
    verdict = judge(Samples(stable, canary, 60), GATES, SLO_TTFT_P99_MS, SAME_BOUNDS)
    assert verdict.outcome == outcome and words in verdict.message


def test_each_revisions_p99_is_known_within_its_own_buckets():
    """A canary for a new SLO (300 ms) has bounds dense around it; stable, rendered for 5000 ms,
    has only the coarse ones there. Stable's p99 of 200 ms may be up to 250 ms (its bucket
    (100, 250]), so a canary at 255 ms, in (250, 261], is within the 10 % margin. Read on the
    canary's bounds, stable's p99 would seem to end at 207 ms and the canary would fail."""
    bounds = HistogramBounds(stable_ms=ttft_bounds_ms(5000, 3000, target_floats=True),
                             canary_ms=ttft_bounds_ms(300, 180, target_floats=True))
    verdict = judge(Samples(sample(ttft=200.0), sample(ttft=255.0), 60), GATES, 300, bounds)
    assert verdict.outcome == Outcome.SUCCESSFUL, verdict.message
    one_set = HistogramBounds(bounds.canary_ms, bounds.canary_ms)
    assert judge(Samples(sample(ttft=200.0), sample(ttft=255.0), 60), GATES, 300, one_set).outcome == Outcome.FAILED


def test_prometheus_down_is_an_error_not_a_failure():
    verdict = judge(Samples(window_seconds=60, error="connection refused"), GATES, SLO_TTFT_P99_MS, SAME_BOUNDS)
    assert verdict.outcome == Outcome.ERROR and "connection refused" in verdict.message


ANALYSED = (RolloutStep(set_weight=50), RolloutStep.model_validate({"analysis": {"durationSeconds": 60,
                                                                                  "intervalSeconds": 10}}))


def analysing():
    started = advance(advance(None, ANALYSED, seen()).state, ANALYSED, seen(canary_ready=3))
    assert (started.state.phase, started.state.step_index) == (CanaryPhase.PROGRESSING, 1)
    return started.state


def test_a_successful_analysis_passes_when_its_duration_is_over():
    good = Verdict(Outcome.SUCCESSFUL, "p99 TTFT canary 200 ms vs stable 198 ms")
    state = analysing()
    early = advance(state, ANALYSED, Observed("new", "old", True, False, 3, 3, 10, NOW + timedelta(seconds=20), None,
                                              good))
    assert early.state.phase == CanaryPhase.PROGRESSING and early.state.verdict == Outcome.SUCCESSFUL
    done = advance(early.state, ANALYSED,
                   Observed("new", "old", True, False, 3, 3, 10, NOW + timedelta(seconds=61), None, good))
    assert done.state.phase == CanaryPhase.PROMOTED, "the last step passed; the canary already has every replica"


def test_a_failed_analysis_rolls_back_at_once_naming_the_numbers():
    bad = Verdict(Outcome.FAILED, "p99 TTFT canary 900 ms vs stable 200 ms (+350%)")
    failed = advance(analysing(), ANALYSED,
                     Observed("new", "old", True, False, 3, 3, 10, NOW + timedelta(seconds=15), None, bad))
    assert failed.state.phase == CanaryPhase.ROLLED_BACK and "+350%" in failed.state.message
    assert failed.split.canary_replicas == 0 and failed.state.failed_revisions == ("new",)


def test_no_data_holds_then_pauses_past_the_deadline_and_never_rolls_back():
    unknown = Verdict(Outcome.ERROR, "Prometheus: connection refused")
    state = analysing()
    for seconds in (15, 70, 300):
        held = advance(state, ANALYSED,
                       Observed("new", "old", True, False, 3, 3, 10, NOW + timedelta(seconds=seconds), None, unknown))
        assert held.state.phase == CanaryPhase.PROGRESSING and "connection refused" in held.state.message
        state = held.state
    late = advance(state, ANALYSED, Observed("new", "old", True, False, 3, 3, 10,
                                             NOW + timedelta(seconds=60 + GATES.analysis_deadline_seconds + 1),
                                             None, unknown))
    assert late.state.phase == CanaryPhase.PAUSED and "promote or abort" in late.state.message


def test_verdicts_are_reached_once_per_interval():
    bad = Verdict(Outcome.FAILED, "worse")
    good = Verdict(Outcome.SUCCESSFUL, "fine")
    first = advance(analysing(), ANALYSED, Observed("new", "old", True, False, 3, 3, 10,
                                                    NOW + timedelta(seconds=5), None, good))
    # 4 s later a (hypothetical) failing sample is not looked at: the interval is 10 s.
    soon = advance(first.state, ANALYSED, Observed("new", "old", True, False, 3, 3, 10,
                                                   NOW + timedelta(seconds=9), None, bad))
    assert soon.state.phase == CanaryPhase.PROGRESSING and soon.state.verdict == Outcome.SUCCESSFUL


def analysed(revision: str, generation: int, status: dict | None = None) -> dict:
    """`manifest` whose canary takes half the replicas, then a 60 s analysis."""
    body = manifest_with_steps(revision, generation, status)
    body["spec"]["rollout"] = {"steps": [{"setWeight": 50}, {"analysis": {"durationSeconds": 60}}]}
    return body


def test_the_reconcile_pass_asks_for_samples_when_due_and_records_the_verdict():
    from llmfleet.reconcile.due import analysis_query

    stable, warming, children = canary_started(analysed)
    analysing_now = decide_pass(analysed("v2", 2, warming.status), children, SETTINGS, NOW + timedelta(seconds=5))
    assert analysing_now.status["canary"]["stepIndex"] == 1

    body = analysed("v2", 2, analysing_now.status)
    later = NOW + timedelta(seconds=45)
    query = analysis_query(Context.of(body, [], SETTINGS, later))
    assert (query.stable_revision, query.canary_revision, query.step_elapsed_seconds) == (
        stable.status["stableRevision"], warming.status["currentRevision"], 40)
    slow = Samples(RevisionSample(100.0, 0.0, 200.0), RevisionSample(100.0, 0.0, 500.0), 40)
    judged = decide_pass(body, children, SETTINGS, later, samples=slow)
    canary = judged.status["canary"]
    assert (canary["phase"], canary["analysisVerdict"]) == ("RolledBack", "Failed")
    assert "500 ms vs stable 200 ms" in canary["analysisMessage"]
    assert analysis_query(Context.of(analysed("v2", 2, judged.status), [], SETTINGS, later + timedelta(seconds=30))) is None


# --- the quality gate ---------------------------------------------------------------------------

from llmfleet.api import QualityGate  # noqa: E402
from llmfleet.rollout.quality import GoldenAnswers, PodAnswers, judge_quality, parse_prompts  # noqa: E402

GATE = QualityGate(prompts=["a", "b", "c", "d"])
REFERENCE = PodAnswers("stable-0", ("one two three four", "five six", "seven", "eight nine ten"))


def golden(*canary_answers: tuple) -> GoldenAnswers:
    return GoldenAnswers(tuple(GATE.prompts), REFERENCE,
                         tuple(PodAnswers(f"canary-{i}", answers) for i, answers in enumerate(canary_answers)))


def test_equal_answers_pass_the_quality_gate():
    verdict = judge_quality(golden(REFERENCE.answers, REFERENCE.answers), GATE)
    assert verdict.outcome == Outcome.SUCCESSFUL
    assert "exact match 100%" in verdict.message and "4 prompt(s) x 2 canary replica(s)" in verdict.message


def test_drifted_answers_fail_with_the_numbers_and_the_first_difference():
    drifted = ("one two three four", "five SIX", "seven", "eight nine ten")
    verdict = judge_quality(golden(drifted), GATE)
    # 3 of 4 answers exact (75 % < 90 %); 9 of 10 words agree (90 % < 95 %).
    assert verdict.outcome == Outcome.FAILED
    assert "exact match 75% (min 90%), token agreement 90% (min 95%)" in verdict.message
    assert "prompt 2 on canary-0: 'five SIX' where stable answered 'five six'" in verdict.message
    assert judge_quality(golden(drifted), QualityGate(prompts=["a", "b", "c", "d"], min_exact_match_percent=75,
                                                     min_token_agreement_percent=90)).outcome == Outcome.SUCCESSFUL


def test_a_failed_canary_answer_counts_as_wrong_and_a_failed_reference_decides_nothing():
    failed = judge_quality(golden((None, *REFERENCE.answers[1:])), GATE)
    assert failed.outcome == Outcome.FAILED and "'(failed)'" not in failed.message and "(failed)" in failed.message
    no_reference = GoldenAnswers(("a",), PodAnswers("stable-0", (None,), ("timed out",)),
                                 (PodAnswers("canary-0", ("x",)),))
    assert judge_quality(no_reference, GATE).outcome == Outcome.INCONCLUSIVE
    assert judge_quality(GoldenAnswers(error="no ready replica"), GATE).outcome == Outcome.ERROR


def test_configmap_prompts_are_one_per_non_empty_line():
    assert parse_prompts("What is 2+2?\n\n  Name a colour.  \n") == ("What is 2+2?", "Name a colour.")


def quality_seen(verdict: Verdict | None, now=NOW, canary_ready=1) -> Observed:
    return Observed("new", "old", True, False, canary_ready, 3, 10, now, None, None, verdict)


def test_a_ready_canary_waits_for_its_golden_prompts_and_a_failure_rolls_it_back():
    warming = advance(None, STEPS, seen(), check_quality=True)
    assert warming.state.phase == CanaryPhase.WARMING
    waiting = advance(warming.state, STEPS, quality_seen(None), check_quality=True)
    assert waiting.state.phase == CanaryPhase.WARMING and "golden prompts: checking" in waiting.state.message
    failed = advance(waiting.state, STEPS, quality_seen(Verdict(Outcome.FAILED, "exact match 10%")),
                     check_quality=True)
    assert (failed.state.phase, failed.split.canary_replicas) == (CanaryPhase.ROLLED_BACK, 0)
    assert "quality gate failed: exact match 10%" in failed.state.message
    assert failed.state.failed_revisions == ("new",) and failed.state.quality == Outcome.FAILED


def test_a_passed_quality_gate_starts_the_steps_and_is_not_asked_again():
    warming = advance(None, STEPS, seen(), check_quality=True)
    passed = advance(warming.state, STEPS, quality_seen(Verdict(Outcome.SUCCESSFUL, "exact match 100%")),
                     check_quality=True)
    assert passed.state.phase == CanaryPhase.PROGRESSING and passed.state.quality == Outcome.SUCCESSFUL
    assert ("CanaryQualityPassed", "exact match 100%") in passed.events


def test_unanswered_golden_prompts_hold_then_pause_past_the_deadline():
    warming = advance(None, STEPS, seen(), check_quality=True)
    error = Verdict(Outcome.ERROR, "no ready replica of stable revision old")
    held = advance(warming.state, STEPS, quality_seen(error, now=NOW + timedelta(seconds=30)), check_quality=True)
    assert held.state.phase == CanaryPhase.WARMING and "no ready replica" in held.state.message
    late = NOW + timedelta(seconds=RolloutGates().analysis_deadline_seconds + 1)
    paused = advance(held.state, STEPS, quality_seen(error, now=late), check_quality=True)
    assert paused.state.phase == CanaryPhase.PAUSED and "golden prompts without a verdict" in paused.state.message


def checked(revision: str, generation: int, status: dict | None = None) -> dict:
    """`manifest` whose canaries must answer GATE's golden prompts as stable does."""
    body = manifest_with_steps(revision, generation, status)
    body["spec"]["rollout"]["quality"] = {"prompts": list(GATE.prompts)}
    return body


def test_the_reconcile_pass_asks_the_golden_prompts_while_warming_and_records_the_verdict():
    _, warming, children = canary_started(checked)
    assert warming.status["canary"]["phase"] == "Warming"
    body = checked("v2", 2, warming.status)
    query = quality_query(Context.of(body, [], SETTINGS, NOW))
    assert (query.canary_revision, query.canary_replicas) == (warming.status["currentRevision"], 2)
    held = decide_pass(body, children, SETTINGS, NOW + timedelta(seconds=5))
    assert held.status["canary"]["phase"] == "Warming", "no answers yet: the canary waits"
    drifted = golden(("x", "y", "z", "w"), REFERENCE.answers)
    judged = decide_pass(body, children, SETTINGS, NOW + timedelta(seconds=5), golden=drifted)
    canary = judged.status["canary"]
    assert (canary["phase"], canary["qualityVerdict"]) == ("RolledBack", "Failed")
    assert "exact match 50%" in canary["qualityMessage"]
    assert quality_query(Context.of(checked("v2", 2, judged.status), [], SETTINGS, NOW)) is None


# --- status as the apiserver keeps it --------------------------------------------------------------

def test_a_verdict_cleared_as_its_step_passes_is_gone_from_the_stored_status():
    """Each pass writes a merge patch: the stored status is the last one merged onto the ones
    before. A verdict reached and cleared in the pass that promotes must not leave the
    previous window's Inconclusive standing beside the promoted phase."""
    _, warming, children = canary_started(analysed)
    stored = warming.status
    few = Samples(RevisionSample(50.0, 0.0, 200.0), RevisionSample(5.0, 0.0, 200.0), 30)
    enough = Samples(RevisionSample(100.0, 0.0, 200.0), RevisionSample(40.0, 0.0, 200.0), 60)
    for seconds, samples in ((5, None), (30, few), (65, enough)):
        outcome = decide_pass(analysed("v2", 2, stored), children, SETTINGS, NOW + timedelta(seconds=seconds),
                         samples=samples)
        stored = stored_after(stored, outcome)
        if seconds == 30:
            assert stored["canary"]["analysisVerdict"] == "Inconclusive", stored["canary"]
    assert stored["canary"]["phase"] == "Promoted", stored["canary"]
    assert "analysisVerdict" not in stored["canary"] and "analysisMessage" not in stored["canary"], stored["canary"]


def test_every_canary_owes_its_own_golden_prompts():
    """The quality verdict of a promoted canary is not the next canary's: v3 is asked again."""
    _, warming, children = canary_started(checked)
    job_a, serving_a, job_b, serving_b = children
    answers = GoldenAnswers(tuple(GATE.prompts), REFERENCE, (PodAnswers("canary-0", REFERENCE.answers),))
    passed = decide_pass(checked("v2", 2, warming.status), children, SETTINGS, NOW + timedelta(seconds=5), golden=answers)
    stored = stored_after(warming.status, passed)
    assert (stored["canary"]["phase"], stored["canary"]["qualityVerdict"]) == ("Paused", "Successful")
    promote = checked("v2", 2, stored)
    promote["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "promote/1"}
    promoted = decide_pass(promote, children, SETTINGS, NOW + timedelta(seconds=10))
    stored = stored_after(stored, promoted)
    assert stored["canary"]["phase"] == "Promoted"

    kept = [job_b, serving_b]
    changed = decide_pass(checked("v3", 3, stored), kept, SETTINGS, NOW + timedelta(seconds=20))
    stored = stored_after(stored, changed)
    job_c = with_status(kind(changed, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    warming_c = decide_pass(checked("v3", 3, stored), [*kept, job_c], SETTINGS, NOW + timedelta(seconds=25))
    stored = stored_after(stored, warming_c)
    assert stored["canary"]["phase"] == "Warming" and "qualityVerdict" not in stored["canary"], stored["canary"]
    query = quality_query(Context.of(checked("v3", 3, stored), [], SETTINGS, NOW))
    assert query is not None and query.canary_revision == stored["currentRevision"]


# --- canary replicas that never become ready ----------------------------------------------------

def test_canary_replicas_not_ready_by_the_deadline_roll_back_with_the_pods_reason():
    warming = advance(None, STEPS, seen())
    deadline = RolloutGates().canary_ready_deadline_seconds
    waiting = advance(warming.state, STEPS, seen(now=NOW + timedelta(seconds=deadline - 1)))
    assert waiting.state.phase == CanaryPhase.WARMING
    why = "pod chat-x is Pending: Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    late = Observed("new", "old", True, False, 0, 3, 10, NOW + timedelta(seconds=deadline), None,
                    not_ready_reason=why)
    rolled_back = advance(waiting.state, STEPS, late)
    assert rolled_back.state.phase == CanaryPhase.ROLLED_BACK and rolled_back.split.canary_replicas == 0
    assert f"0/1 canary replica(s) ready {deadline} s after they were asked for" in rolled_back.state.message
    assert why in rolled_back.state.message


def test_a_set_weight_step_has_its_own_deadline_from_when_it_began():
    steps = (RolloutStep(set_weight=25), RolloutStep(set_weight=50))
    running = advance(advance(None, steps, seen()).state, steps, seen(canary_ready=1))
    assert (running.state.step_index, running.split.canary_replicas) == (1, 3)
    deadline = RolloutGates().canary_ready_deadline_seconds
    later = NOW + timedelta(seconds=deadline + 5)
    assert advance(running.state, steps, seen(now=later - timedelta(seconds=10), canary_ready=1)).state.phase \
        == CanaryPhase.PROGRESSING
    assert advance(running.state, steps, seen(now=later, canary_ready=1)).state.phase == CanaryPhase.ROLLED_BACK


def pod(name: str, **status) -> dict:
    return {"metadata": {"name": name}, "status": status}


def test_the_pods_say_why_they_are_not_ready():
    from llmfleet.reconcile.pods import not_ready_reason

    unschedulable = pod("a", phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}])
    crashing = pod("b", phase="Running", containerStatuses=[
        {"name": "triton", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}])
    starting = pod("c", phase="Pending", initContainerStatuses=[
        {"name": "model-repository", "state": {"waiting": {"reason": "PodInitializing"}}}])
    assert not_ready_reason([starting, unschedulable]) == (
        "pod a is Pending: Unschedulable: 0/3 nodes are available: 3 node(s) didn't match Pod's node "
        "affinity/selector.")
    assert not_ready_reason([crashing]) == "pod b container triton: CrashLoopBackOff: back-off 40s"
    restarted = pod("d", phase="Running", containerStatuses=[
        {"name": "triton", "restartCount": 3, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
         "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}}}])
    assert not_ready_reason([restarted]) == (
        "pod d container triton: CrashLoopBackOff (restarted 3 times, last exit code 1): back-off 40s")
    restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["message"] = (
        "I1203 loading model\nE1203 failed to load 'tensorrt_llm': out of memory\n\n")
    assert not_ready_reason([restarted]).endswith(
        "back-off 40s; it last said: E1203 failed to load 'tensorrt_llm': out of memory")
    assert not_ready_reason([starting]) is None
    evicted = pod("e", phase="Running", conditions=[
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
         "message": "Taint manager: deleting due to NoExecute taint"}])
    assert not_ready_reason([starting, evicted]) == (
        "pod e is being evicted: DeletionByTaintManager: Taint manager: deleting due to NoExecute taint")
    on_a_silent_node = {**pod("f", phase="Running", conditions=[{"type": "Ready", "status": "False"}],
                              containerStatuses=[{"name": "triton", "ready": True, "state": {"running": {}}}]),
                        "spec": {"nodeName": "gpu-node-2"}}
    assert not_ready_reason([on_a_silent_node]) == (
        "pod f is not ready though its containers last reported ready: its node gpu-node-2 stopped reporting")
    still_loading = pod("g", phase="Running", conditions=[{"type": "Ready", "status": "False"}],
                        containerStatuses=[{"name": "triton", "ready": False, "state": {"running": {}}}])
    assert not_ready_reason([still_loading]) is None


def test_the_reconcile_pass_looks_at_the_pods_only_when_the_canary_is_overdue():
    from llmfleet.reconcile.due import overdue_canary

    _, warming, children = canary_started()
    body = manifest_with_steps("v2", 2, warming.status)
    deadline = RolloutGates().canary_ready_deadline_seconds
    assert overdue_canary(Context.of(body, [], SETTINGS, NOW + timedelta(seconds=deadline - 1))) is None
    assert overdue_canary(Context.of(body, [], SETTINGS, NOW + timedelta(seconds=deadline))) == warming.status["currentRevision"]
    not_ready = [child if child["kind"] != "Deployment" or child["metadata"]["labels"]["llmfleet.io/revision"]
                 != warming.status["currentRevision"] else with_status(child, readyReplicas=0) for child in children]
    outcome = decide_pass(body, not_ready, SETTINGS, NOW + timedelta(seconds=deadline),
                     not_ready_reason="pod x is Pending: Unschedulable: no GPUs")
    assert outcome.status["canary"]["phase"] == "RolledBack"
    assert "Unschedulable: no GPUs" in outcome.status["canary"]["message"]


# --- Gateway API routing ------------------------------------------------------------------------

def routed(revision: str, generation: int, status: dict | None = None) -> dict:
    body = manifest_with_steps(revision, generation, status)
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gateways",
                                                             "sectionName": "http"}]}}
    return body


def route_backends(outcome) -> dict[str, int]:
    route = kind(outcome, "HTTPRoute")
    return {ref["name"]: ref["weight"] for ref in route["spec"]["rules"][0]["backendRefs"]}


def test_the_http_route_sends_all_to_stable_then_the_canarys_share_then_all_to_the_promoted_revision():
    stable, warming, children = canary_started(routed)
    revision_a, revision_b = stable.status["stableRevision"], warming.status["currentRevision"]
    assert route_backends(stable) == {f"chat-{revision_a}-backend": 100}
    route = kind(stable, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference", "namespace": "gateways", "sectionName": "http"}]
    assert route["metadata"]["name"] == "chat" and route["spec"]["rules"][0]["backendRefs"][0]["port"] == 8000
    backend = next(m for m in stable.apply if m["kind"] == "Service"
                   and m["metadata"]["name"] == f"chat-{revision_a}-backend")
    assert backend["spec"]["selector"] == {"llmfleet.io/deployment": "chat", "app.kubernetes.io/component": "server",
                                           "llmfleet.io/revision": revision_a}
    # Warming at setWeight 50: two canary replicas beside two stable ones.
    assert route_backends(warming) == {f"chat-{revision_a}-backend": 50, f"chat-{revision_b}-backend": 50}
    body = routed("v2", 2, warming.status)
    body["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "promote/1"}
    promoted = decide_pass(body, children, SETTINGS, NOW + timedelta(seconds=10))
    assert promoted.status["canary"]["phase"] == "Promoted"
    assert route_backends(promoted) == {f"chat-{revision_b}-backend": 100}


def test_without_routing_there_is_no_http_route():
    stable, _, _ = canary_started()
    assert not [m for m in stable.apply if m["kind"] == "HTTPRoute"]


def test_the_stable_revisions_own_service_serves_the_canary_and_goes_when_routing_is_switched_off():
    stable, warming, children = canary_started(routed)
    revision_a = stable.status["stableRevision"]
    service_a = next(m for m in stable.apply if m["kind"] == "Service"
                     and m["metadata"]["name"] == f"chat-{revision_a}-backend")
    children = [*children, service_a]
    running = decide_pass(routed("v2", 2, warming.status), children, SETTINGS, NOW + timedelta(seconds=10))
    assert service_a not in running.delete, "the route still sends the stable revision its share"
    unrouted = decide_pass(manifest_with_steps("v2", 3, running.status), children, SETTINGS, NOW + timedelta(seconds=20))
    assert service_a in unrouted.delete
    assert children[1] not in unrouted.delete, "the stable revision's Deployment still serves"


class HungGoldenGateway(SilentGateway):
    """Writes go nowhere; listing the canary's pods for the golden prompts hangs until released."""

    def __init__(self):
        self.released = threading.Event()
        self.listing = threading.Event()

    def list_pods(self, namespace, selector):
        self.listing.set()
        self.released.wait(60)
        return []


def test_a_hung_golden_prompt_gate_holds_neither_its_pass_nor_another_deployments():
    from llmfleet.reconcile import Probes, reconcile

    _, warming, children = canary_started(checked)
    body = checked("v2", 2, warming.status)
    finished = threading.Event()
    probes, kube = Probes(1, lambda uid: finished.set()), HungGoldenGateway()
    try:
        started_s = time.monotonic()
        held = reconcile(copy.deepcopy(body), kube, SETTINGS, NOW + timedelta(seconds=5), children=children,
                         probes=probes)
        assert kube.listing.wait(10), "the golden prompts were never asked"
        other = reconcile(manifest_with_steps("v1", 1), kube, SETTINGS, NOW, probes=probes)
        assert time.monotonic() - started_s < 10
        assert held.status["canary"]["phase"] == "Warming" and other.status["currentRevision"]
        assert not finished.is_set()
    finally:
        kube.released.set()
        probes.stop()
    assert finished.wait(10), "the probe's end marks the deployment for the pass that reads its answer"
