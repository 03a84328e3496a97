"""spec.routing.inferencePool: per revision an InferencePool and its endpoint picker, checked
against the pinned Gateway API Inference Extension record (not against our own output), and the
HTTPRoute's weighted backends become the pools."""

from __future__ import annotations

import pytest
import yaml

from llmfleet.api import LLMDeployment
from llmfleet.catalog.router_record import load_router_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, namespace_prerequisites, render, revision_hash
from llmfleet.render.inference_pool import PICKER_SERVICE_ACCOUNT
from llmfleet_dev.router_checks import check_endpoint_picker, check_inference_pool
from render_builders import manifest

RECORD = load_router_record()


def routed(pool: dict | None = None, route_weights=None, settings=RenderSettings()):
    body = manifest(1)
    body["spec"]["routing"] = {"httpRoute": {"parentRefs": [{"name": "gateway"}]},
                               **({"inferencePool": pool} if pool is not None else {})}
    deployment = LLMDeployment.from_manifest(body)
    chosen = plan(plan_request_from_spec(deployment.spec))
    revision = revision_hash(deployment.spec, chosen)
    objects = render(deployment, chosen, revision, settings, serving_replicas=1,
                     route_weights=route_weights(revision) if route_weights else None)
    return deployment, revision, objects


def by_component(objects, kind, component):
    return [o for o in objects if o["kind"] == kind
            and o["metadata"]["labels"]["app.kubernetes.io/component"] == component]


def test_the_pool_selects_exactly_the_revisions_serving_pods_and_names_its_picker():
    _, revision, objects = routed({})
    [pool] = [o for o in objects if o["kind"] == "InferencePool"]
    assert check_inference_pool(RECORD, pool) == []
    server = next(o for o in objects if o["kind"] == "Deployment"
                  and o["metadata"]["labels"]["app.kubernetes.io/component"] == "server")
    assert pool["metadata"]["name"] == server["metadata"]["name"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector.items() <= server["spec"]["template"]["metadata"]["labels"].items()
    assert selector["llmfleet.io/revision"] == revision
    [picker_service] = by_component(objects, "Service", "endpoint-picker")
    reference = pool["spec"]["endpointPickerRef"]
    assert reference["name"] == picker_service["metadata"]["name"]
    assert reference["port"]["number"] == picker_service["spec"]["ports"][0]["port"] == RECORD.ports["grpc"]
    assert reference["failureMode"] == "FailOpen"
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]  # Triton's HTTP port, which the route carries


def test_the_picker_runs_the_recorded_image_with_recorded_flags_and_reads_triton_metric_names():
    _, _, objects = routed({"failureMode": "FailClose"})
    [picker] = by_component(objects, "Deployment", "endpoint-picker")
    [config_map] = by_component(objects, "ConfigMap", "endpoint-picker")
    [container] = picker["spec"]["template"]["spec"]["containers"]
    config = yaml.safe_load(next(iter(config_map["data"].values())))
    assert check_endpoint_picker(RECORD, container, config) == []
    args = container["args"]
    assert args[args.index("--pool-name") + 1] == next(o for o in objects if o["kind"] == "InferencePool")["metadata"]["name"]
    assert args[args.index("--model-server-metrics-port") + 1] == "8002"  # Triton's metrics port
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    assert extractor["parameters"]["defaultEngine"] in RECORD.engines
    assert picker["spec"]["template"]["spec"]["serviceAccountName"] == PICKER_SERVICE_ACCOUNT
    volume = picker["spec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert next(o for o in objects if o["kind"] == "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"


@pytest.mark.parametrize("problem, container, config, expected", [
    ("a flag the release refuses", {"args": ["--total-queued-requests-metric", "x"]}, {}, "exit at start"),
    ("an unknown flag", {"args": ["--zap-encoding", "json"]}, {}, "not in the record"),
    ("an unknown plugin", {}, {"plugins": [{"type": "least-latency-scorer"}]}, "not in the record"),
    ("an unknown config field", {}, {"data": {}}, "decoding is strict"),
])
def test_the_record_check_catches_what_upstream_refuses(problem, container, config, expected):
    _, _, objects = routed({})
    [picker] = by_component(objects, "Deployment", "endpoint-picker")
    [config_map] = by_component(objects, "ConfigMap", "endpoint-picker")
    good_container = picker["spec"]["template"]["spec"]["containers"][0]
    good_config = yaml.safe_load(next(iter(config_map["data"].values())))
    bad_container = {**good_container, "args": good_container["args"] + container.get("args", [])}
    bad_config = {**good_config, **config}
    assert any(expected in line for line in check_endpoint_picker(RECORD, bad_container, bad_config)), problem


def test_the_route_weights_pools_instead_of_services():
    _, revision, objects = routed({}, route_weights=lambda revision: {revision: 80, "0000000000": 20})
    route = next(o for o in objects if o["kind"] == "HTTPRoute")
    backends = route["spec"]["rules"][0]["backendRefs"]
    assert [(b["group"], b["kind"], b["weight"]) for b in backends] == [
        (RECORD.backend_group, RECORD.backend_kind, 20), (RECORD.backend_group, RECORD.backend_kind, 80)]
    assert all("port" not in b for b in backends)
    assert f"chat-{revision}" in {b["name"] for b in backends}
    # Without the pool: the revision's own Service, on the HTTP port; no picker.
    _, _, plain = routed(None)
    assert {b["kind"] for b in next(o for o in plain if o["kind"] == "HTTPRoute")["spec"]["rules"][0]["backendRefs"]} == {"Service"}
    assert not [o for o in plain if o["kind"] == "InferencePool"]


def test_the_namespace_gets_the_pickers_account_bound_to_the_charts_role_only_with_a_pool():
    deployment, _, _ = routed({})
    chosen = plan(plan_request_from_spec(deployment.spec))
    settings = RenderSettings(endpoint_picker_cluster_role="fleet-b-endpoint-picker")
    prerequisites = {o["kind"]: o for o in namespace_prerequisites(deployment, chosen, settings)}
    assert set(prerequisites) == {"PersistentVolumeClaim", "ServiceAccount", "RoleBinding"}
    binding = prerequisites["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "fleet-b-endpoint-picker"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PICKER_SERVICE_ACCOUNT, "namespace": "serving"}]
    plain, _, _ = routed(None)
    assert [o["kind"] for o in namespace_prerequisites(plain, chosen, RenderSettings())] == ["PersistentVolumeClaim"]


def test_a_pool_without_a_route_is_refused_naming_the_fix():
    body = manifest(1)
    body["spec"]["routing"] = {"inferencePool": {}}
    with pytest.raises(Exception, match="inferencePool needs spec.routing.httpRoute"):
        LLMDeployment.from_manifest(body)
