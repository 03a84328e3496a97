"""The Job that fills an engine cache entry: for the engine runtime, quantise the weights and run
trtllm-build; for the llmapi runtime, fetch the checkpoint the PyTorch backend loads.

The Job is idempotent: it exits 0 at once when its cache entry already has the completion
marker, so many revisions (and LLMDeployments) sharing build inputs build once; Jobs racing on
one entry leave the first complete one in place.
"""

from __future__ import annotations

from typing import Any

from llmfleet.api import LLMDeployment, Runtime, hub_dataset_id, hub_repo_id, in_object_store, volume_source
from llmfleet.api.spec import (
    CALIBRATION_DATASET_FIELD,
    CALIBRATION_DATASET_SOURCES,
    HUGGING_FACE_SCHEME,
    SOURCE_REQUIRED_MESSAGE,
)
from llmfleet.api.spec.engine import CALIBRATION_DATASET_FORMAT
from llmfleet.catalog import load_catalog
from llmfleet.catalog.client_record import load_client_record
from llmfleet.catalog.release_record import ReleaseRecord, UpstreamFile
from llmfleet.gpu_discovery import GPU_RESOURCE
from llmfleet.planner.types import Plan
from llmfleet.render import layout, llmapi, pod
from llmfleet.render.identity import build_calibrates, serving_image
from llmfleet.render.settings import RenderError, RenderSettings

COMPONENT = "engine-build"
CONTAINER = "engine-build"
PREPARE_CONTAINER = "prepare"
QUANTIZE_SCRIPT = "examples/quantization/quantize.py"
UPSTREAM_CODE_VOLUME = "upstream-code"
UPSTREAM_CODE_PATH = "/upstream-code"
# A download: a couple of cores for hashing and decompression, memory for buffers.
PREPARE_CPU = 2
PREPARE_MEMORY_GIB = 8
TOKEN_VOLUME = "model-token"
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 32

# Runs in the Triton image. Values come from the container's environment (visible in the
# Job). The work directory sits on the cache volume, so publishing is one rename: an entry is
# written once, complete (marker included), and never deleted, since serving pods may read it.
# Two Jobs with one key can both produce it; the second rename fails on the non-empty entry
# and that Job keeps the first one's. `{produce}` fills "$work" for the runtime.
PUBLISH_SCRIPT = """set -eu
entry="$ENGINE_CACHE_DIR/$ENGINE_CACHE_KEY"
marker="{marker}"
if [ -f "$entry/$marker" ]; then
  echo "$ENGINE_CACHE_KEY is already in the cache; nothing to do"
  exit 0
fi
work="$entry.partial-$HOSTNAME"
rm -rf "$work"
mkdir -p "$work"
{produce}touch "$work/$marker"
if [ -d "$entry" ] && [ ! -f "$entry/$marker" ]; then
  # Left by an interrupted build of an older operator: incomplete, so no pod reads it.
  stale="$entry.stale-$HOSTNAME"
  mv -T "$entry" "$stale" && rm -rf "$stale"
fi
if mv -T "$work" "$entry" 2>/dev/null; then
  echo "$ENGINE_CACHE_KEY is ready"
elif [ -f "$entry/$marker" ]; then
  rm -rf "$work"
  echo "$ENGINE_CACHE_KEY was published by another Job meanwhile; keeping that one"
else
  echo "cannot publish $work as $entry" >&2
  exit 1
fi
"""
# How the weights arrive in "$weights", by source: downloaded from the hub (the Llama repos'
# `original/`, Meta-format weights, is not needed for a Hugging Face checkpoint), or read in
# place from the mounted claim.
HUB_WEIGHTS = """huggingface-cli download "$MODEL_REPO_ID" --exclude 'original/*' --local-dir "$work/weights"
weights="$work/weights"
"""
VOLUME_WEIGHTS = """weights="$MODEL_SOURCE_DIR"
"""
HUB_TOKENIZER = f"""huggingface-cli download "$TOKENIZER_REPO_ID" --include '*.json' 'tokenizer.model' \\
  --exclude '*.index.json' --local-dir "$work/{layout.TOKENIZER_SUBDIR}"
"""
VOLUME_TOKENIZER = f"""mkdir -p "$work/{layout.TOKENIZER_SUBDIR}"
find "$MODEL_SOURCE_DIR" -maxdepth 1 -type f \\( -name '*.json' ! -name '*.index.json' -o -name tokenizer.model \\) \\
  -exec cp {{}} "$work/{layout.TOKENIZER_SUBDIR}/" \\;
"""
# How the calibration set arrives in "$calibration" (spec.engine.calibrationDataset), by source,
# as the weights do: a hub dataset repo downloaded, a claim's directory or an s3:// download read in
# place. Unset (no calibrating build, or hf:// weights and quantize.py's default from the hub), the
# build passes no --calib_dataset.
CALIBRATION_SUBDIR = "calibration"
HUB_CALIBRATION = f"""huggingface-cli download "$CALIBRATION_REPO_ID" --repo-type dataset --local-dir "$work/{CALIBRATION_SUBDIR}"
calibration="$work/{CALIBRATION_SUBDIR}"
"""
VOLUME_CALIBRATION = """calibration="$CALIBRATION_SOURCE_DIR"
"""
# The engine runtime: quantize.py and trtllm-build. The timing cache goes to the work directory
# because the working directory is read-only.
ENGINE_BUILD = f"""python3 "$QUANTIZE_SCRIPT" --model_dir "$weights" --dtype "$DTYPE" --qformat "$QFORMAT" \\
  ${{KV_CACHE_DTYPE:+--kv_cache_dtype "$KV_CACHE_DTYPE"}} ${{calibration:+--calib_dataset "$calibration"}} \\
  --tp_size "$TP_SIZE" --pp_size "$PP_SIZE" --output_dir "$work/checkpoint"
trtllm-build --checkpoint_dir "$work/checkpoint" --output_dir "$work/{layout.ENGINE_SUBDIR}" \\
  --max_batch_size "$MAX_BATCH_SIZE" --max_input_len "$MAX_INPUT_LEN" --max_seq_len "$MAX_SEQ_LEN" \\
  --max_num_tokens "$MAX_NUM_TOKENS" --kv_cache_type paged --use_paged_context_fmha enable \\
  --gemm_plugin auto --output_timing_cache "$work/timing.cache"
rm -rf "$work/weights" "$work/{CALIBRATION_SUBDIR}" "$work/checkpoint" "$work/timing.cache"
"""
# The LLM-API runtime: the checkpoint as published (or as on the claim), loaded as is by the
# PyTorch backend.
HUB_CHECKPOINT = f"""huggingface-cli download "$CHECKPOINT_REPO_ID" --exclude 'original/*' \\
  --local-dir "$work/{layout.CHECKPOINT_SUBDIR}"
"""
VOLUME_CHECKPOINT = f"""mkdir -p "$work/{layout.CHECKPOINT_SUBDIR}"
cp -R "$MODEL_SOURCE_DIR/." "$work/{layout.CHECKPOINT_SUBDIR}/"
"""
MODEL_SOURCE_VOLUME = "model-source"
MODEL_SOURCE_PATH = "/model-source"
DOWNLOAD_CONTAINER = "download"
# The calibration set's volume (its claim, or the emptyDir its s3:// prefix is synced into) and
# that download's init container.
CALIBRATION_SOURCE_VOLUME = "calibration-source"
CALIBRATION_SOURCE_PATH = "/calibration-source"
CALIBRATION_DOWNLOAD_CONTAINER = "download-calibration"
# The weights' download leaves out Meta's own-format copy in the Llama repos (unused here).
WEIGHTS_SYNC_EXCLUDE = "original/*"


def object_store_download(variable: str, exclude: str | None = None) -> str:
    """The script of an init container in the object-store client's image, before the Job's main
    container: the s3:// prefix in $<variable>_URI is synced into $<variable>_DIR (an emptyDir),
    then read like a directory on a claim. Skipped when the cache entry is complete, where the main
    container does nothing either."""
    skip = "" if exclude is None else f" --exclude '{exclude}'"
    return f"""set -eu
if [ -f "$ENGINE_CACHE_DIR/$ENGINE_CACHE_KEY/{layout.BUILD_COMPLETE_MARKER}" ]; then
  echo "$ENGINE_CACHE_KEY is already in the cache; nothing to download"
  exit 0
fi
aws s3 sync "${variable}_URI" "${variable}_DIR"{skip} --only-show-errors \\
  ${{S3_ENDPOINT_URL:+--endpoint-url "$S3_ENDPOINT_URL"}}
echo "downloaded ${variable}_URI"
"""


OBJECT_STORE_DOWNLOAD = object_store_download("MODEL_SOURCE", WEIGHTS_SYNC_EXCLUDE)
CALIBRATION_DOWNLOAD = object_store_download("CALIBRATION_SOURCE")


def publish_script(produce: str) -> str:
    return PUBLISH_SCRIPT.format(marker=layout.BUILD_COMPLETE_MARKER, produce=produce)



def _hub_repo_id(uri: str, field: str) -> str:
    repo_id = hub_repo_id(uri)
    if repo_id is None:
        raise RenderError(f"{field} {uri!r}: the tokenizer is downloaded from the Hugging Face hub; use an "
                          f"{HUGGING_FACE_SCHEME}<org>/<repo> URI or a bare hub id")
    return repo_id


def _weights_repo_id(deployment: LLMDeployment) -> str:
    source = deployment.spec.model.source
    if source is None:
        raise RenderError(SOURCE_REQUIRED_MESSAGE)
    return _hub_repo_id(source, "spec.model.source")


def _tokenizer_repo_id(deployment: LLMDeployment, weights_repo_id: str | None) -> str | None:
    """The hub repo of the tokenizer; None: it is read from the weights on the claim."""
    tokenizer = deployment.spec.model.tokenizer
    if tokenizer is None:
        return weights_repo_id
    # A bare hub id is accepted as well as a URI (the API allows both).
    return _hub_repo_id(tokenizer, "spec.model.tokenizer") if "://" in tokenizer else tokenizer


def _env(pairs: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in pairs.items()]


def _token_env(deployment: LLMDeployment) -> dict[str, str]:
    """For the main container: the hub token's file (an s3:// source's credentials go to the
    download container instead)."""
    model = deployment.spec.model
    if model.secret_ref is None or in_object_store(model.source):
        return {}
    # huggingface_hub reads the token from this file; the token never enters the spec.
    return {"HF_TOKEN_PATH": f"{layout.MODEL_TOKEN_PATH}/{layout.MODEL_TOKEN_FILE}"}


def _quantize_script(release: ReleaseRecord) -> UpstreamFile:
    script = next((file for file in release.model_code if file.path.endswith(QUANTIZE_SCRIPT)), None)
    if script is None:
        raise RenderError(f"{release.release}'s record names no {QUANTIZE_SCRIPT} to build engines with")
    return script


def _upstream_code(release: ReleaseRecord, settings: RenderSettings) -> dict[str, Any]:
    """Init container: quantize.py (not in the Triton image) from the operator's image."""
    return {
        "name": "upstream-code",
        "image": settings.model_code_image,
        "command": ["/bin/bash", "-c", f'cp "{_quantize_script(release).image_path}" "{UPSTREAM_CODE_PATH}/"'],
        "volumeMounts": [{"name": UPSTREAM_CODE_VOLUME, "mountPath": UPSTREAM_CODE_PATH}],
        **pod.container_defaults(),
    }


def _has_local_source(deployment: LLMDeployment) -> bool:
    """Whether the main container reads the weights from the model-source volume (a claim, or
    the download of an s3:// source) rather than the hub."""
    source = deployment.spec.model.source
    return volume_source(source) is not None or in_object_store(source)


def _source_env(deployment: LLMDeployment) -> dict[str, str]:
    """Where the weights are for the script: the claim's directory, or the downloaded prefix."""
    source = deployment.spec.model.source
    if in_object_store(source):
        return {"MODEL_SOURCE_DIR": MODEL_SOURCE_PATH}
    claim = volume_source(source)
    return {} if claim is None else {"MODEL_SOURCE_DIR": f"{MODEL_SOURCE_PATH}/{claim[1]}"}


def _download_container(deployment: LLMDeployment, key: str, settings: RenderSettings, *, name: str = DOWNLOAD_CONTAINER,
                        variable: str = "MODEL_SOURCE", uri: str | None = None, volume: str = MODEL_SOURCE_VOLUME,
                        path: str = MODEL_SOURCE_PATH, script: str = OBJECT_STORE_DOWNLOAD) -> dict[str, Any]:
    """Init container: sync an s3:// prefix (the weights, or the calibration set) into its volume
    with the AWS CLI, authenticated by the credentials file from secretRef (else the client's
    default chain), at spec.model.objectStore's endpoint and region."""
    model = deployment.spec.model
    options = model.object_store
    env = {
        "ENGINE_CACHE_DIR": layout.ENGINE_CACHE_PATH,
        "ENGINE_CACHE_KEY": key,
        f"{variable}_URI": model.source if uri is None else uri,
        f"{variable}_DIR": path,
        **({"S3_ENDPOINT_URL": options.endpoint_url} if options and options.endpoint_url else {}),
        **({"AWS_DEFAULT_REGION": options.region} if options and options.region else {}),
        **({"AWS_SHARED_CREDENTIALS_FILE": f"{layout.MODEL_TOKEN_PATH}/{layout.OBJECT_STORE_CREDENTIALS_FILE}"}
           if model.secret_ref else {}),
    }
    token_mounts = _token_volume(deployment)[1]
    return {
        "name": name,
        "image": settings.object_store_client_image,
        "command": [load_client_record().shell, "-c", script],
        "env": pod.writable_home_env() + _env(env),
        "resources": {"requests": {"cpu": str(PREPARE_CPU), "memory": f"{PREPARE_MEMORY_GIB}Gi"}},
        "volumeMounts": [pod.engine_cache_mount(read_only=True), pod.tmp_mount(), *token_mounts,
                         {"name": volume, "mountPath": path}],
        **pod.container_defaults(),
    }


def calibration_dataset(deployment: LLMDeployment, plan: Plan, release: ReleaseRecord) -> str | None:
    """The calibration set the build passes to quantize.py (spec.engine.calibrationDataset); None
    when the build calibrates nothing, or with hf:// weights and no set, where quantize.py
    downloads its default from the hub as it always did. A calibrating build whose weights come
    from elsewhere and that names no set is refused: that cluster may have no hub egress."""
    if not build_calibrates(deployment.spec, plan):
        return None
    dataset = deployment.spec.engine.calibration_dataset
    source = deployment.spec.model.source
    if dataset is not None or hub_repo_id(source) is not None:
        return dataset
    if source is None:
        raise RenderError(SOURCE_REQUIRED_MESSAGE)
    raise RenderError(_no_calibration_set(plan, release, source))


def _no_calibration_set(plan: Plan, release: ReleaseRecord, source: str) -> str:
    catalog = load_catalog()
    calibration = release.calibration
    assert calibration is not None  # build_calibrates: only a release that runs quantize.py calibrates
    qformat = catalog.quantization(plan.quantization).qformat
    kv_flag = catalog.kv_cache_dtype(plan.kv_cache_dtype).kv_cache_dtype_flag
    calibrated = ([f"{plan.quantization} weights (--qformat {qformat})"] if calibration.calibrates(qformat, None) else []) + (
        [f"its {plan.kv_cache_dtype} KV cache (--kv_cache_dtype {kv_flag})"] if kv_flag else [])
    plain = [name for name in release.support.quantizations
             if not calibration.calibrates(catalog.quantization(name).qformat, None)]
    plain_kv = [name for name in release.support.kv_cache_dtypes if not catalog.kv_cache_dtype(name).kv_cache_dtype_flag]
    return (f"the plan's engine build quantises {' and '.join(calibrated)}, which {release.release}'s quantize.py "
            f"calibrates on a dataset run through the model; without {calibration.flag} it downloads "
            f"{calibration.default} from the Hugging Face hub at build time, and a cluster whose weights come "
            f"from {source} may have no hub egress. Set {CALIBRATION_DATASET_FIELD} to {CALIBRATION_DATASET_SOURCES}, "
            f"a directory holding {CALIBRATION_DATASET_FORMAT}; or leave the planner only formats that need no "
            f"calibration ({', '.join(plain)} with a {' or '.join(plain_kv)} KV cache) in "
            "spec.slo.quality.allowedQuantizations and spec.resources.allowedKvCacheDtypes")


def _calibration_env(dataset: str | None) -> dict[str, str]:
    """Where the calibration set is for the script: its hub repo, its claim's directory, or the
    downloaded prefix."""
    repo = hub_dataset_id(dataset)
    if repo is not None:
        return {"CALIBRATION_REPO_ID": repo}
    if in_object_store(dataset):
        return {"CALIBRATION_SOURCE_DIR": CALIBRATION_SOURCE_PATH}
    claim = volume_source(dataset)
    return {} if claim is None else {"CALIBRATION_SOURCE_DIR": f"{CALIBRATION_SOURCE_PATH}/{claim[1]}"}


def _calibration_script(dataset: str | None) -> str:
    if dataset is None:
        return ""
    return HUB_CALIBRATION if hub_dataset_id(dataset) is not None else VOLUME_CALIBRATION


def _build_container(deployment: LLMDeployment, plan: Plan, key: str, dataset: str | None) -> dict[str, Any]:
    catalog = load_catalog()
    spec = deployment.spec
    on_volume = _has_local_source(deployment)
    weights = None if on_volume else _weights_repo_id(deployment)
    tokenizer = _tokenizer_repo_id(deployment, weights)
    env = {
        "ENGINE_CACHE_DIR": layout.ENGINE_CACHE_PATH,
        "ENGINE_CACHE_KEY": key,
        **({} if weights is None else {"MODEL_REPO_ID": weights}),
        **_source_env(deployment),
        **({} if tokenizer is None else {"TOKENIZER_REPO_ID": tokenizer}),
        **_calibration_env(dataset),
        "QUANTIZE_SCRIPT": f"{UPSTREAM_CODE_PATH}/{QUANTIZE_SCRIPT.rsplit('/', 1)[1]}",
        # Unquantised parts keep the precision the plan names (FP16 only when asked for).
        "DTYPE": "float16" if plan.quantization == "FP16" else "bfloat16",
        "QFORMAT": catalog.quantization(plan.quantization).qformat,
        "KV_CACHE_DTYPE": catalog.kv_cache_dtype(plan.kv_cache_dtype).kv_cache_dtype_flag or "",
        "TP_SIZE": str(plan.tensor_parallel_size),
        "PP_SIZE": str(plan.pipeline_parallel_size),
        "MAX_BATCH_SIZE": str(spec.engine.max_batch_size),
        "MAX_INPUT_LEN": str(spec.engine.max_input_len),
        "MAX_SEQ_LEN": str(spec.engine.max_seq_len),
        "MAX_NUM_TOKENS": str(spec.engine.max_num_tokens),
        **_token_env(deployment),
    }
    script = publish_script((VOLUME_WEIGHTS if on_volume else HUB_WEIGHTS)
                            + (VOLUME_TOKENIZER if tokenizer is None else HUB_TOKENIZER)
                            + _calibration_script(dataset) + ENGINE_BUILD)
    return {"command": ["/bin/bash", "-c", script], "env": pod.writable_home_env() + _env(env)}


def _prepare_container(deployment: LLMDeployment, plan: Plan, key: str, release: ReleaseRecord) -> dict[str, Any]:
    on_volume = _has_local_source(deployment)
    env = {
        "ENGINE_CACHE_DIR": layout.ENGINE_CACHE_PATH,
        "ENGINE_CACHE_KEY": key,
        **({} if on_volume else {"CHECKPOINT_REPO_ID": llmapi.checkpoint_repo_id(deployment.spec, plan, release)}),
        **_source_env(deployment),
        **_token_env(deployment),
    }
    script = publish_script(VOLUME_CHECKPOINT if on_volume else HUB_CHECKPOINT)
    return {"command": ["/bin/bash", "-c", script], "env": pod.writable_home_env() + _env(env)}


def _uri_volume(uri: str | None, name: str, path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, main container's read-only mounts) for what `uri` names: a pvc:// claim, or the
    emptyDir an s3:// prefix is downloaded into; none for the hub or no URI."""
    claim = volume_source(uri)
    if claim is not None:
        volume = {"name": name, "persistentVolumeClaim": {"claimName": claim[0], "readOnly": True}}
    elif in_object_store(uri):
        volume = {"name": name, "emptyDir": {}}
    else:
        return [], []
    return [volume], [{"name": name, "mountPath": path, "readOnly": True}]


def _source_volume(deployment: LLMDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The weights' volume and mount."""
    return _uri_volume(deployment.spec.model.source, MODEL_SOURCE_VOLUME, MODEL_SOURCE_PATH)


def _calibration_volume(dataset: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calibration set's volume and mount."""
    return _uri_volume(dataset, CALIBRATION_SOURCE_VOLUME, CALIBRATION_SOURCE_PATH)


def _token_volume(deployment: LLMDeployment) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) for the hub token Secret, mounted as a file; none without secretRef."""
    ref = deployment.spec.model.secret_ref
    if ref is None:
        return [], []
    file = (layout.OBJECT_STORE_CREDENTIALS_FILE if in_object_store(deployment.spec.model.source)
            else layout.MODEL_TOKEN_FILE)
    volume = {"name": TOKEN_VOLUME, "secret": {
        "secretName": ref.name,
        "items": [{"key": ref.key, "path": file}],
        "defaultMode": 0o440,
    }}
    return [volume], [{"name": TOKEN_VOLUME, "mountPath": layout.MODEL_TOKEN_PATH, "readOnly": True}]


def engine_build_job(deployment: LLMDeployment, plan: Plan, key: str, metadata: dict[str, Any],
                     settings: RenderSettings, release: ReleaseRecord) -> dict[str, Any]:
    """The Job that fills the cache entry: an engine build on the plan's GPUs (engine runtime),
    or a checkpoint download on CPU (llmapi runtime: the PyTorch backend needs no build)."""
    builds = release.runtime == Runtime.ENGINE.value
    # One node's GPUs at most: a pod cannot span nodes, and trtllm-build builds one rank at a
    # time (--workers defaults to 1 in the record).
    gpus = pod.gpus_per_pod(plan) if builds else 0
    downloads = in_object_store(deployment.spec.model.source)
    dataset = calibration_dataset(deployment, plan, release) if builds else None
    token_volumes, token_mounts = _token_volume(deployment)
    source_volumes, source_mounts = _source_volume(deployment)
    calibration_volumes, calibration_mounts = _calibration_volume(dataset)
    init_containers = ([_upstream_code(release, settings)] if builds else []) + (
        [_download_container(deployment, key, settings)] if downloads else []) + (
        [_download_container(deployment, key, settings, name=CALIBRATION_DOWNLOAD_CONTAINER,
                             variable="CALIBRATION_SOURCE", uri=dataset, volume=CALIBRATION_SOURCE_VOLUME,
                             path=CALIBRATION_SOURCE_PATH, script=CALIBRATION_DOWNLOAD)]
        if in_object_store(dataset) else [])
    requests = ({"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_PER_GPU_GIB * gpus}Gi",
                 GPU_RESOURCE: str(gpus)} if builds else
                {"cpu": str(PREPARE_CPU), "memory": f"{PREPARE_MEMORY_GIB}Gi"})
    job_container = {
        "name": CONTAINER if builds else PREPARE_CONTAINER,
        "image": serving_image(deployment.spec),
        **(_build_container(deployment, plan, key, dataset) if builds
           else _prepare_container(deployment, plan, key, release)),
        "resources": {"requests": requests, **({"limits": {GPU_RESOURCE: str(gpus)}} if builds else {})},
        "volumeMounts": [pod.engine_cache_mount(read_only=False), pod.tmp_mount(),
                         *([] if downloads else token_mounts), *source_mounts, *calibration_mounts,
                         *([{"name": UPSTREAM_CODE_VOLUME, "mountPath": UPSTREAM_CODE_PATH, "readOnly": True}]
                           if builds else [])],
        **pod.container_defaults(),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": settings.engine_build_backoff_limit,
            "template": {
                "metadata": {"labels": dict(metadata["labels"])},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": pod.pod_security_context(),
                    **(pod.gpu_scheduling(plan, deployment.spec.resources, gpus) if builds else {}),
                    **pod.image_pull_secrets(settings),
                    **({"initContainers": init_containers} if init_containers else {}),
                    "containers": [job_container],
                    "volumes": [pod.engine_cache_volume(settings, read_only=False), pod.tmp_volume(),
                                *token_volumes, *source_volumes, *calibration_volumes,
                                *([{"name": UPSTREAM_CODE_VOLUME, "emptyDir": {}}] if builds else [])],
                },
            },
        },
    }
