"""`LLMDeployment.spec`: what the user asks for, one module per section of the spec.

Lengths are in tokens, latencies in milliseconds, rates per second. The planner turns these
into a plan (GPU type, tensor parallelism, quantisation, KV dtype, replicas).
"""

from llmfleet.api.spec.architecture import LatentAttention, LocalAttention, ModelArchitecture
from llmfleet.api.spec.autoscaling import AutoscalingSpec
from llmfleet.api.spec.deployment import LLMDeploymentSpec
from llmfleet.api.spec.engine import CALIBRATION_DATASET_FIELD, CALIBRATION_DATASET_SOURCES, EngineSpec
from llmfleet.api.spec.model import (
    HTTP_ENDPOINT_PATTERN,
    HUGGING_FACE_SCHEME,
    INLINE_CREDENTIAL_FIELDS,
    INLINE_CREDENTIAL_MESSAGE,
    OBJECT_STORE_SCHEME,
    SOURCE_REQUIRED_MESSAGE,
    VOLUME_SCHEME,
    WEIGHTS_SOURCE_MESSAGE,
    WEIGHTS_SOURCE_PATTERN,
    WEIGHTS_SOURCES,
    ModelSpec,
    ObjectStoreOptions,
    SecretKeyReference,
    hub_dataset_id,
    hub_repo_id,
    in_object_store,
    volume_source,
)
from llmfleet.api.spec.network_policy import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_LABEL_KEY_LENGTH,
    MAX_LABEL_VALUE_LENGTH,
    LabelSelector,
    NetworkPeer,
    NetworkPolicySpec,
)
from llmfleet.api.spec.planning import (
    PlanOverrides,
    QualityBudget,
    ResourcesSpec,
    SloSpec,
    TensorParallelSize,
    WorkloadSpec,
)
from llmfleet.api.spec.rollout import (
    AnalysisStep,
    ConfigMapKeyReference,
    PauseStep,
    QualityGate,
    RolloutGates,
    RolloutSpec,
    RolloutStep,
)
from llmfleet.api.spec.routing import GatewayParentReference, HttpRouteSpec, InferencePoolSpec, RoutingSpec

__all__ = [
    "AnalysisStep",
    "CALIBRATION_DATASET_FIELD",
    "CALIBRATION_DATASET_SOURCES",
    "AutoscalingSpec",
    "ConfigMapKeyReference",
    "EngineSpec",
    "GatewayParentReference",
    "HTTP_ENDPOINT_PATTERN",
    "HUGGING_FACE_SCHEME",
    "HttpRouteSpec",
    "INLINE_CREDENTIAL_FIELDS",
    "INLINE_CREDENTIAL_MESSAGE",
    "InferencePoolSpec",
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "LLMDeploymentSpec",
    "LabelSelector",
    "LatentAttention",
    "LocalAttention",
    "MAX_LABEL_KEY_LENGTH",
    "MAX_LABEL_VALUE_LENGTH",
    "ModelArchitecture",
    "ModelSpec",
    "NetworkPeer",
    "NetworkPolicySpec",
    "OBJECT_STORE_SCHEME",
    "ObjectStoreOptions",
    "PauseStep",
    "PlanOverrides",
    "QualityBudget",
    "QualityGate",
    "ResourcesSpec",
    "RolloutGates",
    "RolloutSpec",
    "RolloutStep",
    "RoutingSpec",
    "SOURCE_REQUIRED_MESSAGE",
    "SecretKeyReference",
    "SloSpec",
    "TensorParallelSize",
    "VOLUME_SCHEME",
    "WEIGHTS_SOURCES",
    "WEIGHTS_SOURCE_MESSAGE",
    "WEIGHTS_SOURCE_PATTERN",
    "WorkloadSpec",
    "hub_dataset_id",
    "hub_repo_id",
    "in_object_store",
    "volume_source",
]
