"""The llmapi runtime end to end: the operator plans within what the pinned release can load,
a CPU prepare Job fetches the published ModelOpt checkpoint into the engine cache, and the
serving pod (the real Triton, the image's LLM-API model with the emulated engine) answers
`llmfleet load` through the Service."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from conftest import llm_deployment, service_target, temporary_namespace, wait_for, wait_until_ready
from llmfleet.render.identity import kubectl_kinds
from llmfleet.catalog.client_record import load_client_record
from llmfleet_sandbox import hub, objectstore
from llmfleet_sandbox.manager import configured

NAMESPACE = "llmapi"
NAME = "chat"
MANIFEST = llm_deployment(
    NAME, NAMESPACE, "llama-3.1-8b", engine={"runtime": "llmapi", "maxBatchSize": 16, "maxNumTokens": 1024},
    slo={"ttftP99Ms": 2000, "tpotP99Ms": 100, "quality": {"allowedQuantizations": ["FP8"]}},
    workload={"inputTokensMean": 256, "inputTokensP99": 512, "outputTokensMean": 32, "outputTokensP99": 64,
              "peakRequestsPerSecond": 1},
    resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 2})


@pytest.fixture(scope="module")
def ready_deployment(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        sandbox.apply([MANIFEST], namespace=NAMESPACE)
        yield wait_until_ready(sandbox, NAME, NAMESPACE)


def test_fp8_is_served_from_the_published_checkpoint_without_an_engine_build(sandbox, ready_deployment):
    plan = ready_deployment["status"]["plan"]
    assert (plan["quantization"], plan["kvCacheDtype"]) == ("FP8", "FP8")
    (job,) = sandbox.kubectl_json("get", "jobs", "-n", NAMESPACE)["items"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["CHECKPOINT_REPO_ID"] == "nvidia/Llama-3.1-8B-Instruct-FP8"
    assert "nvidia.com/gpu" not in container["resources"]["requests"]
    (config_map,) = sandbox.kubectl_json("get", "configmaps", "-n", NAMESPACE, "-l",
                                         f"llmfleet.io/deployment={NAME}")["items"]
    arguments = yaml.safe_load(config_map["data"]["tensorrt_llm.1.model.yaml"])
    assert arguments["backend"] == "pytorch" and arguments["pytorch_backend_config"]["kv_cache_dtype"] == "fp8"


def test_the_service_streams_text_through_the_llmapi_model(sandbox, ready_deployment, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "load", "--target", service_target(sandbox, NAME, NAMESPACE),
         "--output-dir", str(tmp_path), "--quiet", "--seed", "5", "--schedule", "constant:2", "--duration-s", "5",
         "--input-tokens", "fixed:128", "--output-tokens", "fixed:16"],
        env=sandbox.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"] >= 8 and summary["completed"] == summary["requests"]
    assert summary["output_tokens"] == 16 * summary["requests"]


def test_a_checkpoint_on_a_claim_is_served_without_the_hub(sandbox, ready_deployment, tmp_path):
    """pvc://<claim>/<path>: weights a team already has on a volume. The prepare Job copies them
    into the engine cache (the sandbox hub is never asked) and the pod serves them."""
    sandbox.apply([{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "weights", "namespace": NAMESPACE},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}],
                  namespace=NAMESPACE)

    def bound():
        claim = sandbox.kubectl_json("get", "pvc", "weights", "-n", NAMESPACE)
        return claim if claim.get("status", {}).get("phase") == "Bound" else None
    claim = wait_for(bound, 30, "the weights claim to be Bound")
    volume = sandbox.kubectl_json("get", "pv", claim["spec"]["volumeName"])
    on_host = sandbox.state_dir / "hostpath" / volume["spec"]["hostPath"]["path"].lstrip("/")
    hub.download("meta-llama/Llama-3.1-8B-Instruct", on_host / "llama-8b")

    local = copy.deepcopy(MANIFEST)
    local["metadata"]["name"] = "local"
    local["spec"]["model"]["source"] = "pvc://weights/llama-8b"
    del local["spec"]["slo"]["quality"]  # only the source's own format: BF16
    sandbox.apply([local], namespace=NAMESPACE)
    status = wait_until_ready(sandbox, "local", NAMESPACE)["status"]
    assert status["plan"]["quantization"] == "BF16"
    (job,) = sandbox.kubectl_json("get", "jobs", "-n", NAMESPACE, "-l", "llmfleet.io/deployment=local")["items"]
    env = {item["name"]: item["value"] for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODEL_SOURCE_DIR"] == "/model-source/llama-8b" and "CHECKPOINT_REPO_ID" not in env
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "load", "--target", service_target(sandbox, "local", NAMESPACE),
         "--output-dir", str(tmp_path), "--quiet", "--schedule", "constant:2", "--duration-s", "3",
         "--input-tokens", "fixed:64", "--output-tokens", "fixed:8"],
        env=sandbox.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout


def test_a_checkpoint_in_an_object_store_is_downloaded_with_the_secrets_credentials(sandbox, operator,
                                                                                     ready_deployment, tmp_path):
    """s3://<bucket>/<prefix>: the Job's init container (the AWS CLI image) syncs the prefix from
    the sandbox's S3 server, which accepts only requests signed with its user's key: the one in
    the Secret that secretRef names. The copy is then served like a checkpoint on a claim."""
    config = configured(sandbox.state_dir)
    hub.download("meta-llama/Llama-3.1-8B-Instruct", tmp_path / "llama-8b")
    objectstore.aws(config, "s3", "mb", "s3://models")
    objectstore.aws(config, "s3", "sync", str(tmp_path / "llama-8b"), "s3://models/llama-8b", "--only-show-errors")
    sandbox.kubectl("create", "secret", "generic", "s3-credentials", "-n", NAMESPACE,
                    f"--from-file=credentials={config.object_store_credentials_file}")

    stored = copy.deepcopy(MANIFEST)
    stored["metadata"]["name"] = "stored"
    stored["spec"]["model"].update(source="s3://models/llama-8b", secretRef={"name": "s3-credentials", "key": "credentials"},
                                   objectStore={"endpointUrl": config.object_store_url})
    del stored["spec"]["slo"]["quality"]  # only the source's own format: BF16
    sandbox.apply([stored], namespace=NAMESPACE)
    status = wait_until_ready(sandbox, "stored", NAMESPACE)["status"]
    assert status["plan"]["quantization"] == "BF16"
    (job,) = sandbox.kubectl_json("get", "jobs", "-n", NAMESPACE, "-l", "llmfleet.io/deployment=stored")["items"]
    (download,) = job["spec"]["template"]["spec"]["initContainers"]
    assert download["image"] == load_client_record().image
    (pod,) = sandbox.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"job-name={job['metadata']['name']}")["items"]
    assert "downloaded s3://models/llama-8b" in sandbox.container_log(pod, "download")
    result = subprocess.run(
        [sys.executable, "-m", "llmfleet", "load", "--target", service_target(sandbox, "stored", NAMESPACE),
         "--output-dir", str(tmp_path / "load"), "--quiet", "--schedule", "constant:2", "--duration-s", "3",
         "--input-tokens", "fixed:64", "--output-tokens", "fixed:8"],
        env=sandbox.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    _assert_secret_appears_nowhere(sandbox, operator, config.object_store_credentials_file, "stored")

    # The store refuses a key it does not know: the same download with a wrong Secret fails.
    wrong = tmp_path / "wrong-credentials"
    wrong.write_text("[default]\naws_access_key_id = AKIAWRONG\naws_secret_access_key = wrong\n")
    with pytest.raises(objectstore.ObjectStoreError, match="InvalidAccessKeyId"):
        objectstore.aws(config, "s3", "ls", "s3://models/llama-8b/", credentials_file=wrong)


def _assert_secret_appears_nowhere(sandbox, operator, credentials_file, name: str) -> None:
    """The Secret's values reach the download container through a mounted file only: not the
    LLMDeployment (spec or status), its children, the events, the operator's log, the
    containers' logs or the apiserver's logs."""
    values = [line.split("=", 1)[1].strip() for line in credentials_file.read_text().splitlines()
              if line.strip().startswith(("aws_access_key_id", "aws_secret_access_key"))]
    assert len(values) == 2 and all(len(value) >= 8 for value in values), "no credentials planted"
    surfaces = {
        "the LLMDeployment": sandbox.kubectl("get", "llmdeployment", name, "-n", NAMESPACE, "-o", "json"),
        "its children": sandbox.kubectl("get", kubectl_kinds(), "-n", NAMESPACE, "-l",
                                        f"llmfleet.io/deployment={name}", "-o", "json"),
        "the events": sandbox.kubectl("get", "events", "-n", NAMESPACE, "-o", "json"),
        **{f"log {path.relative_to(sandbox.state_dir)}": path.read_text(errors="replace")
           for path in [*sandbox.state_dir.glob(f"pods/{NAMESPACE}_*/logs/*.log"),
                        *sandbox.state_dir.glob("logs/kube-apiserver*.log")]},
        "the operator's log": operator.log_path.read_text(errors="replace"),
    }
    leaks = [where for where, text in surfaces.items() if any(value in text for value in values)]
    assert not leaks, f"a credential from the Secret appears in: {leaks}"
    assert any(where.startswith("log pods/") for where in surfaces), "no container log was searched"
