"""Golden files and properties of the rendered workload (llmfleet.render).

Regenerate the golden files with UPDATE_GOLDEN=1 after an intended change, and review the diff.
"""

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from llmfleet.api import LLMDeployment
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.catalog.release_record import load_release_record
from llmfleet.render import RenderError, RenderSettings, engine_cache_key, render, revision_hash
from llmfleet.render.model_repo import KV_CACHE_FREE_GPU_MEM_FRACTION, model_repository_files
from llmfleet.render.pod import engine_cache_claim
from render_builders import manifest
from llmfleet_dev.release_checks import (
    check_build_command,
    check_image_paths,
    check_model_code_paths,
    check_model_repository,
    check_mpirun_command,
    check_quantize_command,
    check_tritonserver_command,
)

GOLDEN_DIR = Path(__file__).parent / "golden" / "render"
RENDER_PACKAGE = Path(__file__).parents[1] / "llmfleet" / "render"
FORBIDDEN_IMPORTS = ("kopf", "kubernetes", "prometheus_api_client", "requests", "http", "urllib",
                     "socket", "tritonclient", "time", "datetime", "subprocess", "os")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
REQUIRED_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                   "llmfleet.io/deployment")
REAL = RenderSettings()
RECORD = load_release_record()


def deployment_and_plan(tensor_parallel_size: int, **kwargs):
    deployment = LLMDeployment.from_manifest(manifest(tensor_parallel_size, **kwargs))
    chosen = plan(plan_request_from_spec(deployment.spec))
    assert chosen.feasible, chosen.rationale
    return deployment, chosen


def rendered(tensor_parallel_size: int, settings: RenderSettings, *, serving_replicas: int = 0, **kwargs):
    deployment, chosen = deployment_and_plan(tensor_parallel_size, **kwargs)
    return render(deployment, chosen, revision_hash(deployment.spec, chosen), settings,
                  serving_replicas=serving_replicas)


class GoldenDumper(yaml.SafeDumper):
    """Multi-line strings (config.pbtxt, scripts) as literal blocks, so golden diffs read well."""


GoldenDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


CASES = {
    "real-tp1": (1, REAL),
    "real-tp2": (2, REAL),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    tensor_parallel_size, settings = CASES[case]
    text = yaml.dump_all(rendered(tensor_parallel_size, settings), Dumper=GoldenDumper, sort_keys=False, width=100)
    golden = GOLDEN_DIR / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing; run with UPDATE_GOLDEN=1 to create it"
    assert text == golden.read_text(), f"render output differs from {golden}; if intended, UPDATE_GOLDEN=1"


def all_objects():
    return [obj for tp, settings in CASES.values() for obj in rendered(tp, settings)]


def pod_specs(objects):
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj["spec"]["template"]["spec"]


def test_every_object_is_owned_labelled_and_namespaced():
    for obj in all_objects():
        metadata = obj["metadata"]
        assert metadata["namespace"] == "serving"
        (owner,) = metadata["ownerReferences"]
        assert owner == {"apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment", "name": "chat",
                         "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10", "controller": True,
                         "blockOwnerDeletion": True}
        for label in REQUIRED_LABELS:
            assert metadata["labels"][label], (obj["kind"], label)
        if obj["kind"] != "Service":
            assert metadata["labels"]["llmfleet.io/revision"]


def test_objects_and_names():
    deployment, chosen = deployment_and_plan(1)
    revision = revision_hash(deployment.spec, chosen)
    objects = render(deployment, chosen, revision, REAL, serving_replicas=3)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", f"chat-{revision}-model-repo"),
        ("Job", f"chat-{revision}-engine-build"),
        ("Deployment", f"chat-{revision}"),
        ("Service", "chat"),
        ("PodDisruptionBudget", f"chat-{revision}"),
    ]
    assert objects[2]["spec"]["replicas"] == 3
    assert objects[3]["spec"]["selector"] == {"llmfleet.io/deployment": "chat", "app.kubernetes.io/component": "server"}
    assert objects[4]["spec"]["maxUnavailable"] == 1


def test_serving_selectors_pick_the_serving_pods_never_the_engine_builds():
    """A PodDisruptionBudget that also counts the build Job's pod cannot compute its expected
    pods (a Job has no scale subresource); a Service that selects it routes to no server."""
    body = manifest(1)
    body["spec"]["networkPolicy"] = {"metricsScrapers": [{"podSelector": {}}]}
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "gateway"}]}}
    deployment = LLMDeployment.from_manifest(body)
    chosen = plan(plan_request_from_spec(deployment.spec))
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), REAL, serving_replicas=1)

    def pod_labels(kind):
        return next(o for o in objects if o["kind"] == kind)["spec"]["template"]["metadata"]["labels"]

    selectors = {(o["kind"], o["metadata"]["name"]): (o["spec"].get("selector") or o["spec"].get("podSelector"))
                 for o in objects if o["kind"] in ("Service", "PodDisruptionBudget", "NetworkPolicy")}
    assert len(selectors) == 4  # the Service, the revision's Service, the budget, the policy
    for selector in selectors.values():
        match_labels = selector.get("matchLabels", selector)
        assert match_labels.items() <= pod_labels("Deployment").items()
        assert not match_labels.items() <= pod_labels("Job").items()


def test_long_names_are_cut_to_valid_distinct_labels():
    long_a, long_b = "a" * 60 + "-one", "a" * 60 + "-two"
    names = set()
    for name in (long_a, long_b):
        for obj in rendered(1, REAL, name=name):
            assert len(obj["metadata"]["name"]) <= 63 and DNS_LABEL.match(obj["metadata"]["name"])
            assert all(len(value) <= 63 for value in obj["metadata"]["labels"].values())
            names.add((obj["kind"], obj["metadata"]["name"]))
    assert len(names) == 10


def test_no_inline_secrets_and_token_mounted_as_file():
    for obj in all_objects():
        text = json.dumps(obj)
        assert "secretKeyRef" not in text and "envFrom" not in text
        assert not re.search(r'"name": "(HF_TOKEN|HUGGING_FACE_HUB_TOKEN)"', text)
    real_job = rendered(1, REAL)[1]
    pod = real_job["spec"]["template"]["spec"]
    token = next(v for v in pod["volumes"] if v["name"] == "model-token")
    assert token["secret"]["secretName"] == "hub-token"
    assert token["secret"]["items"] == [{"key": "token", "path": "token"}]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["HF_TOKEN_PATH"] == "/var/run/secrets/llmfleet/model-token/token"


def test_security_context_on_every_container():
    for pod in pod_specs(all_objects()):
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_gpu_requests_and_scheduling(tensor_parallel_size):
    for pod in pod_specs(rendered(tensor_parallel_size, REAL)):
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == str(tensor_parallel_size)
        (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        expressions = {e["key"]: e for e in term["matchExpressions"]}
        assert expressions["nvidia.com/gpu.product"]["values"] == ["NVIDIA-H100-80GB-HBM3"]
        assert expressions["nvidia.com/gpu.count"] == {"key": "nvidia.com/gpu.count", "operator": "Gt",
                                                       "values": [str(tensor_parallel_size - 1)]}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_a_priority_class_reaches_every_gpu_pod_and_none_is_set_without_one():
    assert all("priorityClassName" not in pod for pod in pod_specs(rendered(1, REAL)))
    body = manifest(1)
    body["spec"]["resources"] = {"priorityClassName": "inference-critical"}
    deployment = LLMDeployment.from_manifest(body)
    chosen = plan(plan_request_from_spec(deployment.spec))
    pods = list(pod_specs(render(deployment, chosen, revision_hash(deployment.spec, chosen), REAL,
                                 serving_replicas=1)))
    assert len(pods) == 2 and all(pod["priorityClassName"] == "inference-critical" for pod in pods)


def test_triton_command_single_and_multi_gpu():
    single = rendered(1, REAL)[2]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert single[0] == "tritonserver"
    for flag in ("--model-repository=/models", "--model-control-mode=none", "--exit-on-error=true",
                 "--strict-readiness=true", "--http-port=8000", "--grpc-port=8001", "--metrics-port=8002",
                 "--metrics-config=histogram_latencies=true"):
        assert flag in single
    assert check_tritonserver_command(RECORD, single[1:]) == []
    for tensor_parallel_size in (2, 4):
        multi = rendered(tensor_parallel_size, REAL)[2]["spec"]["template"]["spec"]["containers"][0]["command"]
        # The rank group in the foreground: mpirun is the container's main process.
        assert multi[0] == "mpirun" and multi.count("tritonserver") == tensor_parallel_size
        assert check_mpirun_command(RECORD, multi, "tensorrt_llm") == []
        rank_zero = multi[:multi.index(":")]
        # Rank 0 serves with the single-GPU flags, plus its shared-memory prefix.
        assert rank_zero[rank_zero.index("tritonserver") + 1:] == single[1:] + [
            "--backend-config=python,shm-region-prefix-name=prefix0_"]


def test_the_mpirun_check_fails_for_a_launcher_like_command():
    wrong = ["mpirun", "--allow-run-as-root", "-n", "1", "tritonserver", "--model-repository=/m", ":",
             "-n", "1", "tritonserver", "--model-repository=/m", "--world_size=2"]
    problems = check_mpirun_command(RECORD, wrong, "tensorrt_llm")
    assert "tritonserver: unknown flag --world_size" in problems
    assert "rank 1: missing --load-model=tensorrt_llm" in problems
    assert "rank 0: missing --backend-config=python,shm-region-prefix-name=prefix0_" in problems


def test_engine_build_flags_follow_the_plan():
    script_env = {e["name"]: e["value"]
                  for e in rendered(2, REAL)[1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert script_env["QFORMAT"] == "fp8" and script_env["KV_CACHE_DTYPE"] == "fp8"
    assert script_env["TP_SIZE"] == "2" and script_env["PP_SIZE"] == "1"
    assert script_env["MODEL_REPO_ID"] == "meta-llama/Llama-3.1-8B-Instruct"
    script = rendered(2, REAL)[1]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    for flag in ("--kv_cache_type paged", "--use_paged_context_fmha enable", "--gemm_plugin auto",
                 "--max_num_tokens", "--tp_size", "BUILD_COMPLETE"):
        assert flag in script
    bf16 = {e["name"]: e["value"] for e in
            rendered(1, REAL, quantization="BF16")[1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert bf16["QFORMAT"] == "full_prec" and bf16["DTYPE"] == "bfloat16"


def _script_flags(script: str, program: str) -> list[str]:
    """The --flags of the script's `program` line (continuations joined), `${VAR:+--flag ...}` included."""
    (line,) = [line for line in script.replace("\\\n", " ").splitlines() if program in line.split()[:2]]
    return re.findall(r"(?<![\w-])(--[a-z_]+)", line)


def test_model_code_comes_from_the_operator_image_at_the_backend_tag():
    (init,) = rendered(1, REAL)[2]["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == REAL.model_code_image
    copied = [line.split('"')[1] for line in init["command"][2].splitlines() if line.startswith('cp "')]
    assert copied == ["/opt/llmfleet/upstream/tensorrtllm_backend/v0.16.0/all_models/inflight_batcher_llm/"
                      f"{model}/1/model.py" for model in ("preprocessing", "postprocessing")]
    assert check_model_code_paths(RECORD, copied) == []
    # Nothing the serving or build containers run relies on a path the record says is absent.
    assert not any("/app/" in line for line in init["command"][2].splitlines())


def test_no_triton_container_relies_on_a_path_the_image_lacks():
    """Every absolute path a container of the pinned image names, in its command or environment,
    that the record knows about must be recorded present (e.g. nothing under /app)."""
    for tensor_parallel_size in (1, 2):
        containers = [container for obj in rendered(tensor_parallel_size, REAL) if obj["kind"] in ("Job", "Deployment")
                      for container in obj["spec"]["template"]["spec"]["containers"]]
        assert {container["image"] for container in containers} == {RECORD.image}
        texts = [" ".join(container["command"]) + " " + json.dumps(container.get("env", []))
                 for container in containers]
        paths = {path for text in texts for path in re.findall(r"(?<![\w$])/[\w./-]+", text)}
        assert check_image_paths(RECORD, [path for path in paths if RECORD.image_path(path)]) == []
        assert check_image_paths(RECORD, ["/app/scripts/launch_triton_server.py"])  # the check can fail


def test_engine_build_commands_use_only_the_records_flags():
    script = rendered(2, REAL)[1]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    build, quantize = _script_flags(script, "trtllm-build"), _script_flags(script, '"$QUANTIZE_SCRIPT"')
    assert "--output_timing_cache" in build and "--kv_cache_dtype" in quantize
    assert check_build_command(RECORD, build) == []
    assert check_quantize_command(RECORD, quantize, qformat="fp8") == []
    assert check_build_command(RECORD, build + ["--use_magic_plugin"]) == ["trtllm-build: unknown flag --use_magic_plugin"]


def test_tensorrt_llm_config_carries_the_plan():
    deployment, chosen = deployment_and_plan(1)
    config = rendered(1, REAL)[0]["data"]["tensorrt_llm.config.pbtxt"]
    key = engine_cache_key(deployment.spec, chosen)
    for line in ('backend: "tensorrtllm"', "max_batch_size: 256", "decoupled: true",
                 f'string_value: "/engines/{key}/engine"', 'string_value: "inflight_fused_batching"',
                 f'string_value: "{KV_CACHE_FREE_GPU_MEM_FRACTION}"', 'family: "nv_inference_first_response_histogram_ms"'):
        assert line in config
    assert re.search(r'key: "enable_kv_cache_reuse"\n  value \{\n    string_value: "true"', config)


@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_model_repository_matches_the_pinned_release_record(tensor_parallel_size):
    """Checked against upstream facts (catalog/releases/engine-24.12.yaml, each with its source),
    not against our own output: every parameter and tensor the image's models read is there."""
    deployment, chosen = deployment_and_plan(tensor_parallel_size)
    files = model_repository_files(deployment.spec, engine_cache_key(deployment.spec, chosen))
    assert check_model_repository(load_release_record(), files) == []


def test_volume_items_cover_every_config_map_key():
    for tensor_parallel_size in (1, 2):
        objects = rendered(tensor_parallel_size, REAL)
        config_map, deployment = objects[0], objects[2]
        (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
        items = volume["configMap"]["items"]
        assert sorted(i["key"] for i in items) == sorted(config_map["data"])
        assert all("/" not in key for key in config_map["data"])


def test_engine_cache_claim_is_shared_and_unowned():
    claim = engine_cache_claim("serving", REAL)
    assert claim["metadata"]["name"] == "llmfleet-engine-cache" and claim["metadata"]["namespace"] == "serving"
    assert "ownerReferences" not in claim["metadata"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and "storageClassName" not in claim["spec"]
    custom = engine_cache_claim("serving", RenderSettings(engine_cache_claim_name="engines",
                                                          engine_cache_storage_class="nfs", engine_cache_size="2Ti"))
    assert custom["spec"]["storageClassName"] == "nfs"
    assert custom["spec"]["resources"]["requests"]["storage"] == "2Ti"
    for pod_spec in pod_specs(rendered(1, RenderSettings(engine_cache_claim_name="engines"))):
        (volume,) = [v for v in pod_spec["volumes"] if "persistentVolumeClaim" in v]
        assert volume["persistentVolumeClaim"]["claimName"] == "engines"


def test_render_knows_nothing_of_the_sandbox():
    for path in RENDER_PACKAGE.glob("*.py"):
        text = path.read_text().lower()
        assert "sandbox" not in text and "emulat" not in text, path.name


def test_rendering_is_deterministic_across_processes():
    """Two processes with different hash seeds (so set and dict orders may differ) render the
    same bytes: a revision renders alike on every operator replica and after every restart."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from test_render import CASES, rendered; "
            "print(json.dumps([rendered(*case) for case in CASES.values()]))")
    outputs = {subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True,
                              text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2")}
    assert len(outputs) == 1 and json.loads(next(iter(outputs)))


def test_revision_hash_follows_the_engine_not_the_scale():
    deployment, chosen = deployment_and_plan(1)
    base = revision_hash(deployment.spec, chosen)
    assert re.fullmatch(r"[0-9a-f]{10}", base)
    assert revision_hash(deployment.spec, replace(chosen, replicas=7)) == base
    scaled = manifest(1)
    scaled["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 2, "maxReplicas": 9}
    del scaled["spec"]["plan"]["replicas"]
    assert revision_hash(LLMDeployment.from_manifest(scaled).spec, chosen) == base
    assert revision_hash(deployment.spec, replace(chosen, quantization="BF16")) != base
    assert revision_hash(deployment.spec, replace(chosen, kv_cache_dtype="BF16")) != base
    assert revision_hash(deployment.spec, replace(chosen, tensor_parallel_size=2)) != base
    rebuilt = manifest(1)
    rebuilt["spec"]["engine"] = {"maxNumTokens": 4096}
    assert revision_hash(LLMDeployment.from_manifest(rebuilt).spec, chosen) != base
    assert engine_cache_key(deployment.spec, chosen) == engine_cache_key(deployment.spec, replace(chosen, replicas=7))


def test_bad_inputs_are_refused_with_a_reason():
    deployment, chosen = deployment_and_plan(1)
    with pytest.raises(RenderError, match="feasible"):
        render(deployment, replace(chosen, feasible=False), "r", REAL, serving_replicas=0)
    anonymous = LLMDeployment.from_manifest({**manifest(1), "metadata": {"name": "chat"}})
    with pytest.raises(RenderError, match="namespace, uid"):
        render(anonymous, chosen, "r", REAL, serving_replicas=0)
    sourceless = manifest(1)
    del sourceless["spec"]["model"]["source"]
    with pytest.raises(RenderError, match=r"spec.model.source is required to serve: hf://<org>/<repo> .*, pvc://.* or s3://"):
        render(LLMDeployment.from_manifest(sourceless), chosen, "r", REAL, serving_replicas=0)


def test_render_is_a_pure_layer():
    for path in RENDER_PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert module.split(".")[0] not in FORBIDDEN_IMPORTS, f"{path.name} imports {module}"


# --- spec.networkPolicy ---------------------------------------------------------------------------

def with_network_policy(policy: dict, settings: RenderSettings = REAL) -> dict:
    body = manifest(1)
    body["spec"]["networkPolicy"] = policy
    deployment = LLMDeployment.from_manifest(body)
    chosen = plan(plan_request_from_spec(deployment.spec))
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), settings, serving_replicas=1)
    (policy_object,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    serving = next(o for o in objects if o["kind"] == "Deployment")
    pod_labels = serving["spec"]["template"]["metadata"]["labels"]
    selected = policy_object["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= pod_labels.items(), "the policy selects the serving pods"
    assert "llmfleet.io/revision" not in selected, "one policy covers every revision"
    return policy_object


PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def test_a_network_policy_lets_in_only_the_clients_the_operator_and_the_scrapers():
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}},
               "podSelector": {"matchLabels": {"app": "envoy"}}}
    policy = with_network_policy({"clients": [gateway], "metricsScrapers": [PROMETHEUS]},
                                 replace(REAL, operator_namespace="llmfleet-system"))
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    inference, metrics = policy["spec"]["ingress"]
    assert inference["from"] == [gateway, {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "llmfleet-system"}}}]
    assert sorted(p["port"] for p in inference["ports"]) == [8000, 8001]
    assert metrics == {"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 8002}]}


def test_with_an_inference_pool_its_endpoint_pickers_may_read_the_metrics_port():
    body = manifest(1)
    body["spec"]["networkPolicy"] = {"clients": [{"podSelector": {"matchLabels": {"app": "envoy"}}}],
                                     "metricsScrapers": [PROMETHEUS]}
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference"}]}, "inferencePool": {}}
    deployment = LLMDeployment.from_manifest(body)
    chosen = plan(plan_request_from_spec(deployment.spec))
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), REAL, serving_replicas=1)
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    (picker,) = [o for o in objects if o["kind"] == "Deployment" and "epp" in o["metadata"]["name"]]
    inference, metrics = policy["spec"]["ingress"]
    assert metrics["from"][0] == PROMETHEUS
    (picker_peer,) = metrics["from"][1:]
    picker_pod_labels = picker["spec"]["template"]["metadata"]["labels"]
    assert picker_peer["podSelector"]["matchLabels"].items() <= picker_pod_labels.items()
    assert picker_peer not in inference["from"]  # pickers read metrics; the gateway sends the requests


def test_without_clients_the_namespaces_own_pods_may_send_requests():
    policy = with_network_policy({"metricsScrapers": [PROMETHEUS]})
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {}}]  # no operator namespace known


def test_an_empty_client_list_admits_no_client_rather_than_every_source():
    policy = with_network_policy({"clients": [], "metricsScrapers": [PROMETHEUS]})  # no operator namespace
    assert policy["spec"]["ingress"] == [{"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 8002}]}]


def test_without_a_network_policy_none_is_rendered():
    assert not [o for o in rendered(1, REAL) if o["kind"] == "NetworkPolicy"]
