"""The manifests a real GPU cluster gets, checked by a real kube-apiserver.

Server-side dry-run runs admission, defaulting and schema validation without persisting: every
object the operator would apply for TP 1, 2 and 8, for both runtimes, on each GPU type the
runtime's pinned release supports must be accepted.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from conftest import temporary_namespace
from llmfleet.api import LLMDeployment
from llmfleet.catalog.release_record import release_for
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, render, revision_hash
from llmfleet.render.pod import engine_cache_claim
from operator_fixtures import REPO_ROOT

NAMESPACE = "dry-run"
TENSOR_PARALLEL_SIZES = (1, 2, 8)
RUNTIMES = ("engine", "llmapi")
# A model per TP size that every catalog GPU holds at BF16 (no format depends on the GPU).
MODEL_FOR_TP = {1: ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
                2: ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
                8: ("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct")}


def _deployment(runtime: str, gpu_type: str, tensor_parallel_size: int) -> LLMDeployment:
    model, repo = MODEL_FOR_TP[tensor_parallel_size]
    return LLMDeployment.from_manifest({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": f"{runtime}-tp{tensor_parallel_size}-{gpu_type.lower()}", "namespace": NAMESPACE,
                     "uid": "5d0c7f4e-3b8a-4f5e-9c11-2a6b7d8e9f01"},
        "spec": {
            "model": {"name": model, "source": f"hf://{repo}", "secretRef": {"name": "hub-token", "key": "token"}},
            "engine": {"runtime": runtime},
            "slo": {"ttftP99Ms": 5000, "tpotP99Ms": 200},
            "workload": {"inputTokensMean": 512, "inputTokensP99": 2048, "outputTokensMean": 128,
                         "outputTokensP99": 512, "peakRequestsPerSecond": 1},
            "resources": {"allowedGpuTypes": [gpu_type], "gpuBudget": 16},
            "plan": {"gpuType": gpu_type, "tensorParallelSize": tensor_parallel_size,
                     "quantization": "BF16", "kvCacheDtype": "BF16", "replicas": 2},
        },
    })


def _real_manifests(runtime: str, gpu_type: str, tensor_parallel_size: int) -> list[dict]:
    deployment = _deployment(runtime, gpu_type, tensor_parallel_size)
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible, f"{runtime} {gpu_type} TP{tensor_parallel_size}: {chosen.rationale}"
    return render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(),
                  serving_replicas=chosen.replicas)


@pytest.fixture(scope="module")
def namespace(sandbox):
    with temporary_namespace(sandbox, NAMESPACE):
        yield NAMESPACE


@pytest.mark.parametrize("tensor_parallel_size", TENSOR_PARALLEL_SIZES)
@pytest.mark.parametrize("runtime, gpu_type", [(runtime, gpu_type) for runtime in RUNTIMES
                                               for gpu_type in sorted(release_for(runtime, None).support.gpu_types)])
def test_the_apiserver_accepts_every_rendered_object(sandbox, namespace, runtime, gpu_type, tensor_parallel_size):
    manifests = [engine_cache_claim(namespace, RenderSettings()),
                 *_real_manifests(runtime, gpu_type, tensor_parallel_size)]
    output = sandbox.kubectl("apply", "--server-side", "--field-manager=llmfleet", "--dry-run=server",
                             "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(manifests))
    accepted = [line for line in output.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(manifests), output
    # Nothing was persisted.
    assert sandbox.kubectl_json("get", "deployments,jobs,configmaps", "-n", namespace,
                                "-l", "app.kubernetes.io/managed-by=llmfleet")["items"] == []


def test_the_apiserver_accepts_the_charts_monitoring_objects_against_the_upstream_crds(sandbox, namespace):
    """The PodMonitors, PrometheusRule and dashboard ConfigMap the chart renders, checked field by
    field (kubectl's strict validation) against the Prometheus Operator's own CRDs, which the
    sandbox installs from their pinned Go module (operator/controlplane/gateway-crds.sh)."""
    rendered = subprocess.run(
        ["helm", "template", "llmfleet", str(REPO_ROOT / "charts" / "llmfleet"), "--namespace", namespace,
         "--set", "podMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
         "--set", "grafanaDashboard.enabled=true", "--set", "prometheus.scrapeIntervalSeconds=30",
         "--show-only", "templates/podmonitor.yaml", "--show-only", "templates/prometheusrule.yaml",
         "--show-only", "templates/grafana-dashboard.yaml"],
        env=sandbox.env, capture_output=True, text=True, check=True).stdout
    kinds = sorted(document["kind"] for document in yaml.safe_load_all(rendered) if document)
    assert kinds == ["ConfigMap", "PodMonitor", "PodMonitor", "PrometheusRule"]
    output = sandbox.kubectl("apply", "--validate=strict", "--dry-run=server", "-n", namespace, "-f", "-",
                             input_text=rendered)
    assert len([line for line in output.splitlines() if line.endswith("(server dry run)")]) == len(kinds), output
