"""The upstream record of the inference-aware router (``routers/<release>.yaml``): the Gateway API
Inference Extension's InferencePool and endpoint picker (API version and fields, image, flags,
ports, plugin and engine names). Facts carry their upstream source; the tests check rendered
objects against it with ``llmfleet_dev.router_checks``."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

import yaml

ROUTERS_DIR = "routers"
# The pinned router release for spec.routing.inferencePool.
INFERENCE_ROUTER = "gateway-api-inference-extension-v1.5.0"


@dataclass(frozen=True)
class RouterRecord:
    release: str
    pool_api_version: str
    pool_spec_fields: frozenset[str]
    pool_required: frozenset[str]
    picker_ref_fields: frozenset[str]
    failure_modes: tuple[str, ...]
    max_target_ports: int
    backend_group: str
    backend_kind: str
    image: str
    run_as_user: int
    ports: Mapping[str, int]
    health_service: str
    flags: frozenset[str]
    rejected_flags: frozenset[str]
    environment: frozenset[str]
    rbac: tuple[Mapping[str, Any], ...]
    config_api_version: str
    config_kind: str
    config_fields: frozenset[str]
    plugin_types: frozenset[str]
    engines: Mapping[str, Mapping[str, str]]


@functools.lru_cache(maxsize=None)
def load_router_record(name: str = INFERENCE_ROUTER) -> RouterRecord:
    raw = yaml.safe_load(resources.files(__package__).joinpath(ROUTERS_DIR, f"{name}.yaml").read_text("utf-8"))
    pool, picker, config = raw["inference_pool"], raw["endpoint_picker"], raw["config"]
    return RouterRecord(
        release=raw["release"], pool_api_version=pool["api_version"],
        pool_spec_fields=frozenset(pool["spec_fields"]), pool_required=frozenset(pool["required"]),
        picker_ref_fields=frozenset(pool["endpoint_picker_ref_fields"]),
        failure_modes=tuple(pool["failure_modes"]), max_target_ports=pool["max_target_ports"],
        backend_group=raw["http_route_backend"]["group"], backend_kind=raw["http_route_backend"]["kind"],
        image=picker["image"]["name"], run_as_user=picker["run_as_user"]["value"],
        ports={key: value for key, value in picker["ports"].items() if key != "source"},
        health_service=picker["health_service"],
        flags=frozenset(flag["name"] for flag in picker["flags"]),
        rejected_flags=frozenset(flag["name"] for flag in picker["rejected_flags"]),
        environment=frozenset(item["name"] for item in picker["environment"]),
        rbac=tuple(picker["rbac"]),
        config_api_version=config["api_version"], config_kind=config["kind"],
        config_fields=frozenset(config["top_level_fields"]), plugin_types=frozenset(config["plugin_types"]),
        engines=config["engines"])
