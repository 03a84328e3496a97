"""Checks of a rendered InferencePool and endpoint picker against the router's upstream record
(`llmfleet.catalog.router_record`): API version and fields, image, flags, ports, plugin and
engine names, each mismatch a readable line. Tests hold the product to them."""

from __future__ import annotations

from typing import Any, Mapping

from llmfleet.catalog.router_record import RouterRecord


def check_inference_pool(record: RouterRecord, pool: Mapping[str, Any]) -> list[str]:
    """Mismatches between a rendered InferencePool and the record."""
    problems = []
    if pool.get("apiVersion") != record.pool_api_version:
        problems.append(f"apiVersion {pool.get('apiVersion')!r} is not {record.pool_api_version!r}")
    spec = pool.get("spec") or {}
    problems += [f"spec.{field} is not an InferencePool field" for field in spec if field not in record.pool_spec_fields]
    problems += [f"spec.{field} is required" for field in sorted(record.pool_required - spec.keys())]
    problems += [f"spec.selector.{field} is not supported (matchLabels only)"
                 for field in spec.get("selector") or {} if field != "matchLabels"]
    if not 1 <= len(spec.get("targetPorts") or ()) <= record.max_target_ports:
        problems.append(f"spec.targetPorts needs 1 to {record.max_target_ports} ports")
    picker = spec.get("endpointPickerRef") or {}
    problems += [f"spec.endpointPickerRef.{field} is not a field" for field in picker
                 if field not in record.picker_ref_fields]
    if picker.get("failureMode", record.failure_modes[-1]) not in record.failure_modes:
        problems.append(f"spec.endpointPickerRef.failureMode {picker.get('failureMode')!r} is not one of "
                        f"{', '.join(record.failure_modes)}")
    return problems


def check_endpoint_picker(record: RouterRecord, container: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """Mismatches between a rendered endpoint-picker container (and its EndpointPickerConfig) and
    the record."""
    problems = []
    if container.get("image") != record.image:
        problems.append(f"image {container.get('image')!r} is not the recorded {record.image!r}")
    for argument in container.get("args") or ():
        flag = argument.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        if flag in record.rejected_flags:
            problems.append(f"flag {flag} makes the {record.release} picker exit at start")
        elif flag not in record.flags:
            problems.append(f"flag {flag} is not in the record")
    problems += [f"environment: {item['name']} is not one the picker reads" for item in container.get("env") or ()
                 if item["name"] not in record.environment]
    ports = {port["containerPort"] for port in container.get("ports") or ()}
    problems += [f"port {number} ({name}) is not exposed" for name, number in record.ports.items() if number not in ports]
    if (config.get("apiVersion"), config.get("kind")) != (record.config_api_version, record.config_kind):
        problems.append(f"config is {config.get('apiVersion')}/{config.get('kind')}, not "
                        f"{record.config_api_version}/{record.config_kind}")
    problems += [f"config field {field} is unknown (decoding is strict)" for field in config
                 if field not in record.config_fields | {"apiVersion", "kind"}]
    for plugin in config.get("plugins") or ():
        if plugin["type"] not in record.plugin_types:
            problems.append(f"plugin type {plugin['type']} is not in the record")
        engine = (plugin.get("parameters") or {}).get("defaultEngine")
        if engine is not None and engine not in record.engines:
            problems.append(f"engine {engine} is not a built-in engine config")
    return problems
