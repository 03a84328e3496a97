"""spec.engine.calibrationDataset: engine builds that calibrate (FP8, INT8 SmoothQuant, INT4 AWQ
weights, a quantised KV cache) read a calibration set the cluster can reach, fetched the way the
weights are; without one, only hf:// weights keep quantize.py's default (cnn_dailymail from the
hub), and a calibrating build with weights elsewhere is refused with a condition naming the field.

The facts (which builds calibrate, what a local directory must hold) come from the release record,
catalog/releases/engine-24.12.yaml quantize.calibration, each with its upstream source."""

from __future__ import annotations

import copy
import re

import pytest
from llmfleet.api import InvalidSpecError, LLMDeployment
from llmfleet.catalog import load_catalog
from llmfleet.catalog.client_record import load_client_record
from llmfleet.catalog.release_record import load_release_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderError, RenderSettings, engine_cache_key, render, revision_hash
from llmfleet_dev.client_checks import check_download_container
from llmfleet_dev.release_checks import check_quantize_command
from reconcile_builders import NOW, SETTINGS, condition, decide_pass
from test_crd import failed_cel_messages

RECORD = load_release_record("engine-24.12")
HUB_WEIGHTS = "hf://meta-llama/Llama-3.1-8B-Instruct"
CLAIM_WEIGHTS = "pvc://weights/llama-3.1-8b"
STORE_WEIGHTS = "s3://models/llama-3.1-8b"
HUB_SET = "hf://datasets/llmfleet-sandbox/calibration-text"
CLAIM_SET = "pvc://datasets/calibration/text"
STORE_SET = "s3://models/calibration/text"
ENDPOINT = "http://minio.storage.svc:9000"


def manifest(source: str = CLAIM_WEIGHTS, dataset: str | None = None, *, quantization: str = "FP8",
             kv_cache_dtype: str = "FP8", runtime: str = "engine") -> dict:
    model = {"name": "llama-3.1-8b", "source": source}
    if source.startswith("s3://"):
        model.update(secretRef={"name": "s3-credentials", "key": "credentials"}, objectStore={"endpointUrl": ENDPOINT})
    elif source.startswith("hf://"):
        model.update(secretRef={"name": "hub-token", "key": "token"})
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": "chat", "namespace": "serving", "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10"},
        "spec": {
            "model": model,
            "engine": {"runtime": runtime, **({"calibrationDataset": dataset} if dataset else {})},
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            "workload": {"inputTokensMean": 512, "inputTokensP99": 2048, "outputTokensMean": 128,
                         "outputTokensP99": 512, "peakRequestsPerSecond": 2},
            "plan": {"gpuType": "H100-SXM-80GB", "tensorParallelSize": 1, "quantization": quantization,
                     "kvCacheDtype": kv_cache_dtype, "replicas": 1},
        },
    }


def planned(raw: dict):
    deployment = LLMDeployment.from_manifest(raw)
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible, chosen.rationale
    return deployment, chosen


def job_pod(raw: dict) -> dict:
    deployment, chosen = planned(raw)
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(), serving_replicas=0)
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    return job["spec"]["template"]["spec"]


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container["env"]}


def quantize_line(script: str) -> str:
    (line,) = [line for line in script.replace("\\\n", " ").splitlines() if '"$QUANTIZE_SCRIPT"' in line]
    return line


def script_passes_a_set(script: str) -> bool:
    """Whether the script gives quantize.py --calib_dataset: it sets `calibration` before the
    quantize line, which passes the flag only when that is set."""
    return bool(re.search(r"^calibration=", script, re.MULTILINE))


# --- the API ------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "dataset"), [(HUB_WEIGHTS, HUB_SET), (CLAIM_WEIGHTS, CLAIM_SET),
                                                 (CLAIM_WEIGHTS, HUB_SET), (STORE_WEIGHTS, STORE_SET),
                                                 (STORE_WEIGHTS, CLAIM_SET)])
def test_a_set_in_each_scheme_is_admitted(source, dataset):
    raw = manifest(source, dataset)
    assert LLMDeployment.from_manifest(raw).spec.engine.calibration_dataset == dataset
    assert failed_cel_messages(raw) == []


@pytest.mark.parametrize(("change", "message"), [
    ({"dataset": "hf://llmfleet-sandbox/calibration-text"},
     "spec.engine.calibrationDataset must be hf://datasets/<org>/<name>"),
    ({"dataset": "https://example.com/calibration.jsonl"}, "spec.engine.calibrationDataset must be hf://datasets/"),
    ({"dataset": "pvc://Datasets/x"}, "spec.engine.calibrationDataset must be hf://datasets/"),
    ({"dataset": "s3://key:secret@models/calibration"}, "spec.engine.calibrationDataset must not embed credentials"),
    ({"dataset": "pvc://datasets/cnn_dailymail"}, "spec.engine.calibrationDataset must not contain 'cnn_dailymail'"),
    ({"dataset": CLAIM_SET, "runtime": "llmapi"}, "spec.engine.calibrationDataset applies only to runtime: engine"),
    ({"dataset": STORE_SET}, "spec.engine.calibrationDataset: an s3:// calibration set is synced with the weights'"),
], ids=["hub-model-uri", "http", "bad-claim", "credentials", "hub-dataset-name", "llmapi", "s3-set-without-s3-weights"])
def test_a_bad_set_is_refused_naming_the_field_and_the_fix(change, message):
    raw = manifest(CLAIM_WEIGHTS, change["dataset"], runtime=change.get("runtime", "engine"))
    with pytest.raises(InvalidSpecError) as raised:
        LLMDeployment.from_manifest(raw)
    assert any(message in text for _, text in raised.value.problems), raised.value.problems
    # The CRD's CEL rules say the same.
    failed = failed_cel_messages(raw)
    assert any(text.startswith(message) for text in failed), failed


# --- render: a set from each scheme, fetched like the weights ------------------------------


def test_a_claim_set_is_mounted_read_only_and_passed_as_a_directory():
    pod = job_pod(manifest(CLAIM_WEIGHTS, CLAIM_SET))
    (main,) = pod["containers"]
    assert {"name": "calibration-source", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}} in pod["volumes"]
    assert {"name": "calibration-source", "mountPath": "/calibration-source", "readOnly": True} in main["volumeMounts"]
    assert env_of(main)["CALIBRATION_SOURCE_DIR"] == "/calibration-source/calibration/text"
    script = main["command"][2]
    assert 'calibration="$CALIBRATION_SOURCE_DIR"\n' in script and script_passes_a_set(script)
    assert '${calibration:+--calib_dataset "$calibration"}' in quantize_line(script)
    assert [c["name"] for c in pod["initContainers"]] == ["upstream-code"]  # nothing to download


def test_a_hub_set_is_downloaded_by_the_build_like_the_weights():
    pod = job_pod(manifest(CLAIM_WEIGHTS, HUB_SET))
    (main,) = pod["containers"]
    assert env_of(main)["CALIBRATION_REPO_ID"] == "llmfleet-sandbox/calibration-text"
    script = main["command"][2]
    assert ('huggingface-cli download "$CALIBRATION_REPO_ID" --repo-type dataset --local-dir "$work/calibration"\n'
            'calibration="$work/calibration"\n') in script
    # Removed with the weights before the entry is published.
    assert 'rm -rf "$work/weights" "$work/calibration"' in script
    assert not any(v["name"] == "calibration-source" for v in pod["volumes"])


def test_an_object_store_set_is_synced_by_its_own_download_container_held_to_the_clients_record():
    pod = job_pod(manifest(STORE_WEIGHTS, STORE_SET))
    names = [c["name"] for c in pod["initContainers"]]
    assert names == ["upstream-code", "download", "download-calibration"]
    weights, calibration = pod["initContainers"][1:]
    for container in (weights, calibration):
        assert check_download_container(load_client_record(), container) == []
    env = env_of(calibration)
    assert (env["CALIBRATION_SOURCE_URI"], env["CALIBRATION_SOURCE_DIR"]) == (STORE_SET, "/calibration-source")
    # The weights' store: the same endpoint and credentials file.
    assert env["S3_ENDPOINT_URL"] == ENDPOINT == env_of(weights)["S3_ENDPOINT_URL"]
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == env_of(weights)["AWS_SHARED_CREDENTIALS_FILE"]
    assert "--exclude" not in calibration["command"][-1]  # only the weights leave out original/
    assert {"name": "calibration-source", "mountPath": "/calibration-source"} in calibration["volumeMounts"]
    (main,) = pod["containers"]
    assert env_of(main)["CALIBRATION_SOURCE_DIR"] == "/calibration-source"
    assert {"name": "calibration-source", "emptyDir": {}} in pod["volumes"]
    assert {"name": "calibration-source", "mountPath": "/calibration-source", "readOnly": True} in main["volumeMounts"]


def test_hub_weights_without_a_set_keep_quantize_pys_default():
    """Today's behaviour: quantize.py downloads cnn_dailymail from the hub the weights come from."""
    (main,) = job_pod(manifest(HUB_WEIGHTS))["containers"]
    script = main["command"][2]
    assert not script_passes_a_set(script)
    assert not {"CALIBRATION_REPO_ID", "CALIBRATION_SOURCE_DIR"} & set(env_of(main))


@pytest.mark.parametrize("source", [CLAIM_WEIGHTS, STORE_WEIGHTS])
@pytest.mark.parametrize(("quantization", "kv_cache_dtype", "named"), [
    ("FP8", "FP8", "FP8 weights (--qformat fp8) and its FP8 KV cache (--kv_cache_dtype fp8)"),
    ("FP8", "BF16", "FP8 weights (--qformat fp8), which"),
    ("INT8SmoothQuant", "BF16", "INT8SmoothQuant weights (--qformat int8_sq)"),
    ("INT4AWQ", "BF16", "INT4AWQ weights (--qformat int4_awq)"),
])
def test_a_calibrating_build_without_a_set_and_without_hub_weights_is_refused(source, quantization, kv_cache_dtype,
                                                                               named):
    deployment, chosen = planned(manifest(source, quantization=quantization, kv_cache_dtype=kv_cache_dtype))
    with pytest.raises(RenderError) as raised:
        render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(), serving_replicas=0)
    message = str(raised.value)
    assert named in message
    for part in ("calibrates on a dataset run through the model", "downloads cnn_dailymail from the Hugging Face hub",
                 f"weights come from {source} may have no hub egress", "Set spec.engine.calibrationDataset",
                 "train split has a text column", "(BF16, FP16, INT8WeightOnly with a BF16 or FP16 KV cache)"):
        assert part in message, part


@pytest.mark.parametrize("source", [CLAIM_WEIGHTS, STORE_WEIGHTS])
@pytest.mark.parametrize("quantization", ["BF16", "FP16", "INT8WeightOnly"])
def test_a_build_that_does_not_calibrate_renders_without_a_set_and_ignores_one(source, quantization):
    kv = "FP16" if quantization == "FP16" else "BF16"
    for dataset in (None, CLAIM_SET):
        pod = job_pod(manifest(source, dataset, quantization=quantization, kv_cache_dtype=kv))
        (main,) = pod["containers"]
        assert not script_passes_a_set(main["command"][2])
        assert not any(v["name"] == "calibration-source" for v in pod["volumes"])
        assert "download-calibration" not in [c["name"] for c in pod.get("initContainers", [])]


def test_a_refusal_becomes_the_render_failed_condition():
    refused = manifest(CLAIM_WEIGHTS)
    refused["metadata"]["generation"] = 1
    outcome = decide_pass(refused, [], SETTINGS, NOW)
    for kind in ("Planned", "Ready"):
        found = condition(outcome, kind)
        assert (found["status"], found["reason"]) == ("False", "RenderFailed"), found
        assert "spec.engine.calibrationDataset" in found["message"] and "FP8" in found["message"]
    assert outcome.apply == []
    with_set = copy.deepcopy(refused)
    with_set["spec"]["engine"]["calibrationDataset"] = CLAIM_SET
    assert condition(decide_pass(with_set, [], SETTINGS, NOW), "Planned")["status"] == "True"


# --- the engine cache key ------------------------------------------------------------------


def key(raw: dict) -> str:
    deployment, chosen = planned(raw)
    return engine_cache_key(deployment.spec, chosen)


def test_the_set_is_an_input_of_the_engine_only_where_the_build_reads_it():
    assert key(manifest(HUB_WEIGHTS)) != key(manifest(HUB_WEIGHTS, HUB_SET)) != key(manifest(HUB_WEIGHTS, CLAIM_SET))
    bf16 = {"quantization": "BF16", "kv_cache_dtype": "BF16"}
    assert key(manifest(HUB_WEIGHTS, **bf16)) == key(manifest(HUB_WEIGHTS, HUB_SET, **bf16))


# --- against the release record -------------------------------------------------------------


def test_the_rendered_flag_is_the_records_and_render_calibrates_exactly_where_the_record_says():
    catalog = load_catalog()
    (main,) = job_pod(manifest(CLAIM_WEIGHTS, CLAIM_SET))["containers"]
    flags = re.findall(r"(?<![\w-])(--[a-z_]+)", quantize_line(main["command"][2]))
    assert RECORD.calibration.flag in flags
    assert check_quantize_command(RECORD, flags, qformat="fp8") == []
    support = RECORD.support
    for quantization in support.quantizations:
        for kv in support.kv_cache_dtypes:
            if support.problem("H100-SXM-80GB", quantization, kv, RECORD.release):
                continue
            calibrates = RECORD.calibrates(catalog.quantization(quantization).qformat,
                                           catalog.kv_cache_dtype(kv).kv_cache_dtype_flag)
            (main,) = job_pod(manifest(CLAIM_WEIGHTS, CLAIM_SET, quantization=quantization,
                                       kv_cache_dtype=kv))["containers"]
            assert script_passes_a_set(main["command"][2]) == calibrates, (quantization, kv)
