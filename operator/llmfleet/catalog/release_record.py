"""Upstream reference records per pinned release, and a pure checker of rendered workloads against them.

A record (``releases/<name>.yaml``) holds facts read from the upstream sources at the pinned tags: the
image, which paths exist in it, each Triton model's parameters and tensors, the flags of the build tools
and the metric names. Every fact carries its ``source``. The checker compares what render produces
(config.pbtxt texts, commands, metric queries) with the record and returns human-readable mismatches;
it never fixes anything and does no I/O besides loading the packaged record.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, Iterable, Mapping

import yaml

RELEASES_DIR = "releases"
# Formats a checkpoint is published in as is (no quantisation step).
UNQUANTIZED = ("BF16",)
PY_BOOL_WORDS = ("true", "false", "1", "0", "t", "f", "y", "n", "yes", "no")
CPP_BOOL_WORDS = ("True", "true", "TRUE", "1", "False", "false", "FALSE", "0")


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


@dataclass(frozen=True)
class ReleaseRecord:
    release: str
    runtime: str  # llmapi | engine
    image: str
    image_paths: tuple[ImagePath, ...]
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
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

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
        models={name: _model(name, model) for name, model in (raw.get("models") or {}).items()},
        tritonserver_flags=frozenset((raw.get("tritonserver") or {}).get("flags") or ()),
        mpirun_flags=frozenset((raw.get("mpirun") or {}).get("flags") or ()),
        build_flags=frozenset(_flag_names([*(build.get("flags") or ()), *(build.get("plugin_flags") or ())])),
        build_flags_complete=bool(build.get("plugin_flags_established", True)),
        quantize_flags=(frozenset(_flag_names(quantize.get("flags") or ()))
                        if quantize.get("flags_established", False) else None),
        qformat_values=tuple(quantize.get("qformat_values") or ()),
        metrics=metrics,
        support=_support(raw.get("support") or {}),
        model_code=tuple(UpstreamFile(entry["repository"], entry["ref"], entry["path"])
                         for entry in (raw.get("model_code") or {}).get("files") or ()),
        model_yaml_keys={entry["key"]: entry for entry in (raw.get("model_yaml") or {}).get("keys") or ()},
        published_checkpoints={(entry["source_repo"], entry["quantization"]): entry["repo"]
                               for entry in (raw.get("published_checkpoints") or {}).get("checkpoints") or ()},
        raw=raw,
    )


def _support(raw: Mapping[str, Any]) -> ReleaseSupport:
    return ReleaseSupport(
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


# --- a reader for the protobuf text subset that render.pbtxt writes ----------------------------------

_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<punct>[{}\[\]:,])|(?P<word>[^\s{}\[\]:,"]+))')


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = re.sub(r"(?m)#.*$", "", text)
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"cannot read pbtxt near {text[pos:pos + 20]!r}")
            break
        pos = match.end()
        kind = match.lastgroup
        tokens.append((kind, match.group(kind)))
    return tokens


def _scalar(kind: str, value: str) -> Any:
    if kind == "str":
        return ast.literal_eval(value)
    if value in ("true", "false"):
        return value == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value  # an enum symbol such as TYPE_INT32


def _add(message: dict[str, Any], name: str, value: Any) -> None:
    if name in message:
        existing = message[name]
        if not isinstance(existing, list) or not existing or not isinstance(existing[0], dict):
            existing = [existing]
        message[name] = existing + (value if isinstance(value, list) else [value])
    else:
        message[name] = value


def _message(tokens: list[tuple[str, str]], i: int, closing: str | None) -> tuple[dict[str, Any], int]:
    message: dict[str, Any] = {}
    while i < len(tokens):
        kind, value = tokens[i]
        if closing is not None and value == closing and kind == "punct":
            return message, i + 1
        name = value
        i += 1
        if tokens[i][1] == ":":
            i += 1
        kind, value = tokens[i]
        if value == "{":
            sub, i = _message(tokens, i + 1, "}")
            _add(message, name, [sub])
        elif value == "[":
            items, i = [], i + 1
            while tokens[i][1] != "]":
                if tokens[i][1] == ",":
                    i += 1
                    continue
                if tokens[i][1] == "{":
                    sub, i = _message(tokens, i + 1, "}")
                    items.append(sub)
                else:
                    items.append(_scalar(*tokens[i]))
                    i += 1
            i += 1
            if items and all(isinstance(item, dict) for item in items):
                _add(message, name, items)
            else:
                message[name] = items
        else:
            message[name] = _scalar(kind, value)
            i += 1
    if closing is not None:
        raise ValueError("unterminated message in pbtxt")
    return message, i


def read_pbtxt(text: str) -> dict[str, Any]:
    """Parse the text format that llmfleet.render.pbtxt writes. Nested messages come back as lists of
    dicts (a field may repeat), scalars as str/int/float/bool, enum values as plain str."""
    message, _ = _message(_tokens(text), 0, None)
    return message


def _one(value: Any) -> dict[str, Any]:
    return value[0] if isinstance(value, list) else value


def _parameters(config: Mapping[str, Any]) -> dict[str, str]:
    params = {}
    for entry in config.get("parameters") or ():
        value = _one(entry.get("value", {}))
        params[entry["key"]] = value.get("string_value")
    return params


# --- checks --------------------------------------------------------------------------------------------

def _type_error(parameter: Parameter, value: Any) -> str | None:
    """Why ``value`` would not parse as the upstream code parses it, or None."""
    if not isinstance(value, str):
        return f"is not a string_value ({value!r})"
    kind = parameter.type
    if kind == "bool_cpp" and value not in CPP_BOOL_WORDS:
        return f"{value!r} is not one of {', '.join(CPP_BOOL_WORDS)}"
    if kind == "bool_py" and value.lower() not in PY_BOOL_WORDS:
        return f"{value!r} is not one of {', '.join(PY_BOOL_WORDS)} (the model falls back to its default)"
    if kind in ("int", "uint"):
        if not re.fullmatch(r"-?\d+" if kind == "int" else r"\d+", value.strip()):
            return f"{value!r} is not an integer"
    if kind == "float":
        try:
            float(value)
        except ValueError:
            return f"{value!r} is not a number"
    if kind == "int_list" and not re.fullmatch(r"\s*-?\d+\s*(,\s*-?\d+\s*)*", value):
        return f"{value!r} is not a comma-separated list of integers"
    if kind == "enum" and parameter.choices and value not in parameter.choices:
        return f"{value!r} is not one of {', '.join(parameter.choices)}"
    return None


def _dims(tensor: Mapping[str, Any]) -> tuple[int, ...]:
    dims = tensor.get("dims", [])
    return tuple(dims if isinstance(dims, list) else [dims])


def _check_tensors(model: str, direction: str, rendered: list[dict[str, Any]],
                   upstream: Mapping[str, Tensor]) -> list[str]:
    problems = []
    seen = set()
    for tensor in rendered:
        name = tensor.get("name")
        seen.add(name)
        ref = upstream.get(name)
        if ref is None:
            problems.append(f"{model}: unknown {direction} tensor {name!r} (not in the upstream config)")
            continue
        data_type = str(tensor.get("data_type"))
        if not ref.data_type.startswith("${") and data_type != ref.data_type:
            problems.append(f"{model}: {direction} {name!r} has data_type {data_type}, upstream {ref.data_type}")
        if _dims(tensor) != ref.dims:
            problems.append(f"{model}: {direction} {name!r} has dims {list(_dims(tensor))}, upstream {list(ref.dims)}")
        if direction == "input" and tensor.get("optional", False) and ref.required and not ref.optional:
            problems.append(f"{model}: input {name!r} is optional here but the model needs it")
    for name, ref in upstream.items():
        if ref.required and name not in seen:
            problems.append(f"{model}: {direction} tensor {name!r} missing (upstream needs it)")
    return problems


def check_model_config(record: ReleaseRecord, model: str, config: Mapping[str, Any]) -> list[str]:
    """Mismatches of one model's config (parsed) against the record's model of that name."""
    ref = record.models.get(model)
    if ref is None:
        return [f"{model}: no such model in the {record.release} model set ({', '.join(record.models)})"]
    problems = []
    if ref.backend and config.get("backend") != ref.backend:
        problems.append(f"{model}: backend {config.get('backend')!r}, upstream {ref.backend!r}")
    if ref.platform and config.get("platform") != ref.platform:
        problems.append(f"{model}: platform {config.get('platform')!r}, upstream {ref.platform!r}")
    params = _parameters(config)
    for key, value in params.items():
        parameter = ref.parameters.get(key)
        if parameter is None:
            problems.append(f"{model}: unknown parameter {key!r} (not read upstream)")
            continue
        if parameter.read == "refused":
            problems.append(f"{model}: parameter {key!r} is refused upstream ({parameter.note})")
            continue
        why = _type_error(parameter, value)
        if why:
            problems.append(f"{model}: parameter {key!r} has the wrong type: {why}")
    for key, parameter in ref.parameters.items():
        if parameter.read == "required" and key not in params:
            problems.append(f"{model}: required parameter {key!r} missing ({parameter.source})")
    problems += _check_tensors(model, "input", list(config.get("input") or ()), ref.inputs)
    problems += _check_tensors(model, "output", list(config.get("output") or ()), ref.outputs)
    return problems


def _check_ensemble_steps(record: ReleaseRecord, model: str, config: Mapping[str, Any],
                          repository: Mapping[str, Mapping[str, Any]]) -> list[str]:
    problems = []
    scheduling = _one(config.get("ensemble_scheduling") or {})
    for step in scheduling.get("step") or ():
        target = step.get("model_name")
        target_config = repository.get(target)
        if target_config is None:
            problems.append(f"{model}: step model {target!r} is not in the repository")
            continue
        inputs = {t["name"] for t in target_config.get("input") or ()}
        outputs = {t["name"] for t in target_config.get("output") or ()}
        for entry in step.get("input_map") or ():
            if entry["key"] not in inputs:
                problems.append(f"{model}: step {target!r} maps unknown input {entry['key']!r}")
        for entry in step.get("output_map") or ():
            if entry["key"] not in outputs:
                problems.append(f"{model}: step {target!r} maps unknown output {entry['key']!r}")
    return problems


def check_model_repository(record: ReleaseRecord, files: Mapping[str, str]) -> list[str]:
    """``files``: path -> config.pbtxt text, paths like ``tensorrt_llm/config.pbtxt`` (other files are
    ignored). The model name is the config's ``name`` (else the directory)."""
    configs: dict[str, dict[str, Any]] = {}
    for path, text in files.items():
        if not path.endswith("config.pbtxt"):
            continue
        config = read_pbtxt(text)
        name = config.get("name") or path.split("/")[0].removesuffix(".config.pbtxt")
        configs[name] = config
    problems = []
    for name, config in configs.items():
        problems += check_model_config(record, name, config)
        if config.get("platform") == "ensemble":
            problems += _check_ensemble_steps(record, name, config, configs)
    return problems


def check_image_paths(record: ReleaseRecord, paths: Iterable[str]) -> list[str]:
    problems = []
    for path in paths:
        entry = record.image_path(path)
        if entry is None:
            problems.append(f"image path {path} is not in the record (unknown whether {record.image} has it)")
        elif not entry.present:
            problems.append(f"image path {path} does not exist in {record.image} ({entry.source})")
    return problems


def check_model_code_paths(record: ReleaseRecord, paths: Iterable[str]) -> list[str]:
    """Paths pods copy from the operator's image: each must be a recorded upstream file."""
    known = {file.image_path for file in record.model_code}
    return [f"{path} is not an upstream file of {record.release}'s record (model_code)"
            for path in paths if path not in known]


def _flags(args: Iterable[str]) -> list[str]:
    return [arg.split("=", 1)[0] for arg in args if arg.startswith("-")]


def check_command_flags(known: frozenset[str], tool: str, args: Iterable[str], *, complete: bool = True) -> list[str]:
    problems = []
    for flag in _flags(args):
        if flag not in known:
            if complete:
                problems.append(f"{tool}: unknown flag {flag}")
            else:
                problems.append(f"{tool}: flag {flag} not in the record (its flag list at the tag is incomplete)")
    return problems


def check_build_command(record: ReleaseRecord, args: Iterable[str]) -> list[str]:
    return check_command_flags(record.build_flags, "trtllm-build", args, complete=record.build_flags_complete)


def check_quantize_command(record: ReleaseRecord, args: Iterable[str], *, qformat: str | None = None) -> list[str]:
    problems = []
    if record.quantize_flags is None:
        problems.append("quantize.py: flags not established at the tag; cannot check " + " ".join(_flags(args)))
    else:
        problems += check_command_flags(record.quantize_flags, "quantize.py", args)
    if qformat is not None and record.qformat_values and qformat not in record.qformat_values:
        problems.append(f"quantize.py: --qformat {qformat} is not one of {', '.join(record.qformat_values)}")
    return problems


def check_tritonserver_command(record: ReleaseRecord, args: Iterable[str]) -> list[str]:
    return check_command_flags(record.tritonserver_flags, "tritonserver", args)


def check_mpirun_command(record: ReleaseRecord, argv: list[str], tensorrt_llm_model: str) -> list[str]:
    """An MPMD `mpirun [flags] -n 1 tritonserver ... : -n 1 tritonserver ...` against the record:
    mpirun's flags, each rank's server flags, and the per-rank flags upstream's launcher gives."""
    if not argv or argv[0] != "mpirun":
        return [f"not an mpirun command: {argv[:1]}"]
    contexts: list[list[str]] = [[]]
    for arg in argv[1:]:
        if arg == ":":
            contexts.append([])
        else:
            contexts[-1].append(arg)
    problems = []
    for rank, context in enumerate(contexts):
        if "-n" not in context or context.index("-n") + 2 > len(context):
            problems.append(f"mpirun: app context {rank} has no '-n <count> <program>'")
            continue
        at = context.index("-n")
        mpirun_args, count, server = context[:at], context[at + 1], context[at + 2:]
        problems += check_command_flags(record.mpirun_flags, "mpirun", mpirun_args + ["-n"])
        if count != "1":
            problems.append(f"mpirun: app context {rank} starts {count} processes; one rank per context")
        problems += check_tritonserver_command(record, server[1:])
        expected = [f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        if rank > 0:
            expected += ["--model-control-mode=explicit", f"--load-model={tensorrt_llm_model}"]
        problems += [f"rank {rank}: missing {flag}" for flag in expected if flag not in server]
    return problems


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


def check_metric(record: ReleaseRecord, name: str, labels: Mapping[str, str] | None = None) -> list[str]:
    """A metric series the operator queries: the family must exist and each label value be exported."""
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    family = record.metrics.get(name) or record.metrics.get(base)
    if family is None:
        return [f"metric {name} is not exported in {record.release}"]
    problems = []
    for label, value in (labels or {}).items():
        if label not in family.labels and label != "le":
            problems.append(f"metric {family.name} has no label {label!r}")
        elif family.labels.get(label) is not None and value not in family.labels[label]:
            problems.append(f"metric {family.name}{{{label}={value!r}}} is not exported in {record.release} "
                            f"(values: {', '.join(family.labels[label])})")
    return problems
