"""Engine builds that need no hub: an FP8 engine-runtime build whose weights are on a claim reads
its calibration set from a claim too (spec.engine.calibrationDataset), as quantize.py reads a local
directory (train split, text column), and serves; the same deployment without a set is refused
with a condition that names what is missing, and nothing is built."""

from __future__ import annotations

import copy
import json

import pytest

from conftest import condition, llm_deployment, temporary_namespace, wait_for, wait_until_ready
from llmfleet_sandbox import hub

NAMESPACE = "calibration"
NAME = "calibrated"
CALIBRATION_ROWS = 8
MANIFEST = llm_deployment(
    NAME, NAMESPACE, "llama-3.1-8b",
    engine={"runtime": "engine", "maxBatchSize": 8, "maxInputLen": 1024, "maxSeqLen": 2048, "maxNumTokens": 2048,
            "calibrationDataset": "pvc://datasets/calibration"},
    slo={"ttftP99Ms": 2000, "tpotP99Ms": 100},
    workload={"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 16, "outputTokensP99": 32,
              "peakRequestsPerSecond": 1},
    resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 2},
    # FP8 weights and KV cache: both calibrate.
    plan={"gpuType": "H100-SXM-80GB", "tensorParallelSize": 1, "quantization": "FP8", "kvCacheDtype": "FP8",
          "replicas": 1})
MANIFEST["spec"]["model"]["source"] = "pvc://weights/llama-8b"


def _claim_on_host(sandbox, name: str):
    sandbox.apply([{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}],
                  namespace=NAMESPACE)

    def bound():
        claim = sandbox.kubectl_json("get", "pvc", name, "-n", NAMESPACE)
        return claim if claim.get("status", {}).get("phase") == "Bound" else None
    claim = wait_for(bound, 30, f"the {name} claim to be Bound")
    volume = sandbox.kubectl_json("get", "pv", claim["spec"]["volumeName"])
    return sandbox.state_dir / "hostpath" / volume["spec"]["hostPath"]["path"].lstrip("/")


@pytest.fixture(scope="module")
def claims(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        hub.download("meta-llama/Llama-3.1-8B-Instruct", _claim_on_host(sandbox, "weights") / "llama-8b")
        calibration = _claim_on_host(sandbox, "datasets") / "calibration"
        calibration.mkdir(parents=True)
        (calibration / "train.jsonl").write_text("".join(json.dumps({"text": f"a calibration sample, number {row}"})
                                                         + "\n" for row in range(CALIBRATION_ROWS)))
        yield


def test_an_fp8_build_from_a_claim_calibrates_on_the_set_from_a_claim_and_serves(sandbox, claims):
    sandbox.apply([MANIFEST], namespace=NAMESPACE)
    status = wait_until_ready(sandbox, NAME, NAMESPACE, timeout=300)["status"]
    assert (status["plan"]["quantization"], status["plan"]["kvCacheDtype"]) == ("FP8", "FP8")
    (job,) = sandbox.kubectl_json("get", "jobs", "-n", NAMESPACE, "-l", f"llmfleet.io/deployment={NAME}")["items"]
    pod_spec = job["spec"]["template"]["spec"]
    assert {"name": "calibration-source", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}} in (
        pod_spec["volumes"])
    (pod,) = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"job-name={job['metadata']['name']}")["items"]
    log = sandbox.container_log(pod, "engine-build")
    # quantize.py's stand-in read the set where the real one would: the claim's directory.
    assert f"Loading calibration dataset /calibration-source/calibration: {CALIBRATION_ROWS} sample(s)" in log, log
    assert "downloaded" not in log  # nothing came from the hub


def test_without_a_set_the_build_is_refused_naming_the_missing_access(sandbox, claims):
    uncalibrated = copy.deepcopy(MANIFEST)
    uncalibrated["metadata"]["name"] = "uncalibrated"
    del uncalibrated["spec"]["engine"]["calibrationDataset"]
    sandbox.apply([uncalibrated], namespace=NAMESPACE)

    def refused():
        deployment = sandbox.kubectl_json("get", "llmdeployment", "uncalibrated", "-n", NAMESPACE)
        planned = condition(deployment, "Planned")
        return deployment if planned and planned.get("reason") == "RenderFailed" else None
    deployment = wait_for(refused, 60, "uncalibrated to be refused")
    for kind in ("Planned", "Ready"):
        said = condition(deployment, kind)
        assert said["status"] == "False" and said["reason"] == "RenderFailed", said
        for part in ("FP8 weights", "cnn_dailymail from the Hugging Face hub", "pvc://weights/llama-8b",
                     "may have no hub egress", "Set spec.engine.calibrationDataset"):
            assert part in said["message"], (part, said["message"])
    assert sandbox.kubectl_json("get", "jobs", "-n", NAMESPACE, "-l", "llmfleet.io/deployment=uncalibrated")["items"] == []
