"""Canary rollouts under the faults of issue 31: the autoscaler resizing the fleet while a canary
runs (the canary keeps the share its step says), and a stable revision that degrades beside a
canary (the gate holds; it never promotes a canary because stable looks worse)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from llmfleet.api import CanaryPhase, Reason, RolloutGates, RolloutStep
from llmfleet.autoscale import MetricsSnapshot
from llmfleet.reconcile import reconcile
from llmfleet.render.ttft_buckets import UNRECORDED_BOUNDS_MS
from llmfleet.rollout import (HistogramBounds, Observed, Outcome, RevisionSample, Samples, Verdict, advance,
                              canary_replicas_for, judge)
from reconcile_builders import (
    NOW, SETTINGS, SilentGateway, canary_started, condition, decide_pass, kind, manifest_with_steps)

# --- autoscaling while a canary runs ------------------------------------------------------------


def seen(stable: int, canary_ready: int, now=NOW, room: int = 100, analysis: Verdict | None = None) -> Observed:
    return Observed("new", "old", True, False, canary_ready, stable, room, now, analysis=analysis)


PAUSE = RolloutStep.model_validate({"pause": {"durationSeconds": 300}})
WAIT_FOR_A_PERSON = RolloutStep.model_validate({"pause": {"durationSeconds": 0}})
ANALYSIS = RolloutStep.model_validate({"analysis": {"durationSeconds": 300, "intervalSeconds": 30}})


def at_second_step(weight: int, step: RolloutStep, stable: int):
    """A canary past its `setWeight` step, in the step after it, beside `stable` replicas."""
    steps = (RolloutStep(set_weight=weight), step, RolloutStep(set_weight=100))
    warming = advance(None, steps, seen(stable, 0))
    canary = warming.split.canary_replicas
    there = advance(warming.state, steps, seen(stable, canary))
    assert there.state.step_index == 1 and there.state.phase in (CanaryPhase.PROGRESSING, CanaryPhase.PAUSED)
    return steps, there


@pytest.mark.parametrize("step", [PAUSE, WAIT_FOR_A_PERSON, ANALYSIS], ids=["pause", "paused", "analysis"])
@pytest.mark.parametrize(("weight", "stable_counts"), [(50, (2, 4, 2)), (25, (3, 6, 9, 3)), (20, (4, 8, 2))])
def test_the_canary_keeps_its_steps_share_as_the_autoscaler_resizes_stable(step, weight, stable_counts):
    steps, decision = at_second_step(weight, step, stable_counts[0])
    where = (decision.state.phase, decision.state.step_index)
    for seconds, stable in enumerate(stable_counts[1:], start=1):
        # The canary's ready replicas lag: resizing is not waiting for them, nor a step passing.
        decision = advance(decision.state, steps, seen(stable, decision.split.canary_replicas,
                                                        NOW + timedelta(seconds=seconds)))
        split = decision.split
        assert (decision.state.phase, decision.state.step_index) == where
        assert split.stable_replicas == stable and split.canary_replicas == canary_replicas_for(weight, stable)
        assert decision.state.canary_replicas == split.canary_replicas, "the stored count is the one applied"
        # Within what whole replicas allow: the nearest share to the step's weight.
        assert abs(split.weight_percent - weight) <= 100 / (split.stable_replicas + split.canary_replicas) / 2 + 1


def test_a_canary_without_replicas_gets_none_when_stable_grows():
    """Paused for want of GPU budget before its first replica: more stable replicas do not
    start one behind the person's back."""
    steps = (RolloutStep(set_weight=50), PAUSE)
    paused = advance(None, steps, seen(2, 0, room=0))
    assert paused.state.phase == CanaryPhase.PAUSED and paused.split.canary_replicas == 0
    grown = advance(paused.state, steps, seen(4, 0, room=10))
    assert grown.split.canary_replicas == 0


def autoscaled(engine_revision: str, generation: int, status: dict | None = None) -> dict:
    body = manifest_with_steps(engine_revision, generation, status)
    del body["spec"]["plan"]
    body["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 2, "maxReplicas": 4}
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference"}]}}
    return body


BREACH = MetricsSnapshot(ttft_p99_ms=3000.0, waiting_requests=4.0, requests_per_second=2.0,
                         kv_cache_utilization=0.5, sample_time=NOW, scrape_interval_seconds=5.0)


def test_a_scale_up_during_a_paused_step_resizes_stable_and_the_canary_alike():
    """The autoscaler sizes the stable revision; the pass writes its count to stable's
    Deployment (not rendered while a canary runs) and renders the canary at the step's share,
    so replicas, status and the route's weights agree."""
    _, warming, children = canary_started(autoscaled)
    paused = decide_pass(autoscaled("v2", 2, warming.status), children, SETTINGS, NOW)
    assert paused.status["canary"]["phase"] == "Paused" and paused.scale == []
    stable_revision, canary_revision = paused.status["stableRevision"], paused.status["currentRevision"]
    up = decide_pass(autoscaled("v2", 2, paused.status), children, SETTINGS, NOW, BREACH)
    assert up.status["replicas"] == 4 and up.status["autoscaler"]["lastDecision"] == "ScaleUp"
    [(stable_deployment, replicas)] = up.scale
    assert stable_deployment["metadata"]["name"] == f"chat-{stable_revision}" and replicas == 4
    assert kind(up, "Deployment", canary_revision)["spec"]["replicas"] == 4
    assert (up.status["canary"]["phase"], up.status["canary"]["canaryReplicas"],
            up.status["canary"]["weightPercent"]) == ("Paused", 4, 50)
    backends = {ref["name"]: ref["weight"] for ref in kind(up, "HTTPRoute")["spec"]["rules"][0]["backendRefs"]}
    assert backends == {f"chat-{stable_revision}-backend": 50, f"chat-{canary_revision}-backend": 50}


def test_after_a_rollback_the_autoscaler_still_sizes_stable():
    """The spec still asks for the rolled-back revision, so the canary machinery stays in
    charge: the autoscaler's count must reach stable's Deployment all the same."""
    _, warming, children = canary_started(autoscaled)
    body = autoscaled("v2", 2, warming.status)
    body["metadata"]["annotations"] = {"llmfleet.io/rollout-command": "abort/1"}
    aborted = decide_pass(body, children, SETTINGS, NOW)
    assert aborted.status["canary"]["phase"] == "RolledBack"
    body["status"] = aborted.status
    up = decide_pass(body, children, SETTINGS, NOW + timedelta(seconds=10), BREACH)
    assert up.status["replicas"] == 4 and up.status["canary"]["phase"] == "RolledBack"
    assert [(child["metadata"]["name"], replicas) for child, replicas in up.scale] == [
        (f"chat-{aborted.status['stableRevision']}", 4)]
    assert kind(up, "Deployment", aborted.status["currentRevision"])["spec"]["replicas"] == 0


def test_without_the_autoscaler_stable_keeps_its_own_plans_replicas():
    """A new plan's replica count is not the stable revision's capacity (another GPU or TP)."""
    _, warming, children = canary_started()
    body = manifest_with_steps("v2", 3, warming.status)
    body["spec"]["plan"]["replicas"] = 3
    outcome = decide_pass(body, children, SETTINGS, NOW)
    assert outcome.status["replicas"] == 3 and outcome.scale == []


class ScaleRecordingGateway(SilentGateway):
    def __init__(self):
        self.scaled: list[tuple[str, int]] = []

    def scale(self, child, replicas):
        self.scaled.append((child["metadata"]["name"], replicas))


def test_the_pass_writes_the_stable_revisions_replicas():
    """Without Prometheus the autoscaler holds at the stored count, which stable's Deployment
    has fallen behind (say, written before an operator restart)."""
    _, warming, children = canary_started(autoscaled)
    body = autoscaled("v2", 2, {**warming.status, "replicas": 3})
    kube = ScaleRecordingGateway()
    reconcile(body, kube, SETTINGS, NOW, children=children)
    assert kube.scaled == [(f"chat-{warming.status['stableRevision']}", 3)]


# --- the stable revision degrades while a canary runs -------------------------------------------

GATES = RolloutGates(min_requests=20)
SLO_TTFT_P99_MS = 1000


def sample(ttft: float = 200.0, failed: float = 0.0, mean: float | None = None) -> RevisionSample:
    return RevisionSample(100.0 - failed, failed, ttft, mean)


@pytest.mark.parametrize(("stable", "canary", "outcome", "words"), [
    # The case: stable at 2000 ms makes a canary at 200 ms read -90 %; it is held, not passed.
    (sample(2000.0), sample(200.0), Outcome.STABLE_DEGRADED, "p99 TTFT above the SLO's 1000 ms"),
    # A canary above the SLO, better than a worse stable: held, never promoted.
    (sample(5000.0), sample(1800.0), Outcome.STABLE_DEGRADED, "no worse"),
    # Worse than an already degraded stable: rolled back.
    (sample(1800.0), sample(9000.0), Outcome.FAILED, "maxTtftP99RegressionPercent"),
    # Stable failing requests (a cause both share): the canary failing as many is held...
    (sample(failed=5.0), sample(failed=5.0), Outcome.STABLE_DEGRADED, "error rate above maxErrorRatePercent 1%"),
    # ... one failing far more is rolled back.
    (sample(failed=5.0), sample(failed=30.0), Outcome.FAILED, "error rate 30.0%"),
    # Beside a stable revision within its bounds the canary is held to them too: a p99 above the
    # SLO fails it even within the relative margin (its bucket 1000-1250 ms, stable's 800-1000 ms).
    (sample(950.0), sample(1100.0), Outcome.FAILED, "above the SLO's 1000 ms"),
    # Where the buckets cannot tell it from the SLO, it is within it.
    (sample(900.0), sample(990.0), Outcome.SUCCESSFUL, "(+10%)"),
])
def test_a_degraded_stable_revision_holds_the_canary_and_never_makes_it_pass(stable, canary, outcome, words):
    # Both revisions with the bounds 800, 1000, 1250 ms around the SLO, as the cases above read them.
    bounds = HistogramBounds(UNRECORDED_BOUNDS_MS, UNRECORDED_BOUNDS_MS)
    verdict = judge(Samples(stable, canary, 60), GATES, SLO_TTFT_P99_MS, bounds)
    assert verdict.outcome == outcome and words in verdict.message, verdict.message


ANALYSED = (RolloutStep(set_weight=50), ANALYSIS)


def test_a_stable_degraded_verdict_holds_the_step_then_pauses_past_the_deadline():
    steps, decision = at_second_step(50, ANALYSIS, 2)
    held = Verdict(Outcome.STABLE_DEGRADED, "the stable revision breaches its bounds")
    for seconds in (30, 299, 330):  # past the step's duration: a Successful verdict would pass it
        decision = advance(decision.state, steps, seen(2, 2, NOW + timedelta(seconds=seconds), analysis=held))
        assert (decision.state.phase, decision.state.step_index) == (CanaryPhase.PROGRESSING, 1), decision.state
        assert decision.split.canary_replicas == 2 and not decision.events, "held: not rolled back, not moved on"
        assert "StableDegraded" in decision.state.message
    late = NOW + timedelta(seconds=300 + GATES.analysis_deadline_seconds)
    paused = advance(decision.state, steps, seen(2, 2, late, analysis=held))
    assert paused.state.phase == CanaryPhase.PAUSED and "promote or abort by hand" in paused.state.message


def analysed(revision: str, generation: int, status: dict | None = None) -> dict:
    body = manifest_with_steps(revision, generation, status)
    body["spec"]["rollout"]["steps"] = [{"setWeight": 50}, {"analysis": {"durationSeconds": 60,
                                                                         "intervalSeconds": 10}}]
    return body


def test_the_pass_says_the_stable_revision_holds_the_canary_in_progressing_and_a_warning():
    _, warming, children = canary_started(analysed)
    analysing = decide_pass(analysed("v2", 2, warming.status), children, SETTINGS, NOW)
    assert analysing.status["canary"]["stepIndex"] == 1
    stable_revision = analysing.status["stableRevision"]
    degraded = Samples(sample(2000.0), sample(200.0), 60)
    held = decide_pass(analysed("v2", 2, analysing.status), children, SETTINGS, NOW + timedelta(seconds=10),
                       samples=degraded)
    assert held.status["canary"]["analysisVerdict"] == "StableDegraded"
    progressing = condition(held, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", Reason.STABLE_DEGRADED)
    assert f"stable revision {stable_revision} degraded" in progressing["message"]
    assert "p99 TTFT above the SLO's 1000 ms" in progressing["message"]
    assert [(e.type, e.reason) for e in held.events if e.reason == Reason.STABLE_DEGRADED] == [
        ("Warning", Reason.STABLE_DEGRADED)]
    assert condition(held, "Ready")["status"] == "True" and condition(held, "Degraded")["status"] == "False"
    # Stable recovers: the hold ends, and the step passes on a Successful verdict.
    healthy = Samples(sample(200.0), sample(210.0), 60)
    passed = decide_pass(analysed("v2", 2, held.status), children, SETTINGS, NOW + timedelta(seconds=61),
                         samples=healthy)
    assert passed.status["canary"]["phase"] in ("Promoting", "Promoted")
    assert condition(passed, "Progressing")["reason"] != Reason.STABLE_DEGRADED
