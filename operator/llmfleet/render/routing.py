"""Gateway API routing (spec.routing.httpRoute): a Service per revision, and one HTTPRoute
whose weighted backendRefs send each revision its share of the requests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmfleet.api import HttpRouteSpec
from llmfleet.catalog.router_record import RouterRecord
from llmfleet.render import layout
from llmfleet.render.serving import service

GATEWAY_GROUP = "gateway.networking.k8s.io"
HTTP_ROUTE_API_VERSION = f"{GATEWAY_GROUP}/v1"
ROUTE_COMPONENT = "route"
REVISION_SERVICE_COMPONENT = "revision-service"


def revision_service(metadata: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    """The backend of one revision: its pods only."""
    return service(metadata, selector)


def http_route(metadata: dict[str, Any], route: HttpRouteSpec, weight_by_backend: Mapping[str, int],
               pools: RouterRecord | None = None) -> dict[str, Any]:
    """All requests to the deployment's revisions, split by weight: to each revision's Service
    (Triton's HTTP port), or with `pools` (the router's record) to each revision's InferencePool
    (whose target port is set in the pool)."""
    parent_refs = [{"group": GATEWAY_GROUP, "kind": "Gateway", "name": parent.name,
                    **({"namespace": parent.namespace} if parent.namespace else {}),
                    **({"sectionName": parent.section_name} if parent.section_name else {})}
                   for parent in route.parent_refs]
    kind = ({"group": pools.backend_group, "kind": pools.backend_kind} if pools is not None
            else {"group": "", "kind": "Service", "port": layout.HTTP_PORT})
    backend_refs = [{**kind, "name": name, "weight": weight} for name, weight in sorted(weight_by_backend.items())]
    return {
        "apiVersion": HTTP_ROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": metadata,
        "spec": {
            "parentRefs": parent_refs,
            "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": backend_refs}],
        },
    }
