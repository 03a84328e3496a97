"""Upstream reference records per pinned release.

A record (``releases/<name>.yaml``) holds facts read from the upstream sources at the pinned tags: the
image, which paths exist in it, each Triton model's parameters and tensors, the flags of the build tools
and the metric names. Every fact carries its ``source``. Render reads the record of the release it
targets; the tests check what it renders against the record with ``llmfleet_dev.release_checks``. Only
``check_model_yaml`` stays here: the sandbox's engine stand-in checks a model.yaml with it at run time,
as the real LLM API rejects one it cannot read.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import yaml

if TYPE_CHECKING:
    from llmfleet.catalog import ModelArch

RELEASES_DIR = "releases"
# Formats a checkpoint is published in as is (no quantisation step).
UNQUANTIZED = ("BF16",)


@dataclass(frozen=True)
class Parameter:
    key: str
    read: str  # required | optional | conditional | ignored | refused | template_only
    type: str
    default: Any = None
    choices: tuple[str, ...] = ()
    note: str = ""
    source: str = ""


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False
    required: bool = False


@dataclass(frozen=True)
class ModelRecord:
    name: str
    backend: str | None
    platform: str | None
    parameters: Mapping[str, Parameter]
    inputs: Mapping[str, Tensor]
    outputs: Mapping[str, Tensor]
    source: str = ""


@dataclass(frozen=True)
class MetricFamily:
    name: str
    labels: Mapping[str, tuple[str, ...] | None]  # label -> allowed values (None: any value)


@dataclass(frozen=True)
class ImagePath:
    path: str
    present: bool
    source: str = ""


@dataclass(frozen=True)
class Executable:
    """A program the image runs by name, found on its PATH."""

    name: str
    present: bool
    source: str = ""


# Where the operator's image keeps the upstream files pods copy (Containerfile, upstream-code).
UPSTREAM_CODE_ROOT = "/opt/llmfleet/upstream"


@dataclass(frozen=True)
class UpstreamFile:
    """A file of an upstream repository at a ref, which pods need and the image lacks."""

    repository: str  # owner/name
    ref: str  # tag or commit
    path: str

    @property
    def image_path(self) -> str:
        """Where the operator's image carries it."""
        return f"{UPSTREAM_CODE_ROOT}/{self.repository.split('/')[1]}/{self.ref}/{self.path}"


# A source cites <owner>/<repo>@<tag or commit>:<path> or a published page (https://...).
CITATION = re.compile(r"[\w.-]+/[\w.-]+@(?P<ref>[\w.-]+):[\w./-]+|https://\S+")
COMMIT = re.compile(r"[0-9a-f]{40}")


def _version(text: str) -> tuple[int, ...]:
    """'0.19.0' -> (0, 19, 0), to compare releases."""
    return tuple(int(part) for part in text.split("."))


@dataclass(frozen=True)
class ArchitectureSupport:
    """Whether a release runs one model architecture (a Hugging Face class, as config.json's
    `architectures` names it) or one architecture feature (an attention kind ModelArch describes),
    with what it takes and, where the release does not, the first TensorRT-LLM release that does."""

    name: str
    served: bool
    needs: str
    source: str
    # Not served here: the first TensorRT-LLM version serving it, and that release's runtime.
    first_served_by: str | None = None
    first_served_runtime: str | None = None
    # A local-attention feature needed only when the context exceeds the window (one chunk of
    # chunked attention is plain causal attention).
    beyond_window_only: bool = False
    established: str | None = None


@dataclass(frozen=True)
class ReleaseRequirement:
    """A model the release cannot run: what it needs and the first release that serves it."""

    model: str
    architecture: str  # the class or feature that is not served
    needs: str
    release: str  # the pinned release that cannot run it
    tensorrt_llm_version: str  # of that release
    runtime: str  # of that release (llmapi | engine)
    first_served_by: str | None
    first_served_runtime: str | None
    source: str
    # Pinned releases (name, TensorRT-LLM version, runtime) that do run it.
    alternatives: tuple[tuple[str, str, str], ...] = ()

    @property
    def message(self) -> str:
        """E.g. "gpt-oss-120b needs ... (GptOssForCausalLM), first served by TensorRT-LLM 1.1.0
        (source); the pinned release llmapi-25.05 (TensorRT-LLM 0.19.0) cannot run it: ..."."""
        first = (f"first served by TensorRT-LLM {self.first_served_by}"
                 + (f" in the {self.first_served_runtime} runtime" if self.first_served_runtime else "")
                 if self.first_served_by else "served by no TensorRT-LLM release recorded here")
        citation = CITATION.search(self.source)
        cited = f" ({citation.group(0)})" if citation else ""
        if self.alternatives:
            name, version, runtime = self.alternatives[0]
            advice = (f"set spec.engine.runtime to {runtime} (its pinned release {name}, TensorRT-LLM {version}, "
                      "runs it; omit spec.engine.image or name that release's image)")
        elif self.first_served_by:
            runtime = self.first_served_runtime or self.runtime
            switch = f"set spec.engine.runtime to {runtime} and " if runtime != self.runtime else ""
            advice = (f"{switch}pin a release with TensorRT-LLM {self.first_served_by} or newer in spec.engine.image "
                      "once one is recorded; none pinned here runs it")
        else:
            advice = "no release pinned here runs it"
        return (f"{self.model} needs {self.needs} ({self.architecture}), {first}{cited}; the pinned release "
                f"{self.release} (TensorRT-LLM {self.tensorrt_llm_version}) cannot run it: {advice}")


@dataclass(frozen=True)
class Calibration:
    """quantize.py's calibration set at the release (quantize.calibration, each fact with its
    source): the flag, its default (a Hugging Face Hub dataset, downloaded at build time), what a
    local directory given instead must hold, and which builds calibrate at all."""

    flag: str
    default: str
    # A --calib_dataset containing this is loaded from the Hub, even when it names a directory.
    hub_dataset_marker: str
    local_split: str
    local_text_column: str
    uncalibrated_qformats: tuple[str, ...]
    # The formats above calibrate after all when a --kv_cache_dtype is given.
    uncalibrated_requires_no_kv_cache_dtype: bool

    def calibrates(self, qformat: str, kv_cache_dtype_flag: str | None) -> bool:
        """Whether quantize.py loads a calibration set for this --qformat and --kv_cache_dtype."""
        if qformat not in self.uncalibrated_qformats:
            return True
        return bool(kv_cache_dtype_flag) and self.uncalibrated_requires_no_kv_cache_dtype


@dataclass(frozen=True)
class ReleaseSupport:
    """What a release can build and run, in catalog names; the planner pairs nothing else."""

    gpu_types: tuple[str, ...]
    quantizations: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    # KV cache dtype -> the only quantisations it builds with (absent: any).
    kv_cache_dtype_requires_quantization: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Formats the release serves only from a published checkpoint, which this model lacks.
    missing_checkpoints: tuple[str, ...] = ()
    checkpoint_source: str = ""
    # Layouts beyond tensor parallelism (support.parallelism, each with its source); absent: none.
    pipeline_parallel: bool = False
    expert_parallel: bool = False
    attention_data_parallel: bool = False
    # Model architectures (support.architectures): by Hugging Face class and by feature, with
    # the release's TensorRT-LLM version and runtime.
    tensorrt_llm_version: str = ""
    runtime: str = ""
    architecture_classes: Mapping[str, ArchitectureSupport] = field(default_factory=dict)
    architecture_features: Mapping[str, ArchitectureSupport] = field(default_factory=dict)

    def unserved_architecture(self, model: "ModelArch", context_tokens: float) -> ArchitectureSupport | None:
        """What of `model` this release does not run with requests of up to `context_tokens`, the
        entry needing the newest release first; None when it runs the model.

        The model's class is looked up where it names one (catalog models); an inline
        architecture names none and is judged by its features alone. A release without
        architecture entries (a test's) runs everything."""
        if not (self.architecture_classes or self.architecture_features):
            return None
        missing = []
        if model.architecture_class:
            entry = self.architecture_classes.get(model.architecture_class)
            if entry is None:
                missing.append(ArchitectureSupport(
                    model.architecture_class, False, f"the {model.architecture_class} model class",
                    "the release record's support.architectures.classes does not list it"))
            elif not entry.served:
                missing.append(entry)
        for feature in model.architecture_features:
            entry = self.architecture_features.get(feature)
            if entry is None or entry.served:
                continue
            if entry.beyond_window_only and context_tokens <= model.local_attention_window_tokens:
                continue
            missing.append(entry)
        return max(missing, key=lambda entry: _version(entry.first_served_by or "999"), default=None)

    def for_checkpoints(self, record: "ReleaseRecord", source_repo: str | None, source: str | None) -> "ReleaseSupport":
        """This support narrowed to the formats the weights can be served in (LLM-API runtime):
        `source_repo` is the hub repo of `source`, None for a source elsewhere (no published
        checkpoints there)."""
        missing = tuple(quantization for quantization in self.quantizations
                        if source_repo is None and quantization not in UNQUANTIZED
                        or source_repo is not None and record.checkpoint_repo(source_repo, quantization) is None)
        return replace(self, missing_checkpoints=missing, checkpoint_source=source_repo or source or "no source")

    def problem(self, gpu_type: str, quantization: str, kv_cache_dtype: str, release: str) -> str | None:
        if gpu_type not in self.gpu_types:
            return f"{release} does not support {gpu_type} (it supports {', '.join(self.gpu_types)})"
        if quantization not in self.quantizations:
            return f"{release} cannot serve {quantization} (it serves {', '.join(self.quantizations)})"
        if quantization in self.missing_checkpoints:
            return (f"{release} serves {quantization} only from a published checkpoint and there is none of "
                    f"{self.checkpoint_source}")
        if kv_cache_dtype not in self.kv_cache_dtypes:
            return f"{release} has no {kv_cache_dtype} KV cache"
        required = self.kv_cache_dtype_requires_quantization.get(kv_cache_dtype)
        if required is not None and quantization not in required:
            return (f"{release} builds a {kv_cache_dtype} KV cache only with "
                    + (", ".join(required) + " weights" if required else "no quantisation at all"))
        return None

    def layout_problem(self, pipeline_parallel_size: int, expert_parallel_size: int, attention_data_parallel: bool,
                       release: str) -> str | None:
        if pipeline_parallel_size > 1 and not self.pipeline_parallel:
            return f"{release} does not build pipeline parallelism"
        if expert_parallel_size > 1 and not self.expert_parallel:
            return f"{release} does not build expert parallelism"
        if attention_data_parallel and not self.attention_data_parallel:
            return f"{release} has no attention data parallelism"
        return None


@dataclass(frozen=True)
class ReleaseRecord:
    release: str
    runtime: str  # llmapi | engine
    image: str
    image_paths: tuple[ImagePath, ...]
    executables: Mapping[str, Executable]
    models: Mapping[str, ModelRecord]
    tritonserver_flags: frozenset[str]
    mpirun_flags: frozenset[str]
    build_flags: frozenset[str]
    build_flags_complete: bool
    quantize_flags: frozenset[str] | None  # None: not established at the tag
    qformat_values: tuple[str, ...]
    metrics: Mapping[str, MetricFamily]
    support: ReleaseSupport
    # LLM-API runtime: the model.yaml keys (key -> its record entry, nested under "keys") and
    # (source repo, quantisation) -> published quantised checkpoint repo.
    model_yaml_keys: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Upstream files the rendered pods copy from the operator's image.
    model_code: tuple[UpstreamFile, ...] = ()
    published_checkpoints: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # quantize.py's calibration set (engine runtime); None: the release runs no quantize.py.
    calibration: Calibration | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def calibrates(self, qformat: str, kv_cache_dtype_flag: str | None) -> bool:
        """Whether this release's build of the format loads a calibration set."""
        return self.calibration is not None and self.calibration.calibrates(qformat, kv_cache_dtype_flag)

    def checkpoint_repo(self, source_repo: str, quantization: str) -> str | None:
        """The repo to serve `quantization` of `source_repo` from: the source itself unquantised,
        a published checkpoint otherwise (None when there is none)."""
        if quantization in UNQUANTIZED:
            return source_repo
        return self.published_checkpoints.get((source_repo, quantization))

    def image_path(self, path: str) -> ImagePath | None:
        """The recorded entry for ``path`` or for the recorded directory that contains it."""
        best = None
        for entry in self.image_paths:
            base = entry.path.rstrip("/")
            if path == base or path.startswith(base + "/"):
                if best is None or len(base) > len(best.path.rstrip("/")):
                    best = entry
        return best


def _tensor(raw: Mapping[str, Any]) -> Tensor:
    return Tensor(name=raw["name"], data_type=raw["data_type"], dims=tuple(raw["dims"]),
                  optional=bool(raw.get("optional", False)), required=bool(raw.get("required", False)))


def _model(name: str, raw: Mapping[str, Any]) -> ModelRecord:
    parameters = {p["key"]: Parameter(key=p["key"], read=p["read"], type=p["type"], default=p.get("default"),
                                      choices=tuple(p.get("choices") or ()), note=p.get("note", ""),
                                      source=p.get("source", ""))
                  for p in raw.get("parameters") or ()}
    return ModelRecord(name=name, backend=raw.get("backend"), platform=raw.get("platform"), parameters=parameters,
                       inputs={t["name"]: _tensor(t) for t in raw.get("inputs") or ()},
                       outputs={t["name"]: _tensor(t) for t in raw.get("outputs") or ()},
                       source=raw.get("template_source", ""))


def _flag_names(raw_flags: Iterable[Any]) -> set[str]:
    names: set[str] = set()
    for flag in raw_flags:
        if isinstance(flag, str):
            names.add(flag)
        else:
            names.add(flag["name"])
            names.update(flag.get("aliases") or ())
    return names


def parse_record(raw: Mapping[str, Any]) -> ReleaseRecord:
    """Build a record from its YAML mapping (the layout of releases/engine-24.12.yaml)."""
    metrics: dict[str, MetricFamily] = {}
    raw_metrics = raw.get("metrics") or {}
    common = tuple(raw_metrics.get("common_labels") or ())
    for family in raw_metrics.get("families") or ():
        labels: dict[str, tuple[str, ...] | None] = {label: None for label in common}
        labels[family["label"]] = tuple(family["values"])
        metrics[family["name"]] = MetricFamily(name=family["name"], labels=labels)
    for family in raw_metrics.get("triton_core") or ():
        metrics[family["name"]] = MetricFamily(name=family["name"],
                                               labels={label: None for label in family.get("labels") or ()})
    build = raw.get("trtllm_build") or {}
    quantize = raw.get("quantize") or {}
    return ReleaseRecord(
        release=raw["release"],
        runtime=raw["runtime"],
        image=raw["image"]["name"],
        image_paths=tuple(ImagePath(path=p["path"], present=bool(p["present"]), source=p.get("source", ""))
                          for p in raw.get("image_paths") or ()),
        executables={e["name"]: Executable(name=e["name"], present=bool(e["present"]), source=e.get("source", ""))
                     for e in raw.get("executables") or ()},
        models={name: _model(name, model) for name, model in (raw.get("models") or {}).items()},
        tritonserver_flags=frozenset((raw.get("tritonserver") or {}).get("flags") or ()),
        mpirun_flags=frozenset((raw.get("mpirun") or {}).get("flags") or ()),
        build_flags=frozenset(_flag_names([*(build.get("flags") or ()), *(build.get("plugin_flags") or ())])),
        build_flags_complete=bool(build.get("plugin_flags_established", True)),
        quantize_flags=(frozenset(_flag_names(quantize.get("flags") or ()))
                        if quantize.get("flags_established", False) else None),
        qformat_values=tuple(quantize.get("qformat_values") or ()),
        metrics=metrics,
        support=_support(raw.get("support") or {},
                         str(((raw.get("versions") or {}).get("tensorrt_llm") or {}).get("value", "")), raw["runtime"]),
        model_code=tuple(UpstreamFile(entry["repository"], entry["ref"], entry["path"])
                         for entry in (raw.get("model_code") or {}).get("files") or ()),
        model_yaml_keys={entry["key"]: entry for entry in (raw.get("model_yaml") or {}).get("keys") or ()},
        published_checkpoints={(entry["source_repo"], entry["quantization"]): entry["repo"]
                               for entry in (raw.get("published_checkpoints") or {}).get("checkpoints") or ()},
        calibration=_calibration(quantize.get("calibration")),
        raw=raw,
    )


CALIBRATION_SOURCES = ("default_source", "loader_source", "calibrates_source")


def _calibration(raw: Mapping[str, Any] | None) -> Calibration | None:
    if raw is None:
        return None
    for key in CALIBRATION_SOURCES:
        if not str(raw.get(key, "")).strip():
            raise ValueError(f"quantize.calibration has no {key}")
    local = raw["local_directory"]
    return Calibration(
        flag=raw["flag"], default=raw["default"], hub_dataset_marker=raw["hub_dataset_marker"],
        local_split=local["split"], local_text_column=local["text_column"],
        uncalibrated_qformats=tuple(raw.get("uncalibrated_qformats") or ()),
        uncalibrated_requires_no_kv_cache_dtype=bool(raw.get("uncalibrated_requires_no_kv_cache_dtype", True)))


def _architecture(key: str, raw: Mapping[str, Any], record_version: str) -> ArchitectureSupport:
    """One support.architectures entry, its facts checked: a cited source, a served flag, and for
    what the release does not serve the newer release that does."""
    name = str(raw.get(key) or "")
    where = f"support.architectures {key} {name or '(unnamed)'}"
    source = str(raw.get("source") or "")
    if not name or not isinstance(raw.get("served"), bool) or not str(raw.get("needs") or "").strip():
        raise ValueError(f"{where}: needs {key}, served (true or false) and needs")
    if not CITATION.search(source):
        raise ValueError(f"{where}: source cites no <owner>/<repo>@<ref>:<path> or https:// page: {source!r}")
    cites_snapshot = any(COMMIT.fullmatch(match.group("ref") or "") for match in CITATION.finditer(source))
    if cites_snapshot and not raw.get("established"):
        raise ValueError(f"{where}: cites a stored commit, not a tag; say how it was established "
                         "(established: nearest stored snapshot)")
    first = raw.get("first_served_by")
    if raw["served"] and first is not None:
        raise ValueError(f"{where}: served here, so no first_served_by")
    if first is not None and _version(str(first)) <= _version(record_version):
        raise ValueError(f"{where}: first_served_by {first} is not newer than this release's {record_version}")
    return ArchitectureSupport(
        name=name, served=raw["served"], needs=str(raw["needs"]).strip(), source=source,
        first_served_by=str(first) if first is not None else None,
        first_served_runtime=raw.get("first_served_runtime"),
        beyond_window_only=bool(raw.get("beyond_window_only", False)), established=raw.get("established"))


def _support(raw: Mapping[str, Any], tensorrt_llm_version: str = "", runtime: str = "") -> ReleaseSupport:
    parallelism = raw.get("parallelism") or {}
    for kind in ("pipeline", "expert", "attention_data_parallel"):
        if parallelism.get(kind) is not None and not str(parallelism.get(f"{kind}_source", "")).strip():
            raise ValueError(f"support.parallelism.{kind} has no {kind}_source")
    architectures = raw.get("architectures") or {}
    classes = [_architecture("class", entry, tensorrt_llm_version) for entry in architectures.get("classes") or ()]
    features = [_architecture("feature", entry, tensorrt_llm_version)
                for entry in architectures.get("features") or ()]
    return ReleaseSupport(
        tensorrt_llm_version=tensorrt_llm_version,
        runtime=runtime,
        architecture_classes={entry.name: entry for entry in classes},
        architecture_features={entry.name: entry for entry in features},
        pipeline_parallel=bool(parallelism.get("pipeline")),
        expert_parallel=bool(parallelism.get("expert")),
        attention_data_parallel=bool(parallelism.get("attention_data_parallel")),
        gpu_types=tuple(raw.get("gpu_types") or ()),
        quantizations=tuple(raw.get("quantizations") or ()),
        kv_cache_dtypes=tuple(raw.get("kv_cache_dtypes") or ()),
        kv_cache_dtype_requires_quantization={kv: tuple(quants) for kv, quants in
                                              (raw.get("kv_cache_dtype_requires_quantization") or {}).items()})


@functools.lru_cache(maxsize=None)
def load_release_record(name: str = "engine-24.12") -> ReleaseRecord:
    text = resources.files(__package__).joinpath(RELEASES_DIR, f"{name}.yaml").read_text(encoding="utf-8")
    return parse_record(yaml.safe_load(text))


# The pinned release of each runtime: what an LLMDeployment without spec.engine.image gets.
RUNTIME_RELEASES = {"llmapi": "llmapi-25.05", "engine": "engine-24.12"}


def release_requirement(release: str, support: ReleaseSupport, model: "ModelArch",
                        context_tokens: float) -> ReleaseRequirement | None:
    """Why `release` (with `support`, as the planner may have narrowed it) cannot run `model` with
    requests of up to `context_tokens`, with the release that first can and the other pinned
    releases that do; None when it runs it."""
    entry = support.unserved_architecture(model, context_tokens)
    if entry is None:
        return None
    alternatives = tuple(
        (other.release, other.support.tensorrt_llm_version, other.runtime)
        for other in map(load_release_record, release_names())
        if other.release != release and other.support.unserved_architecture(model, context_tokens) is None)
    return ReleaseRequirement(
        model=model.name, architecture=entry.name, needs=entry.needs, release=release,
        tensorrt_llm_version=support.tensorrt_llm_version, runtime=support.runtime, first_served_by=entry.first_served_by,
        first_served_runtime=entry.first_served_runtime, source=entry.source, alternatives=alternatives)


class ReleaseError(ValueError):
    """An image that is not a pinned release of the runtime; the message says what is."""


def image_tag(image: str) -> str:
    """`<registry>/<path>:<tag>` -> tag ('' when untagged); registry ports are not tags."""
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def release_for(runtime: str, image: str | None) -> ReleaseRecord:
    """The record behind a runtime and image. The image is matched by tag, so a mirror of the
    pinned image in another registry is the same release; None is the runtime's pinned one."""
    if image is None:
        return load_release_record(RUNTIME_RELEASES[runtime])
    records = [record for record in map(load_release_record, release_names())
               if image_tag(record.image) == image_tag(image)]
    for record in records:
        if record.runtime == runtime:
            return record
    pinned = ", ".join(f"{image_tag(load_release_record(name).image)} ({load_release_record(name).runtime})"
                       for name in release_names())
    if records:
        raise ReleaseError(f"image tag {image_tag(image)!r} has no {runtime} runtime among the pinned "
                           f"releases: {pinned}")
    raise ReleaseError(f"image tag {image_tag(image) or '(none)'!r} is not a pinned release: {pinned}; "
                       "use one of these tags, or omit spec.engine.image")


@functools.lru_cache(maxsize=None)
def release_names() -> tuple[str, ...]:
    """Every pinned release with a record, by name (read once: every reconcile resolves one)."""
    return tuple(sorted(entry.name.removesuffix(".yaml")
                        for entry in resources.files(__package__).joinpath(RELEASES_DIR).iterdir()
                        if entry.name.endswith(".yaml")))


def release_for_image(image: str) -> ReleaseRecord | None:
    """The record of the release whose pinned image is ``image``; None for an unpinned image."""
    return next((record for record in map(load_release_record, release_names()) if record.image == image), None)


_YAML_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "mapping": dict}


def check_model_yaml(record: ReleaseRecord, data: Mapping[str, Any]) -> list[str]:
    """A rendered LLM-API model.yaml against the record: every key known at its level, of its type."""
    return _check_yaml_keys(record.model_yaml_keys, data, "model.yaml")


def _check_yaml_keys(known: Mapping[str, Mapping[str, Any]], data: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    for key, value in data.items():
        entry = known.get(key)
        if entry is None:
            problems.append(f"{where}: unknown key {key!r} (known: {', '.join(known)})")
            continue
        kind = entry["type"]
        if kind == "enum":
            if value not in entry["choices"]:
                problems.append(f"{where}: {key} is {value!r}, not one of {', '.join(map(str, entry['choices']))}")
        elif not isinstance(value, _YAML_TYPES[kind]) or (kind != "bool" and isinstance(value, bool)):
            problems.append(f"{where}: {key} is {type(value).__name__}, the record says {kind}")
        elif kind == "mapping":
            problems += _check_yaml_keys({sub["key"]: sub for sub in entry.get("keys") or ()}, value, f"{where}:{key}")
    return problems
