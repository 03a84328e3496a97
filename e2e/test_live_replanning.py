"""Live re-planning in the sandbox: the operator observes a serving revision's real traffic
through Prometheus (rate, p99 TTFT, the engine's token-length histograms), learns how fast the
configuration runs, and, with spec.plan.liveReplanning Automatic, serves the plan the observed
workload needs when it departs from spec.workload."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import LLMFLEET, service_target, small_batch_70b, stop_load, temporary_namespace, wait_for, wait_until_ready

pytestmark = pytest.mark.long_running

NAMESPACE = "live-replanning"
DECLARED_PEAK_RPS = 0.5
SENT_RPS = 3
PROMPT_TOKENS = 128


@pytest.fixture(scope="module", autouse=True)
def live_namespace(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        yield NAMESPACE


def _status(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", name, "-n", NAMESPACE).get("status") or {}


def _events(sandbox, name: str) -> list[dict]:
    return sandbox.kubectl_json("get", "events", "-n", NAMESPACE,
                                "--field-selector", f"involvedObject.name={name}")["items"]


def _fitted(sandbox, name: str, revision: str | None = None) -> dict | None:
    """The status once its observation (of `revision`, when given) has a fitted speed."""
    status = _status(sandbox, name)
    observation = status.get("observation") or {}
    return status if observation.get("speedFactor") and revision in (None, observation["revision"]) else None


def test_traffic_beyond_the_declared_peak_is_learned_recommended_and_served_automatically(sandbox, tmp_path):
    manifest = small_batch_70b("drift", NAMESPACE, 2000, plan={"liveReplanning": "Automatic"})
    manifest["spec"]["workload"]["peakRequestsPerSecond"] = DECLARED_PEAK_RPS
    sandbox.apply([manifest], namespace=NAMESPACE)
    wait_until_ready(sandbox, "drift", NAMESPACE)
    planned = _status(sandbox, "drift")
    revision = planned["currentRevision"]
    load = subprocess.Popen(
        [*LLMFLEET, "load", "--target", service_target(sandbox, "drift", NAMESPACE), "--model", "ensemble",
         "--schedule", f"constant:{SENT_RPS}", "--duration-s", "300", "--input-tokens", f"fixed:{PROMPT_TOKENS}",
         "--output-tokens", "fixed:32", "--output-dir", str(tmp_path), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        learned = wait_for(lambda: _fitted(sandbox, "drift"), 180, "an observation with a fitted speed")
        try:
            replanned = wait_for(lambda: next((e for e in _events(sandbox, "drift") if e["reason"] == "Replanned"),
                                              None), 120, "a Replanned event")
        except AssertionError as missing:
            raise AssertionError(f"{missing}; status: {json.dumps(_status(sandbox, 'drift'))}") from None

        def served() -> dict | None:
            s = _status(sandbox, "drift")
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in s.get("conditions") or [])
            return s if (ready and s.get("currentRevision") == s.get("stableRevision")
                         and (s.get("readyReplicas") or 0) >= s["plan"]["replicas"]
                         and s["plan"]["gpusTotal"] > planned["plan"]["gpusTotal"]) else None
        status = wait_for(served, 300, "the replanned deployment rolled out and ready")
        # The new revision's own windows, the first one partly before its pods served, do not
        # send it back: the plan holds the peak it was made for.
        settled = wait_for(lambda: _fitted(sandbox, "drift", status["currentRevision"]), 120,
                           "an observation of the re-planned revision with a fitted speed")
    finally:
        stdout, stderr = stop_load(load)

    # What was observed is the traffic sent: its rate, its prompt lengths (the engine runtime's
    # token-length histograms), and a speed fitted to its p99 TTFT.
    observation = learned["observation"]
    assert observation["revision"] == revision and observation["replicas"] == 1, observation
    assert observation["requestsPerSecond"] > DECLARED_PEAK_RPS * 1.1, observation
    assert observation["inputTokensMean"] == pytest.approx(PROMPT_TOKENS, rel=0.05), observation
    assert observation["outputTokensMean"] <= 32, observation
    assert 0 <= observation["prefixReuseFraction"] < 0.2, observation  # the load's prompts share no prefix
    assert "modelled speed" in observation["message"], observation
    [speed] = [s for s in learned["learnedSpeeds"] if s["model"] == "llama-3.1-70b"]
    assert (speed["gpuType"], speed["quantization"]) == (planned["plan"]["gpuType"], planned["plan"]["quantization"])
    assert speed["requests"] >= observation["requests"]
    # The drift was said, and the plan for the observed rate is what serves now.
    assert "peakRequestsPerSecond 0.5" in replanned["message"], replanned["message"]
    assert status["replicas"] == status["plan"]["replicas"]
    assert any(line.startswith("WorkloadDrift: ") for line in status["plan"]["rationale"]), status["plan"]
    assert status["plan"]["peakRequestsPerSecond"] > DECLARED_PEAK_RPS * 1.1, status["plan"]
    assert "recommendation" not in settled, settled
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 0, (stdout, stderr)


def _events_of(sandbox, name: str, reason: str) -> list[dict]:
    return [e for e in _events(sandbox, name) if e["reason"] == reason]


def test_prompts_grown_longer_are_recommended_a_wider_engine_that_goes_out_as_a_canary(sandbox, tmp_path):
    """Declared short prompts are planned on one H100; the traffic that comes has prompts seven
    times as long, at a rate within the declared peak, for which the planner predicts one GPU's
    prefill misses the p99 TTFT target (500 ms) at that peak: the drift in prompt length alone
    is said, the plan for it is TP2, and Automatic re-planning ships it through the canary
    steps, which promote it. Qwen 2.5 72B, which no other test serves: speeds learned from other
    deployments of a model apply to every plan of it, and would make this one depend on them
    (this one's own windows hold fewer requests than a fit needs)."""
    long_prompt_tokens = 900
    manifest = small_batch_70b("prompts", NAMESPACE, 500, plan={"liveReplanning": "Automatic"},
                               rollout={"steps": [{"setWeight": 50},
                                                  {"analysis": {"durationSeconds": 45, "intervalSeconds": 15}}],
                                        "gates": {"minRequests": 10}})
    manifest["spec"]["model"] = {"name": "qwen2.5-72b", "source": "hf://Qwen/Qwen2.5-72B-Instruct"}
    manifest["spec"]["workload"]["peakRequestsPerSecond"] = 1
    sandbox.apply([manifest], namespace=NAMESPACE)
    planned = wait_until_ready(sandbox, "prompts", NAMESPACE)["status"]
    assert planned["plan"]["tensorParallelSize"] == 1, planned["plan"]
    load = subprocess.Popen(
        [*LLMFLEET, "load", "--target", service_target(sandbox, "prompts", NAMESPACE), "--model", "ensemble",
         "--schedule", "constant:0.8", "--duration-s", "600", "--input-tokens", f"fixed:{long_prompt_tokens}",
         "--output-tokens", "fixed:32", "--output-dir", str(tmp_path), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        [drift] = wait_for(lambda: _events_of(sandbox, "prompts", "WorkloadDrift"), 180, "a WorkloadDrift event")
        promoted = wait_for(lambda: _events_of(sandbox, "prompts", "CanaryPromoted"), 420,
                            "the recommended plan's canary promoted")
    except AssertionError as missing:
        raise AssertionError(f"{missing}; status: {json.dumps(_status(sandbox, 'prompts'))}") from None
    finally:
        stdout, stderr = stop_load(load)

    # The recommendation names the prompt length, not the rate (0.8 req/s is within the peak).
    [observed_mean] = re.findall(r"mean (\d+) tokens observed against spec.workload.inputTokensMean 128",
                                 drift["message"]) or [None]
    assert observed_mean and int(observed_mean) == pytest.approx(long_prompt_tokens, rel=0.05), drift["message"]
    assert "req/s observed" not in drift["message"], drift["message"]
    assert "TP1" in drift["message"] and "-> 1 x H100-SXM-80GB TP2" in drift["message"], drift["message"]
    reasons = [e["reason"] for e in _events(sandbox, "prompts")]
    assert {"Replanned", "CanaryStarted", "CanaryAnalysisSuccessful"} <= set(reasons), reasons
    status = _status(sandbox, "prompts")
    assert status["plan"]["tensorParallelSize"] == 2, status["plan"]
    assert status["stableRevision"] == status["currentRevision"] != planned["currentRevision"], promoted
    assert status["canary"]["phase"] == "Promoted", status["canary"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 0, (stdout, stderr)
