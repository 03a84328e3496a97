"""`LLMDeployment.status`: what the operator observed and decided. Every field is optional."""

from enum import Enum
from typing import Annotated

from pydantic import Field, field_validator

from llmfleet.api.base import ApiModel, KubeTime
from llmfleet.api.conditions import Condition, Reason
from llmfleet.api.enums import GpuType, KvCacheDtype, Quantization, Runtime
from llmfleet.api.spec import TensorParallelSize

# Bounds that keep the status object small; writers keep the most relevant entries.
MAX_CONDITIONS = 16
MAX_RATIONALE_LINES = 32
MAX_REJECTED_OPTIONS = 32
MAX_REVISIONS = 8
MAX_LEARNED_SPEEDS = 16


class PlanPrediction(ApiModel):
    """What the planner's model predicts for one replica of the chosen configuration."""

    ttft_p99_ms: float | None = Field(
        default=None, ge=0, description="Predicted p99 time to first token at peak load, ms."
    )
    tpot_p99_ms: float | None = Field(
        default=None, ge=0, description="Predicted p99 time per output token at peak load, ms."
    )
    kv_bytes_per_token: int | None = Field(
        default=None,
        ge=0,
        description="KV-cache bytes per token: layers x 2 x kvHeads x headDim x bytes per "
        "element (whole model, all TP ranks).",
    )
    kv_capacity_tokens: int | None = Field(
        default=None, ge=0, description="Tokens the KV cache of one replica holds."
    )
    max_concurrent_requests: int | None = Field(
        default=None,
        ge=0,
        description="Requests one replica holds at once at the workload's p99 context.",
    )
    max_throughput_tokens_per_sec: float | None = Field(
        default=None,
        ge=0,
        description="Output tokens per second of one replica at saturation.",
    )


class RejectedOption(ApiModel):
    """A configuration the planner considered and did not choose."""

    option: str = Field(
        max_length=256, description="The configuration, in plan summary form (e.g. H100x1 FP16)."
    )
    reason: str = Field(max_length=1024, description="Why it was not chosen.")


class ReleaseRequired(ApiModel):
    """The TensorRT-LLM release a plan's model needs, because the pinned release spec.engine names
    cannot run its architecture."""

    tensorrt_llm_version: str | None = Field(
        default=None,
        max_length=32,
        description="The first TensorRT-LLM release that runs it (e.g. 1.1.0); omitted when no release "
        "recorded does.",
    )
    runtime: Runtime = Field(description="The runtime of that release (llmapi or engine).")
    architecture: str = Field(
        max_length=128,
        description="What the pinned release lacks: the model's Hugging Face class (e.g. GptOssForCausalLM) "
        "or an attention kind (latent_attention, sliding_window_attention, chunked_attention).",
    )
    message: str = Field(
        max_length=1024,
        description="What the model needs, the release that first runs it with its upstream source, and "
        "what to change in spec.engine.",
    )


class PlanStatus(ApiModel):
    """The configuration the operator serves, and why."""

    gpu_type: GpuType | None = Field(default=None, description="Chosen GPU type.")
    tensor_parallel_size: TensorParallelSize | None = Field(
        default=None, description="GPUs per pipeline stage (tensor parallelism)."
    )
    pipeline_parallel_size: int | None = Field(
        default=None, ge=1, description="Pipeline stages per replica."
    )
    expert_parallel_size: int | None = Field(
        default=None,
        ge=1,
        description="Ranks of a stage that hold whole routed experts (MoE); the experts are split "
        "over expertParallelSize x (tensorParallelSize / expertParallelSize) ranks. Omitted: 1.",
    )
    attention_data_parallel: bool | None = Field(
        default=None,
        description="Each rank of a stage holds the whole attention and serves its own sequences "
        "(MoE with expert parallelism). Omitted: false.",
    )
    nodes_per_replica: int | None = Field(
        default=None,
        ge=1,
        description="Nodes one replica spans, its pipeline stages placed node after node. Omitted: 1. "
        "A plan spanning nodes is not rendered yet (the Ready condition says why).",
    )
    quantization: Quantization | None = Field(default=None, description="Chosen quantisation.")
    kv_cache_dtype: KvCacheDtype | None = Field(
        default=None, description="Chosen KV-cache element type."
    )
    replicas: int | None = Field(
        default=None, ge=0, description="Replicas needed for the peak workload."
    )
    gpus_total: int | None = Field(
        default=None,
        ge=0,
        description="GPUs for all replicas: tensorParallelSize x pipelineParallelSize x replicas.",
    )
    summary: str | None = Field(
        default=None,
        max_length=128,
        description="Short form for kubectl, e.g. H100x2 FP8 (GPU, GPUs per replica, "
        "quantisation).",
    )
    peak_requests_per_second: float | None = Field(
        default=None,
        gt=0,
        description="Peak request rate the plan was made for: spec.workload.peakRequestsPerSecond, "
        "or the higher rate observed when live re-planning made it. Quieter windows never re-plan "
        "below it; a spec change or the llmfleet.io/replan annotation plans for the declared "
        "workload again.",
    )
    predicted: PlanPrediction | None = Field(
        default=None, description="Predicted performance of one replica."
    )
    rationale: list[Annotated[str, Field(max_length=1024)]] | None = Field(
        default=None,
        max_length=MAX_RATIONALE_LINES,
        description="Why this configuration, one statement per line.",
    )
    capacity_shortfall: str | None = Field(
        default=None,
        max_length=1024,
        description="Set when the configuration meeting the SLO needs more GPUs than the cluster "
        "has free: which, how many, and what is served meanwhile (the Planned condition says "
        "CapacityShortfall).",
    )
    release_required: ReleaseRequired | None = Field(
        default=None,
        description="Set when the pinned release (spec.engine) cannot run the model's architecture: "
        "the release that first does, and why. The plan is made and explained all the same but not "
        "rendered (the Ready condition says RenderFailed).",
    )
    rejected: list[RejectedOption] | None = Field(
        default=None,
        max_length=MAX_REJECTED_OPTIONS,
        description="Closest alternatives not chosen, closest first. When no plan is "
        "feasible, the first entry is the closest option.",
    )


class RevisionStatus(ApiModel):
    """One revision (engine build inputs plus plan) that has workload objects."""

    name: str = Field(
        max_length=63, description="Revision hash; child objects are named <name>-<hash>."
    )
    engine_revision: str | None = Field(
        default=None, max_length=63, description="spec.engine.revision it was built from."
    )
    plan_summary: str | None = Field(
        default=None, max_length=128, description="Plan summary of this revision."
    )
    replicas: int | None = Field(default=None, ge=0, description="Desired replicas.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Ready replicas.")
    traffic_percent: int | None = Field(
        default=None, ge=0, le=100, description="Share of traffic it receives, in percent."
    )


class ScalingDecision(str, Enum):
    """What the autoscaler decided last."""

    SCALE_UP = Reason.SCALE_UP
    SCALE_DOWN = Reason.SCALE_DOWN
    HOLD = Reason.HOLD


class ScalingSignal(str, Enum):
    """Which signal decided the autoscaler's last decision."""

    REPLICA_BOUNDS = Reason.REPLICA_BOUNDS  # the count was outside minReplicas..maxReplicas
    TTFT_FEEDBACK = Reason.TTFT_FEEDBACK  # the observed p99 TTFT against the target (and the queue's growth)
    QUEUE_BACKLOG = Reason.QUEUE_BACKLOG  # waiting requests while no first token came out
    REQUEST_RATE = Reason.REQUEST_RATE  # the observed request rate at the modelled per-replica capacity
    RATE_FORECAST = Reason.RATE_FORECAST  # the rate's short trend, ahead of a ramp
    PREFILL_BOUND = Reason.PREFILL_BOUND  # a scale-up the model says would not lower p99 TTFT enough
    UTILIZATION = Reason.UTILIZATION  # KV-cache or batch-slot use on fewer replicas
    METRICS_UNAVAILABLE = Reason.METRICS_UNAVAILABLE  # no usable metrics: holding


class AutoscalerInputs(ApiModel):
    """The observations behind the last scaling decision."""

    observed_ttft_p99_ms: float | None = Field(
        default=None, ge=0, description="Observed p99 TTFT over the window, ms."
    )
    target_ttft_p99_ms: int | None = Field(default=None, ge=1, description="Target p99 TTFT, ms.")
    current_replicas: int | None = Field(default=None, ge=0, description="Replicas when deciding.")
    ready_replicas: int | None = Field(
        default=None, ge=0, description="Ready replicas when deciding."
    )
    requests_per_second: float | None = Field(
        default=None, ge=0, description="Observed request rate, per second."
    )
    kv_cache_utilization_percent: float | None = Field(
        default=None, ge=0, le=100, description="Mean KV-cache block use across replicas, %."
    )
    peak_requests_per_second: float | None = Field(
        default=None, ge=0,
        description="Highest request rate over the scale-down stabilisation window, per second: what a "
        "scale-down must leave capacity for.",
    )
    forecast_requests_per_second: float | None = Field(
        default=None, ge=0,
        description="The request rate its recent trend reaches spec.autoscaling.rateForecastSeconds ahead, "
        "per second (absent while the rate does not rise).",
    )
    replica_capacity_requests_per_second: float | None = Field(
        default=None, ge=0,
        description="Requests per second one replica serves with p99 TTFT at the target, by the planner's "
        "model at the learned speed.",
    )
    prefill_ttft_p99_ms: float | None = Field(
        default=None, ge=0,
        description="p99 TTFT the model predicts at vanishing load (the prompts' own prefill), ms: no "
        "replica count lowers p99 TTFT below it.",
    )
    speed_factor: float | None = Field(
        default=None, gt=0,
        description="The learned speed (status.learnedSpeeds) the capacity was modelled at; 1 when none is "
        "learned yet.",
    )


class ReplicaRecommendation(ApiModel):
    """One change of the autoscaler's recommendation; in force until the next entry."""

    time: KubeTime = Field(description="When this recommendation was first made.")
    replicas: int = Field(ge=0, description="Recommended replicas.")


class AutoscalerStatus(ApiModel):
    """State of the p99-TTFT autoscaler."""

    desired_replicas: int | None = Field(default=None, ge=0, description="Replicas it wants.")
    last_decision: ScalingDecision | None = Field(
        default=None, description="ScaleUp, ScaleDown or Hold."
    )
    last_decision_time: KubeTime | None = Field(
        default=None, description="When the decision or the replicas it wants last changed."
    )
    reason: str | None = Field(
        default=None, max_length=1024, description="Why, in words (e.g. holding: no metrics)."
    )
    signal: ScalingSignal | None = Field(
        default=None,
        description="Which signal decided: TtftFeedback, RequestRate, RateForecast, QueueBacklog, "
        "PrefillBound, Utilization, ReplicaBounds or MetricsUnavailable.",
    )
    reversals: int | None = Field(
        default=None, ge=0,
        description="Scalings in the direction opposite to the previous one within the longer "
        "stabilisation window of it (flapping), counted since the deployment was created.",
    )
    last_scale_direction: ScalingDecision | None = Field(
        default=None, description="ScaleUp or ScaleDown: the direction of the last change, for the reversal count."
    )
    inputs: AutoscalerInputs | None = Field(
        default=None, description="Observations behind the last decision."
    )
    last_scale_time: KubeTime | None = Field(
        default=None, description="When desired replicas last changed (start of the cooldown)."
    )
    warming_since: KubeTime | None = Field(
        default=None,
        description="Since when some replicas have not been ready (start of the warm-up timeout).",
    )
    recommendations: list[ReplicaRecommendation] | None = Field(
        default=None,
        max_length=64,
        description="Recent recommendations, oldest first, for the stabilisation windows.",
    )


class CanaryPhase(str, Enum):
    """Where a canary rollout is."""

    PREPARING = "Preparing"  # the new revision's build/prepare Job runs; no pods, no traffic
    WARMING = "Warming"  # its first replicas start; no step has run
    PROGRESSING = "Progressing"  # walking spec.rollout.steps
    PAUSED = "Paused"  # held by a pause step without duration, or by hand
    PROMOTING = "Promoting"  # scaling the new revision to all replicas before stable goes
    PROMOTED = "Promoted"  # the new revision is stable
    ROLLED_BACK = "RolledBack"  # the canary was scaled to zero; stable untouched
    SUPERSEDED = "Superseded"  # the spec moved on (to a newer revision, or back to stable)


class CanaryStatus(ApiModel):
    """State of the last canary rollout: everything needed to continue after a restart."""

    phase: CanaryPhase | None = Field(default=None, description="Rollout phase.")
    stable_revision: str | None = Field(
        default=None, max_length=63, description="Revision that served before the canary."
    )
    canary_revision: str | None = Field(
        default=None, max_length=63, description="Revision being rolled out."
    )
    step_index: int | None = Field(
        default=None, ge=0, description="Index into spec.rollout.steps of the current step."
    )
    canary_replicas: int | None = Field(
        default=None, ge=0, description="Replicas of the canary revision at this step."
    )
    weight_percent: int | None = Field(
        default=None, ge=0, le=100,
        description="Canary's share of the serving replicas, in percent: the traffic share the "
        "Service's per-connection balancing gives it (precision 100 / replicas)."
    )
    step_started_time: KubeTime | None = Field(
        default=None, description="When the current step (or phase) began."
    )
    message: str | None = Field(
        default=None, max_length=1024, description="Progress or the reason for the phase, in words."
    )
    failed_revisions: list[Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=16,
        description="Revisions that were rolled back; not tried again until `llmfleet rollout retry`."
    )
    last_command: str | None = Field(
        default=None, max_length=128,
        description="The llmfleet.io/rollout-command annotation value handled last."
    )
    analysis_verdict: str | None = Field(
        default=None, max_length=32,
        description="The current analysis step's last verdict: Successful, Failed, Inconclusive, Error or "
                    "StableDegraded (the stable revision breaches the SLO or the error bound: held)."
    )
    analysis_message: str | None = Field(
        default=None, max_length=1024, description="The numbers behind the verdict."
    )
    analysis_time: KubeTime | None = Field(default=None, description="When the verdict was reached.")
    quality_verdict: str | None = Field(
        default=None, max_length=32,
        description="The golden-prompt check's last verdict: Successful, Failed, Inconclusive or Error.",
    )
    quality_message: str | None = Field(
        default=None, max_length=1024, description="The numbers behind the golden-prompt verdict."
    )


class ObservationStatus(ApiModel):
    """The serving revision's traffic as its engines reported it, and the speed fitted to it."""

    time: KubeTime = Field(description="End of the observed window.")
    revision: str = Field(max_length=63, description="The revision observed.")
    window_seconds: int = Field(ge=1, description="Length of the window, seconds.")
    requests: int = Field(ge=0, description="Requests that got a first token in the window.")
    requests_per_second: float = Field(ge=0, description="Their rate over all replicas.")
    replicas: int = Field(ge=0, description="Serving pods that reported.")
    ttft_p99_ms: float | None = Field(default=None, ge=0, description="Observed p99 time to first token, ms.")
    input_tokens_mean: float | None = Field(
        default=None, ge=0, description="Mean prompt length, tokens (only where the serving release "
        "exports token-length histograms: the engine runtime)."
    )
    output_tokens_mean: float | None = Field(
        default=None, ge=0, description="Mean generated length, tokens (as inputTokensMean)."
    )
    prefix_reuse_fraction: float | None = Field(
        default=None, ge=0, description="Share of prompt tokens the KV cache reused (as "
        "inputTokensMean: the engine runtime)."
    )
    speed_factor: float | None = Field(
        default=None, gt=0, description="The speed, relative to the planner's model, at which the model "
        "predicts the observed p99 TTFT at the observed load; none when the window cannot tell."
    )
    message: str | None = Field(default=None, max_length=1024, description="How the fit went, or why none was made.")


class LearnedSpeed(ApiModel):
    """How fast one configuration of a model ran in live traffic, relative to the planner's model."""

    model: str = Field(max_length=253, description="The model (catalog name or inline architecture).")
    gpu_type: GpuType = Field(description="GPU type.")
    quantization: Quantization = Field(description="Weight format.")
    speed_factor: float = Field(gt=0, description="Above 1: faster than modelled; later plans use it.")
    requests: int = Field(ge=0, description="Requests it was learned from.")


class PlanRecommendation(ApiModel):
    """A plan that live metrics show to be better than the one served."""

    reason: str = Field(max_length=64, description="WorkloadDrift, SloAtRisk or CheaperPlan.")
    message: str = Field(max_length=2048, description="Why, with the numbers.")
    time: KubeTime = Field(description="When it was made.")
    plan: PlanStatus = Field(description="The recommended plan.")


class LLMDeploymentStatus(ApiModel):
    """Observed state of an LLMDeployment, written only by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this status describes."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        max_length=MAX_CONDITIONS,
        description="Ready, Planned, WorkloadAvailable, Progressing, Degraded, "
        "AutoscalingActive, MetricsAvailable, RequestsBalanced, EngineBuilt.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    plan: PlanStatus | None = Field(default=None, description="The plan being served.")
    replicas: int | None = Field(
        default=None, ge=0, description="Desired replicas (scale subresource status replicas)."
    )
    ready_replicas: int | None = Field(default=None, ge=0, description="Replicas ready to serve.")
    selector: str | None = Field(
        default=None,
        max_length=1024,
        description="Label selector of the serving pods, in string form (scale subresource).",
    )
    revisions: list[RevisionStatus] | None = Field(
        default=None,
        max_length=MAX_REVISIONS,
        description="Revisions that have workload objects, newest first.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    current_revision: str | None = Field(
        default=None, max_length=63, description="Revision the spec asks for (being rolled out "
        "when it differs from stableRevision)."
    )
    stable_revision: str | None = Field(
        default=None, max_length=63, description="Last revision whose rollout completed (all its "
        "replicas were ready); it keeps serving while a newer one rolls out."
    )
    replan_request: str | None = Field(
        default=None, max_length=256, description="The llmfleet.io/replan annotation value the plan "
        "was made for; a new value asks for a new plan without a spec change."
    )
    autoscaler: AutoscalerStatus | None = Field(default=None, description="Autoscaler state.")
    observation: ObservationStatus | None = Field(
        default=None, description="The last look at live traffic (spec.plan.liveReplanning)."
    )
    learned_speeds: list[LearnedSpeed] | None = Field(
        default=None,
        max_length=MAX_LEARNED_SPEEDS,
        description="Speeds learned from live traffic, by model, GPU type and weight format; every "
        "deployment of the model plans with them.",
    )
    recommendation: PlanRecommendation | None = Field(
        default=None, description="A better plan than the one served, from live metrics."
    )
    canary: CanaryStatus | None = Field(default=None, description="Canary rollout state.")
    ttft_p99_ms: float | None = Field(
        default=None, ge=0, description="Observed p99 time to first token across replicas, ms; "
        "a lower bound when ttftP99 says over (the p99 lies beyond the histogram's top bucket)."
    )
    ttft_p99: str | None = Field(
        default=None, max_length=64, description="Observed p99 time to first token in words, "
        "e.g. '412 ms', or 'over 300000 ms' beyond the histogram's top bucket."
    )

    @field_validator("conditions")
    @classmethod
    def _one_condition_per_type(cls, conditions: list[Condition] | None):
        types = [c.type for c in conditions or []]
        if len(set(types)) != len(types):
            raise ValueError("each condition type may appear only once")
        return conditions

    @field_validator("revisions")
    @classmethod
    def _one_entry_per_revision(cls, revisions: list[RevisionStatus] | None):
        names = [r.name for r in revisions or []]
        if len(set(names)) != len(names):
            raise ValueError("each revision may appear only once")
        return revisions
