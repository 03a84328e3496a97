"""Condition catalog and a pure helper to maintain a metav1.Condition list."""

from collections.abc import Sequence
from datetime import datetime
from enum import Enum

from pydantic import Field

from llmfleet.api.base import ApiModel, KubeTime
from llmfleet.api.enums import ConditionStatus


class ConditionType(str, Enum):
    """Condition types an LLMDeployment reports in status.conditions.

    Ready and Degraded say whether replicas serve, not whether they meet the SLO: no
    condition reads latency. The observed p99 TTFT is in status.ttftP99 and
    status.observation; a plan that misses the SLO at the learned speed is reported in
    status.recommendation (reason SloAtRisk).
    """

    READY = "Ready"  # derived from READY_DEPENDS_ON, never set on its own
    PLANNED = "Planned"  # a feasible plan exists (False: reason and closest option)
    # a revision serves: the current one has rolled out with a replica ready (or wants none),
    # or the stable one has a replica ready while a new one builds, rolls out (also as a
    # canary) or failed to build
    WORKLOAD_AVAILABLE = "WorkloadAvailable"
    PROGRESSING = "Progressing"  # a revision is being built or rolled out
    # the build failed, a canary was rolled back, the apiserver refused to write a child, or
    # the rolled-out revision has fewer ready replicas than desired and no scale-up explains it
    DEGRADED = "Degraded"
    AUTOSCALING_ACTIVE = "AutoscalingActive"  # the autoscaler is deciding replicas
    METRICS_AVAILABLE = "MetricsAvailable"  # Prometheus answers for this deployment
    REQUESTS_BALANCED = "RequestsBalanced"  # no replica is swamped while others idle
    ENGINE_BUILT = "EngineBuilt"  # the engine for the current revision exists


class Reason:
    """Every condition and event reason the operator writes, in one place (CamelCase, for
    machines). Enums whose values are reasons (ScalingDecision, ScalingSignal, MetricsFailure) take them from
    here."""

    # Planned
    PLAN_FOUND = "PlanFound"
    PLAN_INFEASIBLE = "PlanInfeasible"
    # Planned False while serving: the SLO plan needs more GPUs than are free
    CAPACITY_SHORTFALL = "CapacityShortfall"
    # Planned and Ready, for a spec the operator cannot act on
    INVALID_SPEC = "InvalidSpec"
    RENDER_FAILED = "RenderFailed"
    # EngineBuilt (and Progressing/Ready/Degraded while building)
    BUILD_PENDING = "BuildPending"
    BUILDING = "Building"
    ENGINE_READY = "EngineReady"
    BUILD_FAILED = "BuildFailed"
    # WorkloadAvailable (False while the first revision builds: the build's reason)
    REPLICAS_READY = "ReplicasReady"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    SCALED_TO_ZERO = "ScaledToZero"
    # Progressing
    ROLLING_OUT = "RollingOut"
    SCALING_UP = "ScalingUp"
    ROLLED_OUT = "RolledOut"
    # Progressing (False) and Degraded (True) after a canary was rolled back
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    # Events of the canary rollout's steps (rollout/machine.py)
    CANARY_STARTED = "CanaryStarted"
    CANARY_WARMING = "CanaryWarming"
    CANARY_QUALITY_PASSED = "CanaryQualityPassed"
    CANARY_ANALYSIS_SUCCESSFUL = "CanaryAnalysisSuccessful"
    CANARY_PAUSED = "CanaryPaused"
    CANARY_RESUMED = "CanaryResumed"
    CANARY_PROMOTING = "CanaryPromoting"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_SUPERSEDED = "CanarySuperseded"
    # The analysis verdict and Progressing reason (its event a Warning) of a canary held because
    # the stable revision it is compared with breaches the SLO or the error bound
    STABLE_DEGRADED = "StableDegraded"
    # Degraded
    AS_PLANNED = "AsPlanned"
    BELOW_DESIRED_REPLICAS = "BelowDesiredReplicas"
    # the apiserver refused to write a child (the pass is retried)
    CHILD_WRITE_REFUSED = "ChildWriteRefused"
    # Ready (False: the reason of the first condition it depends on that blocks it)
    SERVING = "Serving"
    # AutoscalingActive
    AUTOSCALER_DECIDING = "AutoscalerDeciding"
    # The autoscaler's decisions (status.autoscaler.lastDecision), each an event when replicas change
    SCALE_UP = "ScaleUp"
    SCALE_DOWN = "ScaleDown"
    HOLD = "Hold"
    # The signal that decided it (status.autoscaler.signal)
    REPLICA_BOUNDS = "ReplicaBounds"
    TTFT_FEEDBACK = "TtftFeedback"
    QUEUE_BACKLOG = "QueueBacklog"
    REQUEST_RATE = "RequestRate"
    RATE_FORECAST = "RateForecast"
    PREFILL_BOUND = "PrefillBound"
    UTILIZATION = "Utilization"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    # MetricsAvailable (and RequestsBalanced while it is not True)
    METRICS_FRESH = "MetricsFresh"
    NO_DATA = "NoData"
    NO_TTFT_DATA = "NoTtftData"
    STALE_DATA = "StaleData"
    PARTIAL_DATA = "PartialData"
    PROMETHEUS_UNAUTHORIZED = "PrometheusUnauthorized"
    PROMETHEUS_FORBIDDEN = "PrometheusForbidden"
    PROMETHEUS_TLS_ERROR = "PrometheusTlsError"
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    PROMETHEUS_ERROR = "PrometheusError"
    # RequestsBalanced (Unknown without metrics: MetricsAvailable's reason)
    NO_REPLICA_SWAMPED = "NoReplicaSwamped"
    REPLICA_IMBALANCE = "ReplicaImbalance"
    # status.recommendation from live metrics, and its events; Replanned when it is adopted
    WORKLOAD_DRIFT = "WorkloadDrift"
    SLO_AT_RISK = "SloAtRisk"
    CHEAPER_PLAN = "CheaperPlan"
    REPLANNED = "Replanned"


# Reasons of work under way or done, whatever the status of the condition they sit on
# (EngineBuilt False while Building, Progressing False once RolledOut): their events are Normal.
PROGRESS_REASONS = frozenset({Reason.BUILD_PENDING, Reason.BUILDING, Reason.ENGINE_READY, Reason.ROLLING_OUT,
                              Reason.SCALING_UP, Reason.ROLLED_OUT, Reason.AS_PLANNED, Reason.REPLANNED})


# Reasons of bad news whatever the status they sit on (a canary held beside a degraded stable
# revision: Progressing stays True): their events are Warnings.
WARNING_REASONS = frozenset({Reason.STABLE_DEGRADED})


# Ready is derived, as KServe derives it from a condition set: True when each condition it
# depends on is True, or False for a reason that still serves; otherwise False with the reason
# and message of the first that blocks it. Each entry: the condition and its reasons that do
# not block Ready.
READY_DEPENDS_ON: tuple[tuple[ConditionType, frozenset[str]], ...] = (
    # A capacity shortfall serves the smaller plan meanwhile.
    (ConditionType.PLANNED, frozenset({Reason.CAPACITY_SHORTFALL})),
    (ConditionType.WORKLOAD_AVAILABLE, frozenset()),
)


class Condition(ApiModel):
    """The metav1.Condition shape."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description="Condition type, e.g. Ready, Planned, Progressing.",
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="metadata.generation the condition was computed from.",
    )
    last_transition_time: KubeTime = Field(description="When status last changed (RFC 3339, UTC).")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason for the last transition, for machines.",
    )
    message: str = Field(
        max_length=32768, description="Human-readable detail, including how to fix a problem."
    )


def _type_name(condition_type: ConditionType | str) -> str:
    return condition_type.value if isinstance(condition_type, ConditionType) else condition_type


def find_condition(
    conditions: Sequence[Condition], condition_type: ConditionType | str
) -> Condition | None:
    """The condition of that type, or None."""
    wanted = _type_name(condition_type)
    return next((c for c in conditions if c.type == wanted), None)


def set_condition(
    conditions: Sequence[Condition],
    condition_type: ConditionType | str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """A new list with the condition set; the input is not modified.

    lastTransitionTime moves to `now` only when the status changes, as Kubernetes expects;
    a new type is appended, an existing one keeps its position so patches stay small.
    """
    type_name = _type_name(condition_type)
    previous = find_condition(conditions, type_name)
    transition_time = (
        previous.last_transition_time if previous is not None and previous.status == status else now
    )
    updated = Condition(
        type=type_name,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=transition_time,
        observed_generation=observed_generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_name else c for c in conditions]


def derived_ready(conditions: Sequence[Condition]) -> tuple[ConditionStatus, str, str]:
    """Ready's status, reason and message from READY_DEPENDS_ON, each of which must be set.
    True: the message of the last (what serves), naming any that is False for a reason that
    still serves."""
    tolerated = []
    for condition_type, serves_anyway in READY_DEPENDS_ON:
        condition = find_condition(conditions, condition_type)
        if condition is None:
            raise ValueError(f"Ready is derived from {condition_type.value}, which is not set")
        if condition.status == ConditionStatus.TRUE:
            continue
        if condition.reason not in serves_anyway:
            return ConditionStatus.FALSE, condition.reason, condition.message
        tolerated.append(f"{condition.type} {condition.status.value}: {condition.reason}")
    message = condition.message + (f" ({'; '.join(tolerated)})" if tolerated else "")
    return ConditionStatus.TRUE, Reason.SERVING, message
