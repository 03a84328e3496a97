"""The reconcile decision, without a cluster: children, replicas, pruning,
conditions and events from the stored object and its children."""

from __future__ import annotations

import copy
from datetime import timedelta

from reconcile_builders import (
    NOW, SETTINGS, body, by_kind, condition, decide_pass, finished_job, ready_deployment)



def test_first_pass_creates_every_child_with_no_serving_replicas_until_built():
    outcome = decide_pass(body(), [], SETTINGS, NOW)
    assert sorted(m["kind"] for m in outcome.apply) == [
        "ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service"]
    assert by_kind(outcome.apply, "Deployment")["spec"]["replicas"] == 0
    assert condition(outcome, "Planned")["status"] == "True"
    assert condition(outcome, "EngineBuilt")["status"] == "False"
    assert condition(outcome, "Ready")["status"] == "False"
    assert outcome.status["plan"]["summary"]
    assert outcome.status["selector"] == "llmfleet.io/deployment=chat"
    assert outcome.delete == []
    # The namespace's engine cache claim is created when missing, never applied over.
    (claim,) = outcome.ensure
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["namespace"] == "serving"
    assert claim not in outcome.apply


def test_built_engine_scales_the_deployment_to_the_plan():
    first = decide_pass(body(), [], SETTINGS, NOW)
    children = [finished_job(by_kind(first.apply, "Job"))]
    outcome = decide_pass(body(), children, SETTINGS, NOW)
    assert by_kind(outcome.apply, "Deployment")["spec"]["replicas"] == outcome.status["replicas"] >= 1
    assert condition(outcome, "EngineBuilt")["status"] == "True"
    assert condition(outcome, "Progressing")["reason"] == "RollingOut"


def test_zero_pinned_replicas_stop_serving_once_built_and_ready_says_so():
    # `kubectl scale --replicas=0`: the configuration is still planned and built, nothing serves.
    stopped = body()
    stopped["spec"]["plan"] = {"replicas": 0}
    first = decide_pass(stopped, [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    outcome = decide_pass({**stopped, "status": first.status}, [built], SETTINGS, NOW)
    assert by_kind(outcome.apply, "Deployment")["spec"]["replicas"] == outcome.status["replicas"] == 0
    assert condition(outcome, "EngineBuilt")["status"] == "True"
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero"), ready


def test_failed_build_sets_a_condition_with_the_job_reason():
    first = decide_pass(body(), [], SETTINGS, NOW)
    children = [finished_job(by_kind(first.apply, "Job"), "Failed", "BackoffLimitExceeded")]
    outcome = decide_pass(body(), children, SETTINGS, NOW)
    built = condition(outcome, "EngineBuilt")
    assert (built["status"], built["reason"]) == ("False", "BuildFailed")
    assert "BackoffLimitExceeded" in built["message"]
    assert condition(outcome, "Degraded")["status"] == "True"
    assert by_kind(outcome.apply, "Deployment")["spec"]["replicas"] == 0


def test_a_build_retried_after_failed_attempts_says_so_while_it_retries():
    first = decide_pass(body(), [], SETTINGS, NOW)
    job = copy.deepcopy(by_kind(first.apply, "Job"))
    job["status"] = {"failed": 2, "active": 1}
    built = condition(decide_pass(body(), [job], SETTINGS, NOW), "EngineBuilt")
    assert (built["status"], built["reason"]) == ("False", "Building")
    assert built["message"].endswith(
        f"2 attempts failed, retried with the Job's backoff (backoffLimit {job['spec']['backoffLimit']})")


def failed_build_pod(name: str, finished_at: str, log_tail: str) -> dict:
    return {"metadata": {"name": name}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "engine-build", "state": {"terminated": {"exitCode": 1, "reason": "Error",
                                                          "finishedAt": finished_at, "message": log_tail}}}]}}


def test_a_failing_build_quotes_what_its_last_failed_pod_said():
    from llmfleet.reconcile import Context
    from llmfleet.reconcile.due import failing_build
    from llmfleet.reconcile.pods import last_build_failure

    first = decide_pass(body(), [], SETTINGS, NOW)
    job = copy.deepcopy(by_kind(first.apply, "Job"))
    job["status"] = {"failed": 1, "active": 1}
    assert failing_build(Context.of(body(status=first.status), [job], SETTINGS, NOW)) == first.status["currentRevision"]
    assert failing_build(Context.of(body(status=first.status), [by_kind(first.apply, "Job")], SETTINGS, NOW)) is None  # no failure yet
    earlier = failed_build_pod("b-1", "2026-12-03T10:00:00Z", "Traceback (most recent call last):\n  ...\n"
                               "ValueError: an older problem\n")
    latest = failed_build_pod("b-2", "2026-12-03T10:05:00Z", "[TRT-LLM] [I] building engines: 99%\n"
                              "OSError: [Errno 28] No space left on device: '/engine-cache/x/rank0.engine'\n")
    said = last_build_failure([earlier, latest])
    assert said == ("pod b-2 container engine-build exited with code 1: "
                    "OSError: [Errno 28] No space left on device: '/engine-cache/x/rank0.engine'")
    retrying = condition(decide_pass(body(status=first.status), [job], SETTINGS, NOW, build_failure=said), "EngineBuilt")
    assert retrying["message"].endswith(f"(backoffLimit {job['spec']['backoffLimit']}); last failure: {said}")
    failed = finished_job(by_kind(first.apply, "Job"), "Failed", "BackoffLimitExceeded")
    assert condition(decide_pass(body(status=first.status), [failed], SETTINGS, NOW, build_failure=said),
                     "EngineBuilt")["message"].endswith(f"; last failure: {said}")


def test_a_healthy_build_and_rollout_tell_only_normal_events():
    """Progress and success are Normal: warnings are for what needs a look."""
    passes = [decide_pass(body(), [], SETTINGS, NOW)]
    job = by_kind(passes[0].apply, "Job")
    passes.append(decide_pass(body(status=passes[-1].status), [job], SETTINGS, NOW))  # Building
    built = finished_job(job)
    passes.append(decide_pass(body(status=passes[-1].status), [built], SETTINGS, NOW))
    serving = ready_deployment(by_kind(passes[-1].apply, "Deployment"), passes[-1].status["replicas"])
    passes.append(decide_pass(body(status=passes[-1].status), [built, serving], SETTINGS, NOW))  # RolledOut
    told = {(event.type, event.reason) for outcome in passes for event in outcome.events}
    assert {"BuildPending", "Building", "EngineReady", "RolledOut", "Serving"} <= {reason for _, reason in told}
    # A deployment without ready replicas yet says so (the same reasons tell of replicas lost later).
    assert {reason for kind, reason in told if kind == "Warning"} == {"ReplicasNotReady"}


def test_ready_replicas_make_it_ready_and_events_report_transitions():
    first = decide_pass(body(), [], SETTINGS, NOW)
    # A new deployment's build holds several conditions at one reason: each reason is told once.
    reasons = [(e.type, e.reason) for e in first.events]
    building = [c for c in first.status["conditions"] if c["reason"] == "BuildPending"]
    assert len(building) > 1 and len(reasons) == len(set(reasons))
    assert next(e for e in first.events if e.reason == "BuildPending").message == building[0]["message"]
    built = finished_job(by_kind(first.apply, "Job"))
    second = decide_pass(body(status=first.status), [built], SETTINGS, NOW)
    serving = ready_deployment(by_kind(second.apply, "Deployment"), second.status["replicas"])
    later = NOW + timedelta(seconds=30)
    third = decide_pass(body(status=second.status), [built, serving], SETTINGS, later)
    ready = condition(third, "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"] == later.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ("Normal", "Serving") in [(e.type, e.reason) for e in third.events]
    # Nothing changed: no events, transition times kept.
    fourth = decide_pass(body(status=third.status), [built, serving], SETTINGS, later + timedelta(seconds=5))
    assert fourth.events == []
    assert condition(fourth, "Ready")["lastTransitionTime"] == ready["lastTransitionTime"]


def test_a_first_revision_is_ready_once_all_its_replicas_are_not_at_the_first():
    """Ready is derived from Planned and WorkloadAvailable: on the first roll-out nothing serves
    until the revision has rolled out (all replicas ready), and Ready says why in the words of
    WorkloadAvailable."""
    def pinned(status: dict | None = None) -> dict:
        two_replicas = body(status=status)
        two_replicas["spec"]["plan"] = {"replicas": 2}
        return two_replicas
    first = decide_pass(pinned(), [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    second = decide_pass(pinned(first.status), [built], SETTINGS, NOW)
    desired = second.status["replicas"]
    assert desired == 2
    deployment = by_kind(second.apply, "Deployment")
    partly = decide_pass(pinned(second.status), [built, ready_deployment(deployment, desired - 1)], SETTINGS, NOW)
    available, ready = condition(partly, "WorkloadAvailable"), condition(partly, "Ready")
    assert (available["status"], available["reason"]) == ("False", "ReplicasNotReady")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "ReplicasNotReady", available["message"])
    assert available["message"].startswith(f"{desired - 1}/{desired} replicas ready")
    whole = decide_pass(pinned(partly.status), [built, ready_deployment(deployment, desired)], SETTINGS, NOW)
    assert [condition(whole, kind)["status"] for kind in ("WorkloadAvailable", "Ready")] == ["True", "True"]


def test_a_new_revision_that_fails_to_build_leaves_the_stable_one_serving_and_ready():
    first = decide_pass(body(), [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    second = decide_pass(body(status=first.status), [built], SETTINGS, NOW)
    serving = ready_deployment(by_kind(second.apply, "Deployment"), second.status["replicas"])
    stable = decide_pass(body(status=second.status), [built, serving], SETTINGS, NOW)
    stable_revision = stable.status["stableRevision"]
    assert stable_revision == stable.status["currentRevision"]
    def edited(status: dict) -> dict:
        changed_body = body(tpot_p99_ms=6, status=status)
        changed_body["metadata"]["generation"] += 1  # the edit: re-planned, a new revision
        return changed_body
    changed = decide_pass(edited(stable.status), [built, serving], SETTINGS, NOW)
    assert changed.status["currentRevision"] != stable_revision
    assert condition(changed, "Ready")["message"].startswith(f"revision {stable_revision} serves with")
    failed = finished_job(by_kind(changed.apply, "Job"), "Failed", "BackoffLimitExceeded")
    outcome = decide_pass(edited(changed.status), [serving, failed], SETTINGS, NOW)
    ready = condition(outcome, "Ready")
    assert ready["status"] == "True" and ready["message"].startswith(f"revision {stable_revision} serves with")
    assert ready["message"].endswith(f"while revision {outcome.status['currentRevision']} failed to build")
    assert condition(outcome, "Degraded")["reason"] == "BuildFailed"
    assert serving not in outcome.delete


def test_old_revision_serves_until_the_new_one_is_ready_then_is_pruned():
    old = decide_pass(body(tpot_p99_ms=40), [], SETTINGS, NOW)
    old_children = [finished_job(by_kind(old.apply, "Job")),
                    ready_deployment(by_kind(old.apply, "Deployment"), 1),
                    by_kind(old.apply, "ConfigMap"), by_kind(old.apply, "PodDisruptionBudget")]
    new = decide_pass(body(tpot_p99_ms=6), old_children, SETTINGS, NOW)
    assert new.status["currentRevision"] != old.status["currentRevision"]
    deleted = {m["kind"] for m in new.delete}
    assert deleted == {"Job"}, "the old build Job goes; the old serving objects stay"
    assert condition(new, "WorkloadAvailable")["status"] == "True"
    new_children = old_children + [finished_job(by_kind(new.apply, "Job")),
                                   ready_deployment(by_kind(new.apply, "Deployment"), new.status["replicas"])]
    rolled = decide_pass(body(tpot_p99_ms=6), new_children, SETTINGS, NOW)
    old_names = {m["metadata"]["name"] for m in old_children}
    assert {m["metadata"]["name"] for m in rolled.delete} == old_names
    assert condition(rolled, "Ready")["status"] == "True"


def test_infeasible_spec_creates_nothing_and_says_why():
    outcome = decide_pass(body(tpot_p99_ms=1), [], SETTINGS, NOW)
    assert outcome.apply == [] and outcome.delete == []
    planned = condition(outcome, "Planned")
    assert (planned["status"], planned["reason"]) == ("False", "PlanInfeasible")
    assert "closest" in planned["message"]
    assert ("Warning", "PlanInfeasible") in [(e.type, e.reason) for e in outcome.events]


def test_invalid_stored_object_gets_a_condition_naming_the_field():
    stored = body()
    stored["spec"]["slo"]["ttftP99Ms"] = -5  # written before a CRD upgrade tightened the schema
    outcome = decide_pass(stored, [], SETTINGS, NOW)
    planned = condition(outcome, "Planned")
    assert planned["reason"] == "InvalidSpec" and "spec.slo.ttftP99Ms" in planned["message"]
    assert condition(outcome, "Ready")["reason"] == "InvalidSpec"
    assert outcome.apply == [] and outcome.delete == []


def test_a_spec_render_refuses_becomes_a_condition_not_an_exception():
    refused = body()
    refused["spec"]["engine"] = {"runtime": "engine"}
    refused["spec"]["model"]["tokenizer"] = "s3://tokenizers/llama"  # its build reads tokenizers from the hub
    outcome = decide_pass(refused, [], SETTINGS, NOW)
    ready = condition(outcome, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RenderFailed")
    assert "spec.model.tokenizer" in ready["message"]
    assert outcome.apply == [] and outcome.delete == []
    assert ("Warning", "RenderFailed") in [(e.type, e.reason) for e in outcome.events]


def rolled_out(replicas_ready: int | None = None, manifest=body):
    """A deployment whose revision rolled out: its last status and children."""
    first = decide_pass(manifest(), [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    second = decide_pass(manifest(status=first.status), [built], SETTINGS, NOW)
    desired = second.status["replicas"]
    serving = ready_deployment(by_kind(second.apply, "Deployment"), desired)
    third = decide_pass(manifest(status=second.status), [built, serving], SETTINGS, NOW)
    assert condition(third, "Ready")["status"] == "True"
    return third.status, built, serving


def test_replicas_lost_after_the_rollout_are_degraded_and_still_serving():
    manifest = body()
    manifest["spec"]["plan"] = {"replicas": 3}
    status, built, serving = rolled_out(manifest=lambda status=None: {**manifest, **({"status": status} if status else {})})
    down = ready_deployment(serving, 1)
    outcome = decide_pass({**manifest, "status": status}, [built, down], SETTINGS, NOW + timedelta(seconds=30))
    degraded = condition(outcome, "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True", "BelowDesiredReplicas", "1/3 replicas ready")
    assert condition(outcome, "Ready")["status"] == "True"  # one replica still serves
    assert condition(outcome, "Progressing")["reason"] == "RolledOut"
    assert ("Warning", "BelowDesiredReplicas") in [(e.type, e.reason) for e in outcome.events]


def test_replicas_that_crash_loop_say_why_in_degraded_and_only_their_pods_are_asked():
    from llmfleet.reconcile import Children
    from llmfleet.reconcile.due import short_of_ready

    manifest = body()
    manifest["spec"]["plan"] = {"replicas": 3}
    status, built, serving = rolled_out(manifest=lambda status=None: {**manifest, **({"status": status} if status else {})})
    assert short_of_ready({**manifest, "status": status}, Children.sorted_from([built, serving])) is None  # all ready: no pod list
    down = ready_deployment(serving, 1)
    assert short_of_ready({**manifest, "status": status}, Children.sorted_from([built, down])) == status["currentRevision"]
    why = "pod x container triton: CrashLoopBackOff (restarted 4 times, last exit code 1): back-off 1m20s"
    outcome = decide_pass({**manifest, "status": status}, [built, down], SETTINGS, NOW + timedelta(seconds=30),
                     not_ready_reason=why)
    assert condition(outcome, "Degraded")["message"] == f"1/3 replicas ready; {why}"


def test_status_is_written_only_when_it_changes():
    status, built, serving = rolled_out()
    again = decide_pass(body(status=status), [built, serving], SETTINGS, NOW + timedelta(seconds=5))
    assert not again.status_changed and again.events == []
    fewer = decide_pass(body(status=status), [built, ready_deployment(serving, 0)], SETTINGS, NOW + timedelta(seconds=10))
    assert fewer.status_changed


def test_the_stored_plan_is_kept_until_the_spec_changes_or_a_replan_is_asked_for():
    status, built, serving = rolled_out()
    # As if an operator upgrade's calibration now preferred another configuration.
    assert status["plan"]["quantization"] == "FP8"
    stored = {**status, "plan": {**status["plan"], "quantization": "BF16", "kvCacheDtype": "BF16",
                                 "summary": "H100x1 BF16"}}
    kept = decide_pass(body(status=stored), [built, serving], SETTINGS, NOW)
    assert kept.status["plan"]["quantization"] == "BF16"
    assert kept.status["currentRevision"] != status["currentRevision"]  # the stored plan is what renders
    edited = body(status=stored)
    edited["metadata"]["generation"] += 1
    assert decide_pass(edited, [built, serving], SETTINGS, NOW).status["plan"] == status["plan"]
    asked = body(status=stored)
    asked["metadata"]["annotations"] = {"llmfleet.io/replan": "2026-12-02"}
    replanned = decide_pass(asked, [built, serving], SETTINGS, NOW)
    assert replanned.status["plan"] == status["plan"] and replanned.status["replanRequest"] == "2026-12-02"
    asked["status"] = replanned.status
    assert decide_pass(asked, [built, serving], SETTINGS, NOW).status["plan"] == status["plan"]


def autoscaling_body(status: dict | None = None) -> dict:
    manifest = body(status=status)
    manifest["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}
    return manifest


def test_autoscaler_scales_up_on_a_ttft_breach_and_records_why():
    from llmfleet.autoscale import MetricsSnapshot

    first = decide_pass(autoscaling_body(), [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    serving = ready_deployment(by_kind(first.apply, "Deployment"), 1)
    breach = MetricsSnapshot(ttft_p99_ms=3000.0416666667, waiting_requests=0.0, requests_per_second=2.0,
                             kv_cache_utilization=0.5, sample_time=NOW, scrape_interval_seconds=5.0)
    outcome = decide_pass(autoscaling_body(status=first.status), [built, serving], SETTINGS, NOW, breach)
    assert outcome.status["replicas"] > 1
    assert by_kind(outcome.apply, "Deployment")["spec"]["replicas"] == outcome.status["replicas"]
    assert outcome.status["autoscaler"]["lastDecision"] == "ScaleUp"
    # Which signal decided, the reversal count and the modelled capacity reach status.
    assert outcome.status["autoscaler"]["signal"] == "TtftFeedback"
    assert outcome.status["autoscaler"]["reversals"] == 0
    assert outcome.status["autoscaler"]["lastScaleDirection"] == "ScaleUp"
    assert outcome.status["autoscaler"]["inputs"]["replicaCapacityRequestsPerSecond"] > 0
    assert outcome.status["autoscaler"]["inputs"]["speedFactor"] == 1.0
    assert outcome.status["ttftP99Ms"] == 3000.0  # rounded to 0.1 ms for kubectl get
    assert outcome.status["autoscaler"]["inputs"]["observedTtftP99Ms"] == 3000.0
    assert condition(outcome, "MetricsAvailable")["status"] == "True"
    assert condition(outcome, "RequestsBalanced")["status"] == "True"
    assert ("Normal", "ScaleUp") in [(e.type, e.reason) for e in outcome.events]


def test_a_reversal_is_counted_across_passes_in_status():
    from llmfleet.autoscale import MetricsSnapshot

    first = decide_pass(autoscaling_body(), [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    serving = ready_deployment(by_kind(first.apply, "Deployment"), 1)
    # A replica was removed 20 s ago; now the p99 breaches.
    status = {**first.status, "autoscaler": {"lastScaleDirection": "ScaleDown", "reversals": 1,
                                             "lastScaleTime": (NOW - timedelta(seconds=20)).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    breach = MetricsSnapshot(ttft_p99_ms=3000.0, waiting_requests=0.0, requests_per_second=2.0,
                             kv_cache_utilization=0.5, sample_time=NOW, scrape_interval_seconds=5.0)
    outcome = decide_pass(autoscaling_body(status=status), [built, serving], SETTINGS, NOW, breach)
    autoscaler = outcome.status["autoscaler"]
    assert (autoscaler["lastDecision"], autoscaler["reversals"]) == ("ScaleUp", 2)
    assert "(a reversal: the last change, 20 s ago, was a ScaleDown)" in autoscaler["reason"]


def test_a_swamped_replica_beside_an_idle_one_is_a_routing_condition_not_a_scale_up():
    from llmfleet.autoscale import MetricsSnapshot, ReplicaObservation

    status, built, serving = rolled_out(manifest=autoscaling_body)
    status = {**status, "replicas": 2}
    serving = ready_deployment(by_kind(decide_pass(autoscaling_body(status=status), [built, serving], SETTINGS,
                                              NOW).apply, "Deployment"), 2)
    skewed = MetricsSnapshot(ttft_p99_ms=300_000.0, ttft_histogram_top_ms=300_000.0, requests_per_second=2.0,
                             sample_time=NOW, scrape_interval_seconds=5.0,
                             replicas=(ReplicaObservation("chat-a", 300_000.0, 2.0),
                                                        ReplicaObservation("chat-b", None, 0.0)))
    outcome = decide_pass(autoscaling_body(status=status), [built, serving], SETTINGS, NOW, skewed)
    assert outcome.status["replicas"] == 2 and outcome.status["autoscaler"]["lastDecision"] == "Hold"
    assert outcome.status["ttftP99"] == "over 300000 ms" and outcome.status["ttftP99Ms"] == 300_000.0
    balanced = condition(outcome, "RequestsBalanced")
    assert (balanced["status"], balanced["reason"]) == ("False", "ReplicaImbalance")
    assert "chat-a (p99 TTFT over 300000 ms)" in balanced["message"] and "chat-b (idle)" in balanced["message"]
    assert ("Warning", "ReplicaImbalance") in [(e.type, e.reason) for e in outcome.events]


def test_one_scale_up_is_one_event_and_the_deployment_stays_ready():
    from llmfleet.autoscale import MetricsSnapshot

    status, built, serving = rolled_out(manifest=autoscaling_body)
    breach = MetricsSnapshot(ttft_p99_ms=3000.0, waiting_requests=4.0, requests_per_second=2.0,
                             kv_cache_utilization=0.5, sample_time=NOW, scrape_interval_seconds=5.0)
    up = decide_pass(autoscaling_body(status=status), [built, serving], SETTINGS, NOW, breach)
    assert up.status["replicas"] > 1
    reasons = [e.reason for e in up.events]
    assert reasons.count("ScaleUp") == 1 and "ScalingUp" in reasons
    assert not {"RollingOut", "ReplicasNotReady"} & set(reasons) and {e.type for e in up.events} == {"Normal"}
    assert condition(up, "Ready")["status"] == "True"
    assert condition(up, "Degraded")["status"] == "False"
    # The added replicas start within the grace: still scaling up, not degraded.
    later = NOW + timedelta(seconds=120)
    hold = MetricsSnapshot(ttft_p99_ms=3000.0, waiting_requests=4.0, requests_per_second=2.0,
                           kv_cache_utilization=0.5, sample_time=later, scrape_interval_seconds=5.0)
    starting = decide_pass(autoscaling_body(status=up.status), [built, serving], SETTINGS, later, hold)
    assert condition(starting, "Progressing")["reason"] == "ScalingUp"
    assert condition(starting, "Degraded")["status"] == "False"
    # Past the grace they count as missing.
    late = NOW + timedelta(seconds=SETTINGS.replica_start_grace_seconds + 60)
    stuck = decide_pass(autoscaling_body(status=starting.status), [built, serving], SETTINGS, late, None)
    assert condition(stuck, "Degraded")["reason"] == "BelowDesiredReplicas"


def test_autoscaler_holds_without_metrics_and_says_so():
    first = decide_pass(autoscaling_body(), [], SETTINGS, NOW)
    built = finished_job(by_kind(first.apply, "Job"))
    status = {**first.status, "replicas": 3}
    serving = ready_deployment(by_kind(first.apply, "Deployment"), 3)
    outcome = decide_pass(autoscaling_body(status=status), [built, serving], SETTINGS, NOW, None)
    assert outcome.status["replicas"] == 3
    assert outcome.status["autoscaler"]["lastDecision"] == "Hold"
    metrics = condition(outcome, "MetricsAvailable")
    assert metrics["status"] == "False" and "Prometheus" in metrics["message"]
    assert condition(outcome, "RequestsBalanced")["status"] == "Unknown"


class RecordingGateway:
    """The k8s gateway's surface that `reconcile` uses, recording the writes; `current` says
    whether the object is still at the version the pass read."""

    def __init__(self, current: bool):
        self.current = current
        self.applied, self.patched, self.events = [], [], []

    def ensure(self, manifest):
        pass

    def apply(self, manifest, live=None):
        self.applied.append(manifest)

    def delete(self, child):
        pass

    def patch_status(self, namespace, name, status, resource_version=None):
        self.patched.append((status, resource_version))
        return self.current

    def emit_event(self, obj, event_type, reason, message):
        self.events.append(reason)


def test_a_pass_from_a_stale_copy_writes_status_only_from_that_version_and_tells_nothing():
    from llmfleet.reconcile import reconcile

    stored = body()
    stored["metadata"]["resourceVersion"] = "41"
    fresh, stale = RecordingGateway(current=True), RecordingGateway(current=False)
    reconcile(copy.deepcopy(stored), fresh, SETTINGS, NOW)
    reconcile(copy.deepcopy(stored), stale, SETTINGS, NOW)
    assert [version for _, version in fresh.patched] == ["41"] and fresh.events
    assert [version for _, version in stale.patched] == ["41"] and stale.events == []
    # ... and says so, for the pass to be made again from the new version.
    assert not reconcile(copy.deepcopy(stored), RecordingGateway(current=True), SETTINGS, NOW).superseded
    assert reconcile(copy.deepcopy(stored), RecordingGateway(current=False), SETTINGS, NOW).superseded


def test_a_child_the_apiserver_refuses_is_said_in_degraded_and_the_pass_is_retried():
    import pytest

    from llmfleet.k8s import WriteRefused
    from llmfleet.reconcile import reconcile

    class RefusingGateway(RecordingGateway):
        def apply(self, manifest, live=None):
            if manifest["kind"] == "Service":
                raise WriteRefused(f"Service {manifest['metadata']['name']}: 500 Internal error occurred: "
                                   "failed to allocate a serviceIP: range is full")
            super().apply(manifest, live)

    kube = RefusingGateway(current=True)
    with pytest.raises(WriteRefused):  # Kopf retries the pass
        reconcile(body(), kube, SETTINGS, NOW)
    ((status, _),) = kube.patched
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ChildWriteRefused")
    assert "the apiserver refused Service chat: 500" in degraded["message"] and "range is full" in degraded["message"]
    assert kube.events == ["ChildWriteRefused"]
    assert next(c for c in status["conditions"] if c["type"] == "Planned")["status"] == "True"  # the rest as decided


def test_only_deployments_whose_decisions_depend_on_time_are_passed_every_tick():
    from llmfleet.reconcile import needs_periodic_pass

    status, built, serving = rolled_out()
    settled = body(status=status)
    assert not needs_periodic_pass(settled, [built, serving])
    assert needs_periodic_pass(settled, [built, ready_deployment(serving, 0)])  # short of ready
    autoscaled = body(status=status)
    autoscaled["spec"]["autoscaling"] = {"enabled": True}
    assert needs_periodic_pass(autoscaled, [built, serving])
    for phase, periodic in (("Warming", True), ("Paused", True), ("Promoted", False), ("RolledBack", False)):
        canary = body(status={**status, "canary": {"phase": phase}})
        assert needs_periodic_pass(canary, [built, serving]) is periodic, phase
