"""The LLMDeployment API (llmfleet.io/v1alpha1): pydantic models, the single source of truth.

Pure: imports only pydantic and the standard library. The CRD and docs/api.md are generated
from these models by `python -m llmfleet.api.crdgen`.
"""

from llmfleet.api.base import CelRule, KubeTime
from llmfleet.api.conditions import Condition, ConditionType, find_condition, set_condition
from llmfleet.api.enums import (
    TENSOR_PARALLEL_SIZES,
    CatalogModel,
    ConditionStatus,
    GpuType,
    KvCacheDtype,
    Quantization,
)
from llmfleet.api.resource import (
    API_VERSION,
    CRD_NAME,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    InvalidSpecError,
    LLMDeployment,
)
from llmfleet.api.spec import (
    DEFAULT_TRITON_IMAGE,
    AnalysisStep,
    AutoscalingSpec,
    EngineSpec,
    LLMDeploymentSpec,
    ModelArchitecture,
    ModelSpec,
    PauseStep,
    PlanOverrides,
    QualityBudget,
    ResourcesSpec,
    RolloutGates,
    RolloutSpec,
    RolloutStep,
    SecretKeyReference,
    SloSpec,
    TensorParallelSize,
    WorkloadSpec,
)
from llmfleet.api.status import (
    MAX_CONDITIONS,
    MAX_RATIONALE_LINES,
    MAX_REJECTED_OPTIONS,
    MAX_REVISIONS,
    AutoscalerInputs,
    AutoscalerStatus,
    CanaryPhase,
    CanaryStatus,
    LLMDeploymentStatus,
    PlanPrediction,
    PlanStatus,
    RejectedOption,
    RevisionStatus,
    ScalingDecision,
)

__all__ = [name for name in dir() if not name.startswith("_")]
