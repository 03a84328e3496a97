"""Packaged catalog: GPU types, model architectures, quantisation formats, calibration.

The YAML files next to this module are the data; this module turns them into frozen
dataclasses (a model's architecture, and what follows from it, is in ``catalog.model``). Every
entry carries a ``source`` string citing where its numbers come from.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Mapping

import yaml

from llmfleet.api import enums as api_enums
from llmfleet.catalog.model import (
    ARCHITECTURE_KIND_FIELDS,
    LOCAL_ATTENTION_KINDS,
    ModelArch,
    model_from_numbers,
)

# The API's enums are the contract; quantizations.yaml holds their numbers, and loading checks
# that it lists exactly these, in this order.
QUANTIZATIONS = tuple(quantization.value for quantization in api_enums.Quantization)
KV_CACHE_DTYPES = tuple(dtype.value for dtype in api_enums.KvCacheDtype)


@dataclass(frozen=True)
class GpuType:
    name: str
    generation: str
    compute_capability: int
    memory_bytes: int
    memory_mib: int
    memory_bandwidth_bytes_per_sec: float
    dense_tflops: Mapping[str, float | None]
    interconnect_bandwidth_bytes_per_sec: float
    max_gpus_per_node: int
    # Across nodes (the node pool's network, per GPU and direction) and one message's latency.
    inter_node_bandwidth_bytes_per_sec: float
    inter_node_latency_us: float
    inter_node_source: str
    gfd_product: str
    supported_quantizations: tuple[str, ...]
    supported_kv_cache_dtypes: tuple[str, ...]
    relative_cost_per_gpu_hour: float
    source: str

    def dense_flops_per_sec(self, precision: str) -> float:
        tflops = self.dense_tflops.get(precision)
        if not tflops:
            raise ValueError(f"{self.name} has no dense {precision} throughput")
        return tflops * 1e12


@dataclass(frozen=True)
class QuantizationFormat:
    name: str
    weight_bytes_per_param: float
    activation_precision: str
    min_compute_capability: int
    quality_cost_percent: float
    qformat: str
    source: str
    # Near-lossless as published: the planner may pick it when the spec sets no quality budget.
    allowed_without_quality_budget: bool

    @property
    def is_weight_only(self) -> bool:
        return self.activation_precision in ("bf16", "fp16") and self.weight_bytes_per_param < 2


@dataclass(frozen=True)
class KvCacheDtype:
    name: str
    bytes_per_element: int
    min_compute_capability: int
    quality_cost_percent: float
    kv_cache_dtype_flag: str | None
    source: str


# Calibration's fields that map a key to a multiplier.
SCALE_MAPPINGS = ("generation_efficiency_scales", "generation_interconnect_scales", "tensor_parallel_scales")


@dataclass(frozen=True)
class Calibration:
    """Efficiency factors of the latency model, fitted to public measurements (see calibration.yaml)."""

    prefill_compute_efficiency: float
    decode_compute_efficiency: float
    memory_bandwidth_efficiency: float
    interconnect_efficiency: float
    step_overhead_ms: float
    allreduce_latency_us: float
    runtime_reserve_bytes: int
    tokens_per_block: int
    source: str
    # GPU generation -> multiplier on the compute and bandwidth efficiencies of that generation's
    # GPUs. Hopper is the reference the shared factors are fitted to; a generation not listed
    # (Hopper included) uses the shared factors alone (1.0).
    generation_efficiency_scales: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    # GPU generation -> multiplier on interconnect_efficiency (the TP all-reduce's share of link
    # bandwidth) on that generation's GPUs; not listed: 1.0.
    generation_interconnect_scales: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    # Multiplies the compute and bandwidth efficiencies of models with experts (MoE) only.
    moe_efficiency_scale: float = 1.0
    # "tp<N>" -> multiplier on the compute and bandwidth efficiencies of a TP group of N GPUs;
    # TP1 and a size not listed: 1.0.
    tensor_parallel_scales: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        for name in SCALE_MAPPINGS:
            scales = dict(getattr(self, name))
            for key, scale in scales.items():
                if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
                    raise ValueError(f"calibration: {name}.{key} must be a positive number, got {scale!r}")
            object.__setattr__(self, name, MappingProxyType({key: float(scale) for key, scale in scales.items()}))
        unknown = [key for key in self.tensor_parallel_scales if not re.fullmatch(r"tp([2-9]|[1-9][0-9]+)", key)]
        if unknown:
            raise ValueError(f"calibration: tensor_parallel_scales keys are 'tp<N>' with N >= 2, got {unknown}")
        if self.moe_efficiency_scale <= 0:
            raise ValueError(f"calibration: moe_efficiency_scale must be positive, got {self.moe_efficiency_scale!r}")

    def generation_efficiency_scale(self, generation: str) -> float:
        return self.generation_efficiency_scales.get(generation, 1.0)

    def generation_interconnect_scale(self, generation: str) -> float:
        return self.generation_interconnect_scales.get(generation, 1.0)

    def tensor_parallel_scale(self, tensor_parallel_size: int) -> float:
        return self.tensor_parallel_scales.get(f"tp{tensor_parallel_size}", 1.0)


@dataclass(frozen=True)
class CalibrationMeasurement:
    """One public measured throughput: a row the calibration is fitted to, or a held-out row it is
    checked against (never fitted)."""

    model: str
    gpu: str
    tensor_parallel_size: int
    quantization: str
    kv_cache_dtype: str
    input_tokens: int
    output_tokens: int
    output_tokens_per_sec: float
    # Where the number was published (repository, file, commit, table and column).
    source: str = ""


@dataclass(frozen=True)
class Catalog:
    gpus: Mapping[str, GpuType]
    models: Mapping[str, ModelArch]
    quantizations: Mapping[str, QuantizationFormat]
    kv_cache_dtypes: Mapping[str, KvCacheDtype]
    calibration: Calibration
    calibration_measurements: tuple[CalibrationMeasurement, ...]
    # Public measurements the fit never sees (calibration_holdout.yaml): the check of its error on
    # data outside the fitted rows.
    calibration_holdout: tuple[CalibrationMeasurement, ...] = ()

    def gpu(self, name: str) -> GpuType:
        return _lookup(self.gpus, name, "GPU type")

    def model(self, name: str) -> ModelArch:
        return _lookup(self.models, name, "model")

    def quantization(self, name: str) -> QuantizationFormat:
        return _lookup(self.quantizations, name, "quantization")

    def kv_cache_dtype(self, name: str) -> KvCacheDtype:
        return _lookup(self.kv_cache_dtypes, name, "KV cache dtype")


def _lookup(table: Mapping, name: str, what: str):
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None


# libyaml's parser where PyYAML was built with it: the calibration rows take 0.3 s in pure Python.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(filename: str) -> dict:
    text = resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")
    return yaml.load(text, Loader=_YAML_LOADER)


def _require_source(kind: str, name: str, entry: dict) -> None:
    if not str(entry.get("source", "")).strip():
        raise ValueError(f"catalog {kind} {name!r} has no source line")


def _gpu(name: str, entry: dict) -> GpuType:
    _require_source("GPU", name, entry)
    return GpuType(
        name=name,
        generation=entry["generation"],
        compute_capability=int(entry["compute_capability"]),
        memory_bytes=int(entry["memory_bytes"]),
        memory_mib=int(entry["memory_mib"]),
        memory_bandwidth_bytes_per_sec=float(entry["memory_bandwidth_bytes_per_sec"]),
        dense_tflops=MappingProxyType({k: (float(v) if v is not None else None)
                                       for k, v in entry["dense_tflops"].items()}),
        interconnect_bandwidth_bytes_per_sec=float(entry["interconnect_bandwidth_bytes_per_sec"]),
        max_gpus_per_node=int(entry["max_gpus_per_node"]),
        inter_node_bandwidth_bytes_per_sec=float(entry["inter_node_bandwidth_bytes_per_sec"]),
        inter_node_latency_us=float(entry["inter_node_latency_us"]),
        inter_node_source=entry["inter_node_source"],
        gfd_product=entry["gfd_product"],
        supported_quantizations=tuple(entry["supported_quantizations"]),
        supported_kv_cache_dtypes=tuple(entry["supported_kv_cache_dtypes"]),
        relative_cost_per_gpu_hour=float(entry["relative_cost_per_gpu_hour"]),
        source=entry["source"],
    )


def _model(name: str, entry: dict) -> ModelArch:
    _require_source("model", name, entry)
    return model_from_numbers(name=name, **entry)


def _quantization(name: str, entry: dict) -> QuantizationFormat:
    _require_source("quantization", name, entry)
    return QuantizationFormat(name=name, **entry)


def _kv_dtype(name: str, entry: dict) -> KvCacheDtype:
    _require_source("KV cache dtype", name, entry)
    return KvCacheDtype(name=name, **entry)


def _check_measurements(catalog: Catalog) -> None:
    """Every fitted and held-out row names catalog entries and its source; scales name known generations."""
    generations = {gpu.generation for gpu in catalog.gpus.values()}
    for name in ("generation_efficiency_scales", "generation_interconnect_scales"):
        unknown = set(getattr(catalog.calibration, name)) - generations
        if unknown:
            raise ValueError(f"calibration: {name} names unknown generations {sorted(unknown)}")
    for kind, rows in (("measurement", catalog.calibration_measurements), ("holdout", catalog.calibration_holdout)):
        for row in rows:
            if not row.source.strip():
                raise ValueError(f"calibration {kind} {row} has no source")
            for lookup, name in ((catalog.model, row.model), (catalog.gpu, row.gpu),
                                 (catalog.quantization, row.quantization), (catalog.kv_cache_dtype, row.kv_cache_dtype)):
                lookup(name)  # KeyError naming the catalog's entries


@functools.lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """The packaged catalog (read once; the result is immutable)."""
    gpus = _read_yaml("gpus.yaml")["gpus"]
    models = _read_yaml("models.yaml")["models"]
    quant = _read_yaml("quantizations.yaml")
    calibration = _read_yaml("calibration.yaml")["calibration"]
    _require_source("calibration", "calibration", calibration)
    holdout = _read_yaml("calibration_holdout.yaml")["calibration_holdout"]
    catalog = Catalog(
        gpus=MappingProxyType({name: _gpu(name, e) for name, e in gpus.items()}),
        models=MappingProxyType({name: _model(name, e) for name, e in models.items()}),
        quantizations=MappingProxyType({name: _quantization(name, e) for name, e in quant["quantizations"].items()}),
        kv_cache_dtypes=MappingProxyType({name: _kv_dtype(name, e) for name, e in quant["kv_cache_dtypes"].items()}),
        calibration=Calibration(**{k: v for k, v in calibration.items() if k != "measurements"}),
        calibration_measurements=tuple(CalibrationMeasurement(**m) for m in calibration["measurements"]),
        calibration_holdout=tuple(CalibrationMeasurement(**m) for m in holdout["measurements"]),
    )
    _check_measurements(catalog)
    if tuple(catalog.quantizations) != QUANTIZATIONS or tuple(catalog.kv_cache_dtypes) != KV_CACHE_DTYPES:
        raise ValueError("quantizations.yaml must list exactly the API's quantisations and KV dtypes")
    return catalog


__all__ = [
    "ARCHITECTURE_KIND_FIELDS", "Calibration", "CalibrationMeasurement", "Catalog", "GpuType", "KV_CACHE_DTYPES",
    "KvCacheDtype", "LOCAL_ATTENTION_KINDS", "ModelArch",
    "QUANTIZATIONS", "QuantizationFormat", "SCALE_MAPPINGS", "load_catalog", "model_from_numbers",
]
