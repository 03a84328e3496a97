"""s3:// model sources: admitted with a clear error when malformed, downloaded by the AWS CLI image
in the Job's init container (held to the client's upstream record), with the Secret's credentials
file, then read like a checkpoint on a claim."""

from __future__ import annotations

import copy
import subprocess

import pytest
from llmfleet.api import InvalidSpecError, LLMDeployment
from llmfleet.catalog.client_record import load_client_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, render, revision_hash
from llmfleet.render.layout import BUILD_COMPLETE_MARKER
from llmfleet_dev.client_checks import check_download_container
from llmfleet_sandbox.images import resolve

RECORD = load_client_record()
SOURCE = "s3://models/llama-3.1-8b"
ENDPOINT = "http://minio.storage.svc:9000"


def manifest(runtime: str = "llmapi", **model) -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10"},
        "spec": {
            "model": {"name": "llama-3.1-8b", "source": SOURCE,
                      "secretRef": {"name": "s3-credentials", "key": "credentials"},
                      "objectStore": {"endpointUrl": ENDPOINT, "region": "eu-west-1"}, **model},
            # The engine build calibrates (FP8): its set comes from the same store.
            "engine": {"runtime": runtime,
                       **({"calibrationDataset": "s3://models/calibration"} if runtime == "engine" else {})},
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            "workload": {"inputTokensMean": 512, "inputTokensP99": 2048, "outputTokensMean": 128,
                         "outputTokensP99": 512, "peakRequestsPerSecond": 2},
            "resources": {"allowedGpuTypes": ["H100-SXM-80GB"]},
        },
    }


def job_of(raw: dict, settings: RenderSettings = RenderSettings()) -> dict:
    deployment = LLMDeployment.from_manifest(raw)
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible, chosen.rationale
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), settings, serving_replicas=1)
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    return job["spec"]["template"]["spec"]


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"]}


@pytest.mark.parametrize("runtime", ["llmapi", "engine"])
def test_the_download_runs_before_the_job_and_matches_the_clients_record(runtime):
    pod = job_of(manifest(runtime))
    (download,) = [container for container in pod["initContainers"] if container["name"] == "download"]
    assert check_download_container(RECORD, download) == []
    env = env_of(download)
    assert (env["MODEL_SOURCE_URI"], env["S3_ENDPOINT_URL"], env["AWS_DEFAULT_REGION"]) == (SOURCE, ENDPOINT,
                                                                                         "eu-west-1")
    # The credentials file reaches only the download, as a file; the main container reads the copy.
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == "/var/run/secrets/llmfleet/model-token/credentials"
    (secret,) = [volume["secret"] for volume in pod["volumes"] if "secret" in volume]
    assert secret["secretName"] == "s3-credentials"
    assert secret["items"] == [{"key": "credentials", "path": "credentials"}]
    (main,) = pod["containers"]
    assert all(mount["name"] != "model-token" for mount in main["volumeMounts"])
    assert env_of(main)["MODEL_SOURCE_DIR"] == "/model-source" and "MODEL_REPO_ID" not in env_of(main)
    assert {"name": "model-source", "emptyDir": {}} in pod["volumes"]
    assert {"name": "model-source", "mountPath": "/model-source", "readOnly": True} in main["volumeMounts"]
    assert {"name": "model-source", "mountPath": "/model-source"} in download["volumeMounts"]


def test_without_a_secret_or_endpoint_the_clients_own_chain_and_aws_apply():
    raw = manifest()
    del raw["spec"]["model"]["secretRef"], raw["spec"]["model"]["objectStore"]
    pod = job_of(raw)
    (download,) = pod["initContainers"]
    env = env_of(download)
    assert not {"AWS_SHARED_CREDENTIALS_FILE", "S3_ENDPOINT_URL", "AWS_DEFAULT_REGION"} & set(env)
    assert not any("secret" in volume for volume in pod["volumes"])


def test_the_record_check_catches_a_flag_image_or_variable_the_client_lacks():
    download = job_of(manifest())["initContainers"][-1]
    wrong_flag = copy.deepcopy(download)
    wrong_flag["command"][-1] = wrong_flag["command"][-1].replace("--only-show-errors", "--only-errors")
    assert check_download_container(RECORD, wrong_flag) == ["aws s3 sync: flag --only-errors not in the record"]
    wrong_image = {**download, "image": "amazon/aws-cli:1.0.0"}
    assert "is not the recorded" in check_download_container(RECORD, wrong_image)[0]
    wrong_env = {**download, "env": [*download["env"], {"name": "AWS_ENDPOINT", "value": ENDPOINT}]}
    assert check_download_container(RECORD, wrong_env) == [
        "environment: AWS_ENDPOINT is not a variable the client reads"]


def test_a_mirror_of_the_client_image_is_rendered_as_configured():
    settings = RenderSettings(object_store_client_image="mirror.example/aws/aws-cli:2.36.7")
    assert job_of(manifest(), settings)["initContainers"][-1]["image"] == "mirror.example/aws/aws-cli:2.36.7"


def test_a_complete_cache_entry_downloads_nothing(tmp_path):
    """The script exits before calling the client when the entry is there (no `aws` on PATH)."""
    download = job_of(manifest())["initContainers"][-1]
    env = env_of(download)
    (tmp_path / env["ENGINE_CACHE_KEY"]).mkdir()
    (tmp_path / env["ENGINE_CACHE_KEY"] / BUILD_COMPLETE_MARKER).touch()
    result = subprocess.run(["/bin/bash", "-c", download["command"][-1]], capture_output=True, text=True,
                            env={**env, "ENGINE_CACHE_DIR": str(tmp_path), "PATH": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    assert "already in the cache; nothing to download" in result.stdout


@pytest.mark.parametrize(("change", "message"), [
    ({"source": "s3://Models/llama"}, "spec.model.source must be hf://"),
    ({"source": "s3://ab/llama"}, "spec.model.source must be hf://"),
    ({"source": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "spec.model.objectStore applies only to an s3://"),
    ({"objectStore": {"endpointUrl": "minio:9000"}}, "spec.model.objectStore.endpointUrl: String should match"),
    ({"objectStore": {"endpointUrl": "ftp://minio:9000"}}, "endpointUrl must be an http:// or https:// URL"),
    ({"objectStore": {"endpointUrl": "http://key:secret@minio:9000"}}, "endpointUrl must not embed credentials"),
])
def test_bad_object_store_settings_are_refused_naming_the_field(change, message):
    raw = manifest()
    raw["spec"]["model"].update(change)
    with pytest.raises(InvalidSpecError, match=message):
        LLMDeployment.from_manifest(raw)


def test_the_sandbox_runs_the_aws_cli_image_as_its_entrypoint(tmp_path):
    image = resolve(RECORD.image, tmp_path)
    assert image.argv([], ["--version"]) == [RECORD.entrypoint, "--version"]
    assert RECORD.entrypoint in image.files
