"""`spec.autoscaling`: replica autoscaling on observed p99 TTFT."""

from pydantic import Field

from llmfleet.api.base import ApiModel, CelRule


class AutoscalingSpec(ApiModel):
    """Replica autoscaling on observed p99 TTFT and the request rate at the modelled capacity."""

    enabled: bool = Field(
        default=False,
        description="Scale replicas on observed p99 TTFT. When false, replicas are the "
        "planned count for the peak workload (or spec.plan.replicas).",
    )
    min_replicas: int = Field(default=1, ge=1, description="Fewest replicas.")
    max_replicas: int = Field(default=4, ge=1, description="Most replicas.")
    target_ttft_p99_ms: int | None = Field(
        default=None,
        ge=1,
        description="p99 TTFT the autoscaler steers to, in milliseconds; at most "
        "spec.slo.ttftP99Ms. Defaults to 60 % of the way from the prefill floor (the p99 TTFT "
        "the planner's model predicts at a vanishing load) to spec.slo.ttftP99Ms, so that "
        "scaling starts before the SLO breaks.",
    )
    tolerance_percent: float = Field(
        default=10.0,
        ge=0,
        le=100,
        description="Dead band around the target, in percent, within which nothing scales.",
    )
    scale_up_stabilization_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Window whose lowest recommendation is used for scaling up, in seconds.",
    )
    scale_down_stabilization_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Window whose highest recommendation is used for scaling down, in seconds.",
    )
    max_scale_up_step: int = Field(
        default=4, ge=1, description="Most replicas added by one scaling decision."
    )
    max_scale_down_step: int = Field(
        default=1, ge=1, description="Most replicas removed by one scaling decision."
    )
    cooldown_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Quiet time after any scaling decision before replicas are removed, in "
        "seconds, so that the metrics show the fleet the last decision left. Scale-ups never "
        "wait for it; they wait only while new replicas load their engine.",
    )

    rate_forecast_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="How far ahead, in seconds, the request rate's recent trend is extrapolated "
        "to start replicas before a ramp peaks: about the time a new replica takes to serve "
        "(engine load plus a scrape and a pass). 0 (the default) turns the forecast off: a step "
        "in traffic reads as a ramp in a windowed rate, and the extrapolation overshoots it.",
    )

    cel_rules = (
        CelRule(
            rule="self.minReplicas <= self.maxReplicas",
            message="spec.autoscaling.minReplicas must be less than or equal to maxReplicas; "
            "raise maxReplicas or lower minReplicas",
            holds=lambda a: a.min_replicas <= a.max_replicas,
            field_path=".minReplicas",
        ),
    )
