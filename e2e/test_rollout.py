"""Canary rollouts in the sandbox, through the real apiserver, Triton and the service proxy: a
good canary passes its golden prompts, walks its steps and is promoted without a failed request
under load; an aborted one is scaled to zero while the stable revision's pods serve on, never
restarted; a slow, an erroring and a drifting canary are each rolled back by the right gate."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timezone

import pytest

from conftest import (
    fault_the_new_revision,
    L40S_NODE,
    llm_deployment,
    LLMFLEET,
    service_target,
    stop_load,
    temporary_namespace,
    wait_for,
    wait_until_ready,
    watch_phases,
)

pytestmark = pytest.mark.long_running

NAMESPACE = "rollout"


GOLDEN_PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello in French.", "Count to five."]


def manifest(name: str, engine_revision: str, steps: list[dict], quality: dict | None = None) -> dict:
    return llm_deployment(
        name, NAMESPACE, "llama-3.1-8b", engine={"revision": engine_revision},
        slo={"ttftP99Ms": 2000, "tpotP99Ms": 100},
        workload={"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 16, "outputTokensP99": 32,
                  "peakRequestsPerSecond": 1},
        resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 4}, plan={"replicas": 1},
        rollout={"steps": steps, **({"quality": quality} if quality else {})})


@pytest.fixture(scope="module", autouse=True)
def rollout_namespace(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        # Every rendered pod must pass the restricted Pod Security Standard, enforced by the apiserver.
        sandbox.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        yield NAMESPACE


def _deployment(sandbox, name: str) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", name, "-n", NAMESPACE)


def _status(sandbox, name: str) -> dict:
    return _deployment(sandbox, name).get("status") or {}


def _serving(sandbox, name: str, kind: str = "deployments") -> list[dict]:
    return sandbox.kubectl_json("get", kind, "-n", NAMESPACE, "-l",
                                f"llmfleet.io/deployment={name},app.kubernetes.io/component=server")["items"]


def _revision_replicas(sandbox, name: str, revision: str) -> list[int]:
    """spec.replicas of each serving Deployment of `revision` (one, unless pruned or duplicated)."""
    return [d["spec"]["replicas"] for d in _serving(sandbox, name)
            if d["metadata"]["labels"]["llmfleet.io/revision"] == revision]


def _load(sandbox, name: str, rate: int, seconds: int, output) -> subprocess.Popen:
    return subprocess.Popen(
        [*LLMFLEET, "load", "--target", service_target(sandbox, name, NAMESPACE), "--schedule", f"constant:{rate}",
         "--duration-s", str(seconds), "--input-tokens", "fixed:128", "--output-tokens", "fixed:16",
         "--output-dir", str(output), "--quiet"], env=sandbox.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def _new_engine_revision(sandbox, name: str, engine_revision: str = "v2") -> None:
    sandbox.kubectl("patch", "llmdeployment", name, "-n", NAMESPACE, "--type=merge",
                    "-p", json.dumps({"spec": {"engine": {"revision": engine_revision}}}))


def test_a_good_canary_walks_its_steps_and_is_promoted_without_a_failed_request(sandbox, tmp_path):
    steps = [{"setWeight": 50}, {"pause": {"durationSeconds": 10}}]
    sandbox.apply([manifest("good", "v1", steps, {"prompts": GOLDEN_PROMPTS})], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "good", NAMESPACE)["status"]["currentRevision"]
    load = _load(sandbox, "good", 2, 100, tmp_path)
    try:
        _new_engine_revision(sandbox, "good")
        phases = watch_phases(sandbox, "good", NAMESPACE, "Promoted", 240)
    finally:
        stdout, stderr = load.communicate(timeout=300)
    assert phases[0] == "Preparing" and "Progressing" in phases and phases[-1] == "Promoted", phases
    status = _status(sandbox, "good")
    # The same weights with lossless numerics answer alike, whatever the engine revision.
    assert status["canary"]["qualityVerdict"] == "Successful", status["canary"]
    assert "exact match 100%" in status["canary"]["qualityMessage"]
    assert status["stableRevision"] == status["currentRevision"] != stable
    wait_for(lambda: [d["metadata"]["labels"]["llmfleet.io/revision"] for d in _serving(sandbox, "good")]
             == [status["currentRevision"]], 60, "the old revision's Deployment to go")
    assert load.returncode == 0, stderr + stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["truncated"] == 0 and summary["completed"] == summary["requests"]


def test_an_aborted_canary_goes_to_zero_and_stable_pods_serve_on_untouched(sandbox, operator):
    steps = [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}]
    sandbox.apply([manifest("held", "v1", steps)], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "held", NAMESPACE)["status"]["currentRevision"]
    pods_before = sorted((p["metadata"]["uid"], p["status"]["containerStatuses"][0]["restartCount"])
                         for p in _serving(sandbox, "held", "pods"))
    assert pods_before, "no serving pod of the stable revision"
    _new_engine_revision(sandbox, "held")
    watch_phases(sandbox, "held", NAMESPACE, "Paused", 240)
    paused = _status(sandbox, "held")["canary"]
    assert paused["weightPercent"] == 50

    # Killed while paused, the operator resumes from status: same phase and step clock, no new pods.
    pods_paused = sorted(p["metadata"]["uid"] for p in _serving(sandbox, "held", "pods"))
    assert len(pods_paused) == 2, "a stable and a canary pod at setWeight 50"
    operator.stop(signal.SIGKILL)
    operator.start()
    time.sleep(15)  # resume, then timer ticks
    assert _status(sandbox, "held")["canary"] == paused
    assert sorted(p["metadata"]["uid"] for p in _serving(sandbox, "held", "pods")) == pods_paused

    aborted = subprocess.run([*LLMFLEET, "rollout", "abort", "held", "-n", NAMESPACE], env=sandbox.env,
                             capture_output=True, text=True, timeout=60)
    assert aborted.returncode == 0, aborted.stderr
    watch_phases(sandbox, "held", NAMESPACE, "RolledBack", 60)
    status = _status(sandbox, "held")
    assert status["stableRevision"] == stable and stable in status["canary"]["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "CanaryRolledBack")
    canary = status["currentRevision"]
    wait_for(lambda: _revision_replicas(sandbox, "held", canary) == [0], 30, "the canary's Deployment at zero")
    pods_after = sorted((p["metadata"]["uid"], p["status"]["containerStatuses"][0]["restartCount"])
                        for p in _serving(sandbox, "held", "pods")
                        if p["metadata"]["labels"]["llmfleet.io/revision"] == stable)
    assert pods_after == pods_before, "the stable revision's pods were never replaced or restarted"
    shown = subprocess.run([*LLMFLEET, "rollout", "status", "held", "-n", NAMESPACE], env=sandbox.env,
                           capture_output=True, text=True, timeout=60)
    assert "RolledBack" in shown.stdout and canary in shown.stdout


def _ready_pods_by_revision(sandbox, name: str) -> dict[str, int]:
    ready: dict[str, int] = {}
    for pod in _serving(sandbox, name, "pods"):
        if any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or []):
            revision = pod["metadata"]["labels"]["llmfleet.io/revision"]
            ready[revision] = ready.get(revision, 0) + 1
    return ready


def test_the_autoscaler_resizing_stable_during_a_paused_step_keeps_the_canarys_share(sandbox):
    """The autoscaler sizes the stable revision; a scale-up while the canary waits in a pause
    step reaches stable's Deployment and the canary alike, so replicas, ready pods, status and
    the route keep the step's 50 %. The scale-up comes from raising minReplicas (the
    autoscaler's own floor), not from load: quicker, and the same path from its count on."""
    body = manifest("scaled", "v1", [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}])
    del body["spec"]["plan"]
    body["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 2}
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference"}]}}
    sandbox.apply([body], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "scaled", NAMESPACE)["status"]["currentRevision"]
    _new_engine_revision(sandbox, "scaled")
    watch_phases(sandbox, "scaled", NAMESPACE, "Paused", 240)
    canary = _status(sandbox, "scaled")["currentRevision"]
    assert _revision_replicas(sandbox, "scaled", stable) == [1] and _revision_replicas(sandbox, "scaled", canary) == [1]

    sandbox.kubectl("patch", "llmdeployment", "scaled", "-n", NAMESPACE, "--type=merge",
                    "-p", '{"spec": {"autoscaling": {"minReplicas": 2}}}')
    wait_for(lambda: (_revision_replicas(sandbox, "scaled", stable), _revision_replicas(sandbox, "scaled", canary))
             == ([2], [2]), 60, "stable's and the canary's Deployments at 2 replicas each")
    wait_for(lambda: _ready_pods_by_revision(sandbox, "scaled") == {stable: 2, canary: 2}, 180,
             "two ready pods of each revision")
    status = _status(sandbox, "scaled")
    assert status["replicas"] == 2 and status["currentRevision"] == canary, status
    held = status["canary"]
    assert (held["phase"], held["stepIndex"], held["canaryReplicas"], held["weightPercent"]) == ("Paused", 1, 2, 50), held
    route = sandbox.kubectl_json("get", "httproute", "scaled", "-n", NAMESPACE)
    assert {ref["name"]: ref["weight"] for ref in route["spec"]["rules"][0]["backendRefs"]} == {
        f"scaled-{stable}-backend": 50, f"scaled-{canary}-backend": 50}
    sandbox.kubectl("delete", "llmdeployment", "scaled", "-n", NAMESPACE)


def test_a_drifting_canary_fails_its_golden_prompts_before_any_step(sandbox):
    """Normal latency, different answers: only the quality gate can see it. The golden prompts
    come from a ConfigMap, one per line."""
    steps = [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}]
    sandbox.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "golden", "namespace": NAMESPACE},
                    "data": {"prompts.txt": "\n".join(GOLDEN_PROMPTS) + "\n"}},
                   manifest("drift", "v1", steps, {"promptsFrom": {"name": "golden", "key": "prompts.txt"},
                                                   "maxTokens": 16})], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "drift", NAMESPACE)["status"]["currentRevision"]
    canary = fault_the_new_revision(sandbox, "drift", NAMESPACE, "v2", "--drift", "0.2")
    phases = watch_phases(sandbox, "drift", NAMESPACE, "RolledBack", 240)
    assert "Progressing" not in phases and "Paused" not in phases, phases
    status = _status(sandbox, "drift")
    assert status["canary"]["qualityVerdict"] == "Failed", status["canary"]
    assert "quality gate failed" in status["canary"]["message"] and "where stable answered" in status["canary"]["message"]
    assert status["canary"]["failedRevisions"] == [canary] and status["stableRevision"] == stable
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    wait_for(lambda: _revision_replicas(sandbox, "drift", canary) == [0], 30, "the canary's Deployment at zero")


@pytest.mark.parametrize(("name", "runtime", "fault", "gate"), [
    # The latency gates: the p99's, or the mean's where the p99s share neighbouring buckets.
    ("slow", "llmapi", ("--slowdown", "2"), "exceeds maxTtft"),
    # The engine runtime: Triton counts failures at its ensemble, none for a decoupled Python
    # model, so the LLM-API runtime's error rate is not observable.
    ("erroring", "engine", ("--error-percent", "20"), "exceeds maxErrorRatePercent"),
])
def test_a_bad_canary_fails_its_analysis_and_is_rolled_back_while_stable_serves(sandbox, tmp_path, name, runtime,
                                                                                 fault, gate):
    """The sandbox makes the new revision's engines slow or failing (a runtime fault, not an API
    field): the metric gate compares them with stable over the same window and rolls back."""
    steps = [{"setWeight": 50}, {"analysis": {"durationSeconds": 60, "intervalSeconds": 10}}]
    body = manifest(name, "v1", steps)
    body["spec"]["engine"]["runtime"] = runtime
    sandbox.apply([body], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, name, NAMESPACE)["status"]["currentRevision"]
    load = _load(sandbox, name, 3, 150, tmp_path)
    try:
        fault_the_new_revision(sandbox, name, NAMESPACE, "v2", *fault)
        phases = watch_phases(sandbox, name, NAMESPACE, "RolledBack", 240)
    finally:
        stdout, stderr = stop_load(load)
    assert "Promoted" not in phases and "Progressing" in phases, phases
    canary_status = _status(sandbox, name)["canary"]
    assert canary_status["analysisVerdict"] == "Failed", canary_status
    assert gate in canary_status["analysisMessage"]
    assert _status(sandbox, name)["stableRevision"] == stable
    if name == "slow":  # slow is not failing: no request fails meanwhile
        assert load.returncode == 0, stderr + stdout


def test_canary_pods_that_cannot_be_scheduled_are_rolled_back_with_the_schedulers_reason(sandbox):
    """The new revision's plan moves to the L40S node, whose taint (say, another team's) the
    planner does not see and the pods do not tolerate: they stay Pending, and past
    canaryReadyDeadlineSeconds the canary is rolled back, quoting the scheduler."""
    body = manifest("pending", "v1", [{"setWeight": 50}])
    body["spec"]["rollout"]["gates"] = {"canaryReadyDeadlineSeconds": 20}
    sandbox.apply([body], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "pending", NAMESPACE)["status"]["currentRevision"]
    taint = "team=research:NoSchedule"
    sandbox.kubectl("taint", "node", L40S_NODE, taint)
    try:
        sandbox.kubectl("patch", "llmdeployment", "pending", "-n", NAMESPACE, "--type=merge",
                        "-p", '{"spec": {"resources": {"allowedGpuTypes": ["L40S-48GB"]}}}')
        phases = watch_phases(sandbox, "pending", NAMESPACE, "RolledBack", 240)
    finally:
        sandbox.kubectl("taint", "node", L40S_NODE, f"{taint}-")
    assert "Warming" in phases and "Progressing" not in phases, phases
    status = _status(sandbox, "pending")
    assert "canaryReadyDeadlineSeconds" in status["canary"]["message"]
    pods = [(p["metadata"]["name"], p["status"]) for p in _serving(sandbox, "pending", "pods")]
    assert "Unschedulable" in status["canary"]["message"] and "0/" in status["canary"]["message"], (status["canary"],
                                                                                                   pods)
    assert status["stableRevision"] == stable
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"


def test_an_operator_killed_in_each_phase_resumes_with_no_duplicate_pods_lost_step_or_reset_clock(
        sandbox, operator, tmp_path):
    """SIGKILL at the first sight of each phase and step: the rollout goes on from status alone."""
    steps = [{"setWeight": 50}, {"pause": {"durationSeconds": 20}},
             {"analysis": {"durationSeconds": 20, "intervalSeconds": 10}}]
    body = manifest("restarts", "v1", steps, {"prompts": GOLDEN_PROMPTS[:2], "maxTokens": 8})
    # The canary is the same engine, so only noise could fail its analysis, and this test makes
    # noise: each restart's start-up burst takes a core of this machine while 8B TTFTs are tens
    # of milliseconds, and p99 of a few dozen requests is their maximum, so its margin is wide.
    # The mean gate keeps its default: a same-engine canary must pass it through the restarts.
    # (A CI rollback of this canary at mean +194 % was the slow test's fault reaching it: faults
    # were keyed by revision alone and both deployments share one; an earlier p99 of 71 vs
    # 25 ms probably was too.)
    body["spec"]["rollout"]["gates"] = {"minRequests": 5, "maxTtftP99RegressionPercent": 1000}
    sandbox.apply([body], namespace=NAMESPACE)
    wait_until_ready(sandbox, "restarts", NAMESPACE)
    load = _load(sandbox, "restarts", 2, 240, tmp_path)
    killed: list[tuple[str, int]] = []
    try:
        # An engine revision of its own: "v2" of the same model and plan may already be in the
        # engine cache (another test built it), and then Preparing can end between two polls.
        _new_engine_revision(sandbox, "restarts", "v2-restarts")
        deadline = time.monotonic() + 360
        while time.monotonic() < deadline:
            canary = _status(sandbox, "restarts").get("canary") or {}
            where = (canary.get("phase"), canary.get("stepIndex", 0))
            if where[0] == "Promoted":
                break
            if where[0] and where not in killed:
                killed.append(where)
                operator.stop(signal.SIGKILL)
                # The dead operator's last write: whatever changes the object from here on, the
                # restarted operator wrote after a pass of its own.
                before = _deployment(sandbox, "restarts")
                operator.start()
                after = wait_for(lambda: (now := _deployment(sandbox, "restarts"))["metadata"]["resourceVersion"]
                                 != before["metadata"]["resourceVersion"] and now, 120,
                                 "the restarted operator's first write")["status"]["canary"]
                # Same step or later, and a step that is still running kept its start time.
                was = before["status"]["canary"]
                if (after["phase"], after.get("stepIndex", 0)) == (was["phase"], was.get("stepIndex", 0)):
                    assert after["stepStartedTime"] == was["stepStartedTime"], (was, after)
            time.sleep(0.5)
        else:
            raise AssertionError(f"not promoted; killed at {killed}; canary: "
                                 f"{(_status(sandbox, 'restarts').get('canary') or {}).get('message')}")
    finally:
        stdout, stderr = stop_load(load)
    assert {"Preparing", "Warming", "Progressing"} <= {phase for phase, _ in killed}, killed
    assert {("Progressing", 1), ("Progressing", 2)} <= set(killed), killed
    status = _status(sandbox, "restarts")
    assert status["canary"]["qualityVerdict"] == "Successful"
    revision = status["currentRevision"]
    wait_for(lambda: [d["metadata"]["labels"]["llmfleet.io/revision"] for d in _serving(sandbox, "restarts")]
             == [revision], 60, "the old revision's Deployment to go")
    replica_sets = sandbox.kubectl_json("get", "replicasets", "-n", NAMESPACE, "-l",
                                        f"llmfleet.io/deployment=restarts,llmfleet.io/revision={revision}")["items"]
    assert len(replica_sets) == 1, "the canary's pod template never changed across restarts"
    wait_for(lambda: len(_serving(sandbox, "restarts", "pods")) == 1, 60, "one pod: no duplicates left behind")
    assert load.returncode == 0, stderr + stdout


def test_prometheus_down_mid_analysis_holds_the_canary_until_it_returns(sandbox, tmp_path):
    """No metrics is no verdict: the canary is neither promoted nor rolled back while Prometheus
    is down, and says why; it goes on when Prometheus is back."""
    steps = [{"setWeight": 50}, {"analysis": {"durationSeconds": 30, "intervalSeconds": 10}}]
    body = manifest("outage", "v1", steps)
    # The canary is the same engine; Prometheus' restart takes a core of this machine while 8B
    # TTFTs are tens of milliseconds, so the p99 (a few dozen requests' maximum) gets a wide
    # margin; the mean gate keeps its default. The TTFT gates are tested by the slow canary;
    # here the hold and the resumption are. (A CI rollback of this canary at mean +176 % was the
    # slow test's fault reaching it, as in the restart test.)
    body["spec"]["rollout"]["gates"] = {"maxTtftP99RegressionPercent": 1000}
    sandbox.apply([body], namespace=NAMESPACE)
    wait_until_ready(sandbox, "outage", NAMESPACE)
    load = _load(sandbox, "outage", 2, 200, tmp_path)
    try:
        _new_engine_revision(sandbox, "outage")
        wait_for(lambda: (_status(sandbox, "outage").get("canary") or {}).get("stepIndex") == 1, 180,
                 "the analysis step")
        sandbox.stop_component("prometheus")
        try:
            held = wait_for(lambda: (canary := _status(sandbox, "outage")["canary"]).get("analysisVerdict") == "Error"
                            and canary, 60, "an Error verdict")
            time.sleep(40)  # past the step's duration: a Successful verdict would have passed it
            canary = _status(sandbox, "outage")["canary"]
            assert (canary["phase"], canary["stepIndex"]) == ("Progressing", 1), canary
            assert "Prometheus" in held["analysisMessage"]
            progressing = {c["type"]: c for c in _status(sandbox, "outage")["conditions"]}["Progressing"]
            assert "Error" in progressing["message"], progressing
        finally:
            sandbox.llmfleet("up")  # starts only the stopped Prometheus
        phases = watch_phases(sandbox, "outage", NAMESPACE, "Promoted", 180)
    finally:
        stdout, stderr = stop_load(load)
    assert "RolledBack" not in phases, phases
    assert load.returncode == 0, stderr + stdout


def test_a_stable_revision_degrading_mid_analysis_holds_the_canary_then_pauses_it(sandbox, tmp_path):
    """The stable revision's running engines slow down while a same-engine canary is in an
    analysis step under load (a throttled GPU, a noisy neighbour: the sandbox's slowdown reaches
    running pods, keyed by revision so not the canary's): the canary is no worse, which does not
    make it good. It is neither promoted nor rolled back: the step holds past its duration with
    StableDegraded, Progressing names the stable revision, a Warning event says so, and past
    analysisDeadlineSeconds it pauses for a person. Ready stays True (docs/rollouts.md, "When the
    stable revision degrades during a canary")."""
    duration_s, deadline_s = 30, 20
    steps = [{"setWeight": 50}, {"analysis": {"durationSeconds": duration_s, "intervalSeconds": 10}}]
    body = manifest("degrading", "v1", steps)
    # 8B TTFTs are 9-17 ms here (a prefill step after up to one 7.4 ms decode step): a stable
    # revision 40 times slower is surely above a 200 ms SLO, a healthy canary surely within it.
    body["spec"]["slo"]["ttftP99Ms"] = 200
    body["spec"]["rollout"]["gates"] = {"analysisDeadlineSeconds": deadline_s}
    sandbox.apply([body], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "degrading", NAMESPACE)["status"]["currentRevision"]
    load = _load(sandbox, "degrading", 3, 400, tmp_path)
    phases: list[str] = []

    def canary_status() -> dict:
        status = _status(sandbox, "degrading")
        canary = status.get("canary") or {}
        if canary.get("phase") and (not phases or phases[-1] != canary["phase"]):
            phases.append(canary["phase"])
        return {**canary, "conditions": {c["type"]: c for c in status["conditions"]},
                "stableRevision": status["stableRevision"]}

    try:
        _new_engine_revision(sandbox, "degrading")
        at_analysis = wait_for(lambda: (canary := canary_status()).get("stepIndex") == 1 and canary, 240,
                               "the analysis step")
        sandbox.llmfleet("fault", "--namespace", NAMESPACE, "--deployment", "degrading", "--revision", stable,
                         "--slowdown", "40")
        try:
            # A canary promoted or rolled back instead ends the wait too, and shows how.
            degraded = wait_for(lambda: ((canary := canary_status()).get("analysisVerdict") == "StableDegraded"
                                         or canary.get("phase") in ("Promoted", "RolledBack")) and canary, 60,
                                "a StableDegraded verdict")
            assert degraded["phase"] == "Progressing", (phases, degraded)
            stable_pods = _ready_pods_by_revision(sandbox, "degrading")
            step_started = datetime.fromisoformat(at_analysis["stepStartedTime"].replace("Z", "+00:00"))
            wait_for(lambda: (datetime.now(timezone.utc) - step_started).total_seconds() > duration_s + 5,
                     duration_s + 10, "the step's duration to pass", interval=1)
            held = canary_status()
            assert (held["phase"], held["stepIndex"], held["analysisVerdict"]) == \
                ("Progressing", 1, "StableDegraded"), held
            assert "the stable revision breaches its bounds (p99 TTFT above the SLO's 200 ms)" \
                in held["analysisMessage"], held
            progressing = held["conditions"]["Progressing"]
            assert (progressing["reason"], progressing["status"]) == ("StableDegraded", "True"), progressing
            assert f"stable revision {stable} degraded" in progressing["message"], progressing
            assert held["conditions"]["Ready"]["status"] == "True"
            warnings = [e for e in sandbox.kubectl_json("get", "events", "-n", NAMESPACE, "--field-selector",
                                                        "involvedObject.name=degrading")["items"]
                        if (e["type"], e["reason"]) == ("Warning", "StableDegraded")]
            assert warnings and stable in warnings[0]["message"], warnings
            paused = wait_for(lambda: (canary := canary_status())["phase"] == "Paused" and canary,
                              deadline_s + 30, "the pause past analysisDeadlineSeconds", interval=1)
        finally:
            sandbox.llmfleet("fault", "--namespace", NAMESPACE, "--deployment", "degrading", "--revision", stable)
    finally:
        stdout, stderr = stop_load(load)
    assert phases[-1] == "Paused" and "Promoted" not in phases and "RolledBack" not in phases, phases
    assert paused["stepIndex"] == 1 and paused["analysisVerdict"] == "StableDegraded", paused
    assert f"analysis without a verdict {deadline_s} s past its duration (StableDegraded" in paused["message"]
    assert paused["stableRevision"] == stable and not paused.get("failedRevisions"), paused
    assert paused["conditions"]["Progressing"]["reason"] == "StableDegraded", paused["conditions"]
    assert paused["conditions"]["Ready"]["status"] == "True"
    assert _ready_pods_by_revision(sandbox, "degrading") == stable_pods, "the held canary's replicas changed"
    # The stable revision served slowly, and served: no request failed.
    assert load.returncode == 0, stderr + stdout


def test_inference_pools_per_revision_are_accepted_and_the_route_weights_them(sandbox):
    """spec.routing.inferencePool: the real InferencePool CRD (v1.5.0, installed by the sandbox)
    accepts each revision's pool, the HTTPRoute weights the pools, and the endpoint picker's
    objects pass the namespace's restricted Pod Security. The sandbox maps no picker image, so
    its pod waits with ErrImagePull, as on a node that cannot pull it: serving does not depend
    on it."""
    body = manifest("pooled", "v1", [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}])
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference"}]}, "inferencePool": {}}
    sandbox.apply([body], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "pooled", NAMESPACE)["status"]["currentRevision"]

    def backends() -> dict[str, tuple[str, int]]:
        route = sandbox.kubectl_json("get", "httproute", "pooled", "-n", NAMESPACE)
        return {ref["name"]: (ref["kind"], ref["weight"]) for ref in route["spec"]["rules"][0]["backendRefs"]}

    wait_for(lambda: backends() == {f"pooled-{stable}": ("InferencePool", 100)}, 30, "all weight on stable's pool")
    pool = sandbox.kubectl_json("get", "inferencepool", f"pooled-{stable}", "-n", NAMESPACE)
    pods = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", ",".join(
        f"{key}={value}" for key, value in pool["spec"]["selector"]["matchLabels"].items()))["items"]
    assert len(pods) == 1 and pods[0]["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
    picker = pool["spec"]["endpointPickerRef"]["name"]
    sandbox.kubectl_json("get", "service", picker, "-n", NAMESPACE)
    picker_pod = wait_for(lambda: sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                                                       "app.kubernetes.io/component=endpoint-picker,"
                                                       "llmfleet.io/deployment=pooled")["items"], 60, "the picker's pod")[0]
    assert picker_pod["spec"]["serviceAccountName"] == "llmfleet-endpoint-picker"
    binding = sandbox.kubectl_json("get", "rolebinding", "llmfleet-endpoint-picker", "-n", NAMESPACE)
    assert binding["roleRef"]["name"] == "llmfleet-endpoint-picker"

    _new_engine_revision(sandbox, "pooled")
    watch_phases(sandbox, "pooled", NAMESPACE, "Paused", 240)
    canary = _status(sandbox, "pooled")["currentRevision"]
    assert backends() == {f"pooled-{stable}": ("InferencePool", 50), f"pooled-{canary}": ("InferencePool", 50)}
    assert len(sandbox.kubectl_json("get", "inferencepools", "-n", NAMESPACE, "-l",
                                    "llmfleet.io/deployment=pooled")["items"]) == 2

    # Pools switched off: the operator prunes pools and pickers; the route goes back to Services.
    sandbox.kubectl("patch", "llmdeployment", "pooled", "-n", NAMESPACE, "--type=json",
                    "-p", '[{"op": "remove", "path": "/spec/routing/inferencePool"}]')

    def pools_gone():
        left = sandbox.kubectl_json("get", "inferencepools,deployments", "-n", NAMESPACE, "-l",
                                    "llmfleet.io/deployment=pooled,app.kubernetes.io/component in "
                                    "(inference-pool,endpoint-picker)")["items"]
        return not left and {kind for kind, _ in backends().values()} == {"Service"}
    wait_for(pools_gone, 60, "the pools and pickers pruned, the route on the revisions' Services")
    sandbox.kubectl("delete", "llmdeployment", "pooled", "-n", NAMESPACE)


def test_an_http_route_splits_by_the_canarys_share_and_the_apiserver_accepts_it(sandbox):
    """Gateway API routing: the real upstream CRDs (installed by the sandbox) validate the
    HTTPRoute; its backends are the revisions' own Services."""
    body = manifest("routed", "v1", [{"setWeight": 50}, {"pause": {"durationSeconds": 0}}])
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference", "sectionName": "http"}]}}
    sandbox.apply([body], namespace=NAMESPACE)
    stable = wait_until_ready(sandbox, "routed", NAMESPACE)["status"]["currentRevision"]

    def backends() -> dict[str, int]:
        route = sandbox.kubectl_json("get", "httproute", "routed", "-n", NAMESPACE)
        return {ref["name"]: ref["weight"] for ref in route["spec"]["rules"][0]["backendRefs"]}

    wait_for(lambda: backends() == {f"routed-{stable}-backend": 100}, 30, "all weight on stable")
    _new_engine_revision(sandbox, "routed")
    watch_phases(sandbox, "routed", NAMESPACE, "Paused", 240)
    canary = _status(sandbox, "routed")["currentRevision"]
    assert backends() == {f"routed-{stable}-backend": 50, f"routed-{canary}-backend": 50}
    for revision in (stable, canary):
        service = sandbox.kubectl_json("get", "service", f"routed-{revision}-backend", "-n", NAMESPACE)
        assert service["spec"]["selector"]["llmfleet.io/revision"] == revision
    aborted = subprocess.run([*LLMFLEET, "rollout", "abort", "routed", "-n", NAMESPACE], env=sandbox.env,
                             capture_output=True, text=True, timeout=60)
    assert aborted.returncode == 0, aborted.stderr
    watch_phases(sandbox, "routed", NAMESPACE, "RolledBack", 60)
    wait_for(lambda: backends() == {f"routed-{stable}-backend": 100, f"routed-{canary}-backend": 0}, 30,
             "weight back on stable")

    # Routing switched off: the route and the revisions' own Services go, the Service stays.
    sandbox.kubectl("patch", "llmdeployment", "routed", "-n", NAMESPACE, "--type=json",
                    "-p", '[{"op": "remove", "path": "/spec/routing"}]')

    def routing_gone():
        services = sandbox.kubectl_json("get", "services", "-n", NAMESPACE, "-l", "llmfleet.io/deployment=routed")
        route = sandbox.kubectl("get", "httproute", "routed", "-n", NAMESPACE, check=False)
        return "NotFound" in route and [s["metadata"]["name"] for s in services["items"]] == ["routed"]
    wait_for(routing_gone, 60, "the HTTPRoute and the per-revision Services to be deleted")
