"""`spec.routing`: Gateway API HTTPRoute and inference-pool routing to the revisions."""

from pydantic import Field

from llmfleet.api.base import DNS_SUBDOMAIN_PATTERN, ApiModel, CelRule
from llmfleet.api.enums import EndpointPickerFailureMode


class GatewayParentReference(ApiModel):
    """A Gateway (or a listener of one) the route attaches to, as Gateway API's parentRefs."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the Gateway.")
    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Namespace of the Gateway; omit for the LLMDeployment's namespace.",
    )
    section_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The Gateway listener to attach to; omit for all that allow the route.",
    )


class HttpRouteSpec(ApiModel):
    """Traffic through a Gateway API HTTPRoute: one backend Service per revision, weighted."""

    parent_refs: list[GatewayParentReference] = Field(
        min_length=1, max_length=32, description="The Gateways the HTTPRoute attaches to."
    )


class InferencePoolSpec(ApiModel):
    """Inference-aware routing: per revision a Gateway API Inference Extension InferencePool and
    its endpoint picker, which sends each request to the pod with the shortest queue, the most
    free KV cache and the longest cached prefix."""

    failure_mode: EndpointPickerFailureMode = Field(
        default=EndpointPickerFailureMode.FAIL_OPEN,
        description="When the endpoint picker does not answer: FailOpen routes the request to any pod "
        "of the pool (the default: serving outlives the picker), FailClose refuses it.",
    )
    image: str | None = Field(
        default=None, min_length=1, max_length=512,
        description="Endpoint picker image; omit for the pinned release's (docs/render.md). Another tag "
        "must take the same flags and configuration.",
    )


class RoutingSpec(ApiModel):
    """How requests reach the revisions besides the deployment's Service."""

    http_route: HttpRouteSpec | None = Field(
        default=None,
        description="Render an HTTPRoute (gateway.networking.k8s.io/v1) whose weighted backends are "
        "per-revision Services: all weight on the serving revision, split by the canary's share "
        "during a canary rollout. Needs the Gateway API CRDs in the cluster.",
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description="Route through inference-aware endpoint pickers: the HTTPRoute's backends become "
        "one InferencePool (inference.networking.k8s.io/v1) per revision instead of Services, each "
        "with its endpoint picker Deployment. Needs httpRoute, the InferencePool CRD and a Gateway "
        "implementation that supports it.",
    )

    cel_rules = (
        CelRule(
            rule="!has(self.inferencePool) || has(self.httpRoute)",
            message="spec.routing.inferencePool needs spec.routing.httpRoute: requests reach the pools "
            "through the HTTPRoute; add httpRoute.parentRefs naming your Gateway",
            holds=lambda r: r.inference_pool is None or r.http_route is not None,
            field_path=".inferencePool",
        ),
    )
