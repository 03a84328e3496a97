"""What the reconcile, rollout and handler tests build: LLMDeployment bodies, their children at
each step of a life, and one pure pass (`decide` on a context and observations built from a
body, its children and keyword observations)."""

from __future__ import annotations

import copy
from datetime import datetime, timezone

from llmfleet.reconcile import Context, Fleet, Observations, OperatorSettings, Outcome, decide
from llmfleet.render import RenderSettings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
SETTINGS = OperatorSettings(render=RenderSettings())


def body(tpot_p99_ms: int = 40, status: dict | None = None) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "uid-1", "generation": 3},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "slo": {"ttftP99Ms": 1000, "tpotP99Ms": tpot_p99_ms,
                    "quality": {"allowedQuantizations": ["BF16", "FP8"]}},
            "workload": {"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 64,
                         "outputTokensP99": 128, "peakRequestsPerSecond": 2},
            "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
        },
        **({"status": status} if status else {}),
    }


def condition(outcome, kind: str) -> dict:
    return next(c for c in outcome.status["conditions"] if c["type"] == kind)


def by_kind(manifests, kind: str) -> dict:
    return next(m for m in manifests if m["kind"] == kind)


def finished_job(job: dict, condition_type: str = "Complete", reason: str = "") -> dict:
    done = copy.deepcopy(job)
    done["status"] = {"conditions": [{"type": condition_type, "status": "True", "reason": reason,
                                      "message": "boom" if condition_type == "Failed" else ""}]}
    return done


def ready_deployment(deployment: dict, ready: int) -> dict:
    done = copy.deepcopy(deployment)
    done["status"] = {"readyReplicas": ready}
    return done


def manifest_with_steps(engine_revision: str, generation: int, status: dict | None = None) -> dict:
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


def canary_started(body=manifest_with_steps):
    """Revision v1 rolled out and stable, then v2 built and warming with its replicas ready:
    (v1's last outcome, v2's warming outcome, the children)."""
    first = decide_pass(body("v1", 1), [], SETTINGS, NOW)
    job_a = with_status(kind(first, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    second = decide_pass(body("v1", 1, first.status), [job_a], SETTINGS, NOW)
    serving_a = with_status(kind(second, "Deployment"), readyReplicas=2)
    stable = decide_pass(body("v1", 1, second.status), [job_a, serving_a], SETTINGS, NOW)
    changed = decide_pass(body("v2", 2, stable.status), [job_a, serving_a], SETTINGS, NOW)
    job_b = with_status(kind(changed, "Job"), conditions=[{"type": "Complete", "status": "True"}])
    warming = decide_pass(body("v2", 2, changed.status), [job_a, serving_a, job_b], SETTINGS, NOW)
    serving_b = with_status(kind(warming, "Deployment", warming.status["currentRevision"]), readyReplicas=2)
    return stable, warming, [job_a, serving_a, job_b, serving_b]


class SilentGateway:
    """A KubeGateway whose writes go nowhere and whose status patches all succeed."""

    def ensure(self, manifest):
        pass

    def apply(self, manifest, live=None):
        pass

    def scale(self, child, replicas):
        pass

    def delete(self, child):
        pass

    def patch_status(self, namespace, name, status, resource_version=None):
        return True

    def emit_event(self, obj, event_type, reason, message):
        pass


def decide_pass(body: dict, children, settings: OperatorSettings, now: datetime, snapshot=None, *,
                cluster_gpus=None, fleet_speeds=None, observed=None, **observations) -> Outcome:
    """`observed` is the settled revision's traffic (Observations.workload); `cluster_gpus` and
    `fleet_speeds` what the operator's indexes would give."""
    return decide(Context.of(body, children, settings, now),
                  Observations(snapshot=snapshot, workload=observed, fleet=Fleet(cluster_gpus, fleet_speeds),
                               **observations))


def merge_patched(stored: dict, patch: dict) -> dict:
    """`stored` after a JSON merge patch (RFC 7386), as the apiserver applies one: None removes,
    mappings merge, the rest replaces."""
    merged = dict(stored)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patched(merged[key], value)
        else:
            merged[key] = value
    return merged


def stored_after(stored: dict, outcome: Outcome) -> dict:
    """The status the apiserver keeps once the pass's patch is applied: the pass's own status."""
    kept = merge_patched(stored, outcome.status_patch)
    assert kept == outcome.status, "the patch does not turn the stored status into the decided one"
    return kept
