"""Canary rollouts: the pure state machine, and the reconcile pass that carries it (replicas per
revision, pruning, conditions, status that is all a restarted operator needs)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest

from llmfleet.api import CanaryPhase, RolloutStep
from llmfleet.reconcile import OperatorSettings, decide
from llmfleet.render import RenderSettings
from llmfleet.rollout import Command, Observed, advance, canary_replicas_for

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
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


def test_a_pause_without_duration_and_an_analysis_step_wait_for_a_person():
    steps = (RolloutStep(set_weight=50), RolloutStep.model_validate({"pause": {"durationSeconds": 0}}),
             RolloutStep.model_validate({"analysis": {"durationSeconds": 60}}))
    waiting = advance(advance(None, steps, seen()).state, steps, seen(canary_ready=3))
    assert waiting.state.phase == CanaryPhase.PAUSED and "resume" in waiting.state.message
    analysis = advance(waiting.state, steps, seen(canary_ready=3, command="resume/1"))
    assert analysis.state.phase == CanaryPhase.PAUSED and "not evaluated" in analysis.state.message


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

SETTINGS = OperatorSettings(render=RenderSettings())


def manifest(engine_revision: str, generation: int, status: dict | None = None) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "uid-1", "generation": generation},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "engine": {"revision": engine_revision},
            "slo": {"ttftP99Ms": 1000, "tpotP99Ms": 40},
            "workload": {"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64,
                         "outputTokensP99": 128, "peakRequestsPerSecond": 2},
            "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
            "plan": {"replicas": 2},
            "rollout": {"steps": [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}]},
        },
        **({"status": status} if status else {}),
    }


def kind(outcome, name: str, revision: str | None = None) -> dict:
    return next(m for m in outcome.apply if m["kind"] == name
                and (revision is None or m["metadata"]["labels"].get("llmfleet.io/revision") == revision))


def with_status(obj: dict, **status) -> dict:
    done = copy.deepcopy(obj)
    done["status"] = status
    return done


def condition(outcome, name: str) -> dict:
    return next(c for c in outcome.status["conditions"] if c["type"] == name)


def test_a_spec_change_becomes_a_canary_beside_the_untouched_stable_revision():
    # Revision A rolls out directly (no stable revision yet), then becomes stable.
    first = decide(manifest("v1", 1), [], SETTINGS, NOW)
    job_a = with_status(kind(first, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    second = decide(manifest("v1", 1, first.status), [job_a], SETTINGS, NOW)
    serving_a = with_status(kind(second, "Deployment"), readyReplicas=2)
    children = [job_a, serving_a, kind(second, "ConfigMap"), kind(second, "Service")]
    stable = decide(manifest("v1", 1, second.status), children, SETTINGS, NOW)
    revision_a = stable.status["stableRevision"]
    assert revision_a == stable.status["currentRevision"] and stable.status.get("canary") is None

    # A spec change: revision B is prepared, then warms 2 replicas beside A's 2 (50%).
    changed = decide(manifest("v2", 2, stable.status), children, SETTINGS, NOW)
    revision_b = changed.status["currentRevision"]
    assert revision_b != revision_a and changed.status["stableRevision"] == revision_a
    assert changed.status["canary"]["phase"] == "Preparing"
    assert kind(changed, "Deployment", revision_b)["spec"]["replicas"] == 0
    assert [m["kind"] for m in changed.delete] == ["Job"], "only A's finished build Job goes; stable A stays"
    job_b = with_status(kind(changed, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    warming = decide(manifest("v2", 2, changed.status), children + [job_b], SETTINGS, NOW)
    assert warming.status["canary"]["phase"] == "Warming"
    assert kind(warming, "Deployment", revision_b)["spec"]["replicas"] == 2
    assert warming.status["canary"]["weightPercent"] == 50
    assert condition(warming, "Ready")["status"] == "True", "stable A serves throughout"
    assert all(m["metadata"]["labels"].get("llmfleet.io/revision") != revision_a for m in warming.apply), \
        "stable A is never re-applied (never restarted)"

    # Ready canary: the pause without duration holds it; an abort rolls it back.
    serving_b = with_status(kind(warming, "Deployment", revision_b), readyReplicas=2)
    canary_children = children + [job_b, serving_b]
    held = decide(manifest("v2", 2, warming.status), canary_children, SETTINGS, NOW + timedelta(seconds=30))
    assert held.status["canary"]["phase"] == "Paused"
    aborted_body = manifest("v2", 2, held.status)
    aborted_body["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "abort/1"}
    aborted = decide(aborted_body, canary_children, SETTINGS, NOW + timedelta(seconds=40))
    assert aborted.status["canary"]["phase"] == "RolledBack"
    assert kind(aborted, "Deployment", revision_b)["spec"]["replicas"] == 0
    assert condition(aborted, "Degraded")["reason"] == "CanaryRolledBack"
    assert ("Warning", "CanaryRolledBack") in [(e.type, e.reason) for e in aborted.events]
    assert aborted.status["stableRevision"] == revision_a
    assert not any(m["metadata"]["labels"].get("llmfleet.io/revision") == revision_a and m["kind"] != "Job"
                   for m in aborted.delete)

    # Reverting the spec to A ends the rollout; A is untouched, B's objects go.
    reverted = decide(manifest("v1", 3, aborted.status), canary_children, SETTINGS, NOW + timedelta(seconds=50))
    assert reverted.status["currentRevision"] == revision_a
    assert {m["metadata"]["labels"].get("llmfleet.io/revision") for m in reverted.delete} == {revision_b}


def test_a_promotion_makes_the_canary_stable_and_removes_the_old_revision():
    first = decide(manifest("v1", 1), [], SETTINGS, NOW)
    job_a = with_status(kind(first, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    second = decide(manifest("v1", 1, first.status), [job_a], SETTINGS, NOW)
    serving_a = with_status(kind(second, "Deployment"), readyReplicas=2)
    stable = decide(manifest("v1", 1, second.status), [job_a, serving_a], SETTINGS, NOW)
    changed = decide(manifest("v2", 2, stable.status), [job_a, serving_a], SETTINGS, NOW)
    job_b = with_status(kind(changed, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    warming = decide(manifest("v2", 2, changed.status), [job_a, serving_a, job_b], SETTINGS, NOW)
    revision_b = warming.status["currentRevision"]
    serving_b = with_status(kind(warming, "Deployment", revision_b), readyReplicas=2)
    children = [job_a, serving_a, job_b, serving_b]
    body = manifest("v2", 2, warming.status)
    body["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "promote/1"}
    promoted = decide(body, children, SETTINGS, NOW + timedelta(seconds=10))
    assert promoted.status["canary"]["phase"] == "Promoted"
    assert promoted.status["stableRevision"] == revision_b
    assert serving_a in promoted.delete and condition(promoted, "Ready")["status"] == "True"
