"""The operator installed as a user installs it: `helm install` of the chart, an in-cluster
pod under the chart's ServiceAccount, autoscaling on the sandbox's Prometheus.

The release lives in its own namespace and watches only its own test namespace, which the
session's host-run operator excludes: each object has exactly one operator."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import condition, service_target, small_batch_70b, wait_for
from llmfleet.render import monitoring
from llmfleet.render.identity import kubectl_kinds
from llmfleet_sandbox import prometheus
from llmfleet_sandbox.manager import configured, operator_chart_values, operator_prerequisites
from operator_fixtures import IN_CLUSTER_NAMESPACE, IN_CLUSTER_RELEASE, IN_CLUSTER_RELEASE_NAMESPACE, REPO_ROOT

WATCHED_NAMESPACE = IN_CLUSTER_NAMESPACE
NAME = "small"
CHILD_KINDS = kubectl_kinds()
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={IN_CLUSTER_RELEASE}"
# 6 requests/s is about twice what one replica of small_batch_70b serves within its SLO.
LOAD_SECONDS = 120


def _helm(sandbox, helm_home, *args: str) -> subprocess.CompletedProcess:
    env = {**sandbox.env, **{f"HELM_{kind}_HOME": str(helm_home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}}
    return subprocess.run(["helm", *args], env=env, capture_output=True, text=True, timeout=300)


def _operator_pods(sandbox) -> list[dict]:
    return sandbox.kubectl_json("get", "pods", "-n", IN_CLUSTER_RELEASE_NAMESPACE, "-l", OPERATOR_SELECTOR)["items"]


def _operator_log(sandbox) -> str:
    """The operator container's log, which the node agent keeps under the pod's directory."""
    logs = []
    for pod in _operator_pods(sandbox):
        metadata = pod["metadata"]
        path = (sandbox.state_dir / "pods" / f"{metadata['namespace']}_{metadata['name']}_{metadata['uid'][:8]}"
                / "logs" / "operator.log")
        if path.exists():
            logs.append(path.read_text(errors="replace"))
    return "\n".join(logs)


def _get(sandbox) -> dict:
    return sandbox.kubectl_json("get", "llmdeployment", NAME, "-n", WATCHED_NAMESPACE)


def _until_condition(sandbox, kind: str, status: str, timeout: float) -> dict:
    def reached():
        obj = _get(sandbox)
        found = condition(obj, kind)
        return obj if found and found["status"] == status else None
    try:
        return wait_for(reached, timeout, f"{kind}={status}", 1)
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{_operator_log(sandbox)[-3000:]}") from None


@pytest.fixture
def release(sandbox, tmp_path):
    """The chart installed with --wait; uninstalled (and its namespaces removed) afterwards."""
    sandbox.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WATCHED_NAMESPACE}}])
    # The Prometheus password Secret and CA ConfigMap the chart values name.
    sandbox.apply(operator_prerequisites(configured(sandbox.state_dir), IN_CLUSTER_RELEASE_NAMESPACE), namespace=IN_CLUSTER_RELEASE_NAMESPACE)
    installed = _helm(sandbox, tmp_path, "upgrade", "--install", IN_CLUSTER_RELEASE, str(REPO_ROOT / "charts" / "llmfleet"),
                      "--namespace", IN_CLUSTER_RELEASE_NAMESPACE, "--create-namespace",
                      *operator_chart_values(configured(sandbox.state_dir)),
                      "--set", f"watchNamespaces={{{WATCHED_NAMESPACE}}}", "--wait", "--timeout", "180s")
    try:
        assert installed.returncode == 0, (
            f"helm install failed: {installed.stderr}\npods: "
            f"{sandbox.kubectl('get', 'pods', '-n', IN_CLUSTER_RELEASE_NAMESPACE, '-o', 'wide', check=False)}\n"
            f"operator log:\n{_operator_log(sandbox)[-3000:]}")
        yield lambda: _helm(sandbox, tmp_path, "uninstall", IN_CLUSTER_RELEASE, "--namespace", IN_CLUSTER_RELEASE_NAMESPACE, "--wait")
    finally:
        # Serving pods drain for up to their grace period: no waiting for the namespace.
        sandbox.kubectl("delete", "namespace", WATCHED_NAMESPACE, "--wait=false", check=False)
        _helm(sandbox, tmp_path, "uninstall", IN_CLUSTER_RELEASE, "--namespace", IN_CLUSTER_RELEASE_NAMESPACE, "--wait",
              "--ignore-not-found")
        sandbox.kubectl("delete", "namespace", IN_CLUSTER_RELEASE_NAMESPACE, "--wait=false", check=False)


def test_helm_installed_operator_reconciles_and_autoscales(sandbox, release, tmp_path):
    pod, = _operator_pods(sandbox)
    assert pod["spec"]["serviceAccountName"] == f"{IN_CLUSTER_RELEASE}-operator"
    assert pod["spec"]["containers"][0]["image"].startswith("llmfleet/operator:")
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"

    sandbox.apply([small_batch_70b(NAME, WATCHED_NAMESPACE, 500, autoscaling={
        "enabled": True, "minReplicas": 1, "maxReplicas": 2})], namespace=WATCHED_NAMESPACE)
    _until_condition(sandbox, "Planned", "True", 60)
    children = sandbox.kubectl_json("get", CHILD_KINDS, "-n", WATCHED_NAMESPACE, "-l",
                                    f"llmfleet.io/deployment={NAME}")["items"]
    assert sorted(child["kind"] for child in children) == [
        "ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service"]
    # The in-cluster operator did it (RBAC under its ServiceAccount, the API through the
    # `kubernetes` Service; it watches nothing else), and created the engine cache claim.
    assert "Handler 'on_change' succeeded" in _operator_log(sandbox)
    sandbox.kubectl("get", "persistentvolumeclaim", "llmfleet-engine-cache", "-n", WATCHED_NAMESPACE)

    def autoscaler_reported():
        obj = _get(sandbox)
        return obj if (obj.get("status") or {}).get("autoscaler") and condition(obj, "MetricsAvailable") else None
    wait_for(autoscaler_reported, 60, "status.autoscaler and MetricsAvailable")

    # Serving, then Prometheus answering from inside the pod network for this deployment.
    _until_condition(sandbox, "Ready", "True", 300)
    obj = _until_condition(sandbox, "MetricsAvailable", "True", 120)
    assert obj["status"]["autoscaler"]

    # Load beyond one replica: the in-cluster operator reads the breach from Prometheus and
    # scales up to two ready replicas.
    load = subprocess.Popen(
        [sys.executable, "-m", "llmfleet", "load", "--target", service_target(sandbox, NAME, WATCHED_NAMESPACE),
         "--schedule", "constant:6", "--duration-s", str(LOAD_SECONDS), "--input-tokens", "lognormal:128:256",
         "--output-tokens", "fixed:32", "--output-dir", str(tmp_path / "load"), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def scaled_up():
            status = _get(sandbox).get("status") or {}
            return status if status.get("replicas") == 2 and status.get("readyReplicas") == 2 else None
        wait_for(scaled_up, LOAD_SECONDS, "two ready replicas under load", 1)
        events = sandbox.kubectl_json("get", "events", "-n", WATCHED_NAMESPACE,
                                      "--field-selector", f"reason=ScaleUp,involvedObject.name={NAME}")
        assert events["items"], "no ScaleUp event from the operator"
        _dashboard_and_rules_answer_and_the_fast_burn_alert_fires(sandbox)
    finally:
        load.terminate()
        load.communicate(timeout=60)

    uninstalled = release()
    assert uninstalled.returncode == 0, uninstalled.stderr
    wait_for(lambda: not _operator_pods(sandbox), 60, "the operator pod to be gone")


def _dashboard_and_rules_answer_and_the_fast_burn_alert_fires(sandbox) -> None:
    """Under the load above (twice one replica's capacity: most first tokens miss the target
    until the second replica serves), every expression of the chart's rules and dashboard
    parses and answers on the sandbox's real Prometheus, which scrapes the operator pod's gauges
    and evaluates the chart's rules as the Prometheus Operator would set it up; and the fast
    burn alert goes pending (its `for` is promtool's to check: test_monitoring.py)."""
    variables = {"$namespace": WATCHED_NAMESPACE, "$deployment": NAME, "$__rate_interval": "1m"}

    def answered() -> dict[str, int]:
        counts = {}
        for where, expr in monitoring.expressions().items():
            for name, value in variables.items():
                expr = expr.replace(name, value)
            counts[where] = len(prometheus.query(sandbox.env, expr))  # a parse error raises here
        return counts

    # Nothing to show without a canary, nor while Ready; no waiting count from the engine
    # runtime's pinned release (24.12); the burn alerts are checked below.
    may_be_empty = {"panel Canary / {{phase}}", "rule LLMFleetDeploymentNotReady", "panel Queue and KV cache / waiting",
                    "rule llmfleet_deployment:waiting_requests:sum",
                    "rule LLMFleetTtftSloFastBurn", "rule LLMFleetTtftSloSlowBurn"}

    def empty() -> list[str]:
        return sorted(where for where, count in answered().items() if not count and where not in may_be_empty)
    deadline, silent = time.monotonic() + 60, empty()
    while silent and time.monotonic() < deadline:  # the rules' first evaluations, the first scrapes
        time.sleep(2)
        silent = empty()
    assert silent == [], f"no series from: {silent}"

    def fast_burn() -> list[dict]:
        alerts = json.loads(prometheus.http_get(sandbox.env, "/api/v1/alerts"))["data"]["alerts"]
        return [alert for alert in alerts if alert["labels"].get("alertname") == "LLMFleetTtftSloFastBurn"
                and alert["labels"].get("llmfleet_io_deployment") == NAME
                and alert["labels"].get("namespace") == WATCHED_NAMESPACE and alert["state"] in ("pending", "firing")]
    wait_for(fast_burn, LOAD_SECONDS, "LLMFleetTtftSloFastBurn pending or firing for the breaching deployment", 2)
