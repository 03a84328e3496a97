"""Translation between the LLMDeployment API and the planner.

`plan_request_from_spec` turns a validated `spec` into the planner's `PlanRequest`;
`plan_status_from_plan` turns the planner's `Plan` into the API's `status.plan`;
`learned_speeds`/`speed_factors_for` carry live speed factors between status and planner.

Pure: no I/O beyond the packaged catalog (read once and cached), no clock. Where the API and
the planner model a concept differently, the difference is resolved here, and each place says
why. Both packages export a `GpuType` (the API an enum of names, the catalog a record of
numbers), so they are imported under explicit names.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmfleet.api import (
    MAX_RATIONALE_LINES,
    MAX_REJECTED_OPTIONS,
    TENSOR_PARALLEL_SIZES,
    InvalidSpecError,
    LLMDeploymentSpec,
    LocalAttentionKind,
    ModelArchitecture,
    ModelSpec,
    PlanOverrides,
    PlanPrediction,
    PlanStatus,
    ReleaseRequired,
    ResourcesSpec,
    Runtime,
    hub_repo_id,
)
from llmfleet.api import GpuType as ApiGpuType
from llmfleet.api import KvCacheDtype as ApiKvCacheDtype
from llmfleet.api import Quantization as ApiQuantization
from llmfleet.api import RejectedOption as ApiRejectedOption
from llmfleet.api.status import MAX_LEARNED_SPEEDS, LearnedSpeed
from llmfleet.catalog import Catalog, ModelArch, load_catalog, model_from_numbers
from llmfleet.catalog.release_record import (
    ReleaseError,
    ReleaseRecord,
    ReleaseRequirement,
    release_for,
    release_requirement,
)
from llmfleet.planner.types import (
    ClusterGpus,
    Plan,
    release_required_json,
    PlanRequest,
    Predicted,
    SearchSpace,
    SloTargets,
    SpeedFactor,
    Workload,
)

INLINE_MODEL_NAME = "inline architecture"
# Status string limits of the API (see api/status.py); longer planner text is cut to fit.
MAX_STATUS_LINE_CHARS = 1024
MAX_REJECTED_OPTION_CHARS = 256
TRUNCATION_MARK = "..."


def model_arch_from_spec(model: ModelSpec, *, context_window_tokens: int | None = None,
                         catalog: Catalog | None = None) -> ModelArch:
    """The planner's architecture for `spec.model`: the catalog entry, or the inline numbers.

    `context_window_tokens` bounds the inline model's context (the API has no such field);
    omitted, `model_from_numbers`' default applies.
    """
    if model.name is not None:
        return (catalog or load_catalog()).model(model.name.value)
    return model_arch_from_architecture(model.architecture, context_window_tokens=context_window_tokens)


def model_arch_from_architecture(architecture: ModelArchitecture, *,
                                 context_window_tokens: int | None = None) -> ModelArch:
    """An inline `spec.model.architecture` as the planner's `ModelArch`."""
    dense = architecture.num_experts is None
    numbers = dict(
        name=INLINE_MODEL_NAME,
        num_layers=architecture.num_layers,
        hidden_size=architecture.hidden_size,
        num_attention_heads=architecture.num_attention_heads,
        num_kv_heads=architecture.num_kv_heads,
        head_dim=architecture.head_dim,
        intermediate_size=architecture.intermediate_size,
        vocab_size=architecture.vocab_size,
        # The API spells a dense model as "no experts"; the planner as one expert per token.
        num_experts=1 if dense else architecture.num_experts,
        experts_per_token=1 if dense else architecture.experts_per_token,
        architecture_class=architecture.model_class or "",
        **architecture_kind_numbers(architecture),
    )
    if context_window_tokens is not None:
        numbers["max_position_embeddings"] = context_window_tokens
    untied = model_from_numbers(**numbers)
    tied = model_from_numbers(**numbers, tie_word_embeddings=True)
    # The API does not say whether the output head shares the embedding table, but it does
    # give the published parameter count: pick the reading that reproduces it. The two differ
    # by vocab x hidden parameters, which is GiBs of weights for a large vocabulary.
    declared_params = architecture.parameter_count_billions * 1e9
    return min((untied, tied), key=lambda arch: abs(arch.total_params - declared_params))


def architecture_kind_numbers(architecture: ModelArchitecture) -> dict[str, int | str]:
    """The MoE, latent- and local-attention fields the API sets, as ModelArch's keyword arguments
    (the API leaves a field out where the planner's default, 0 or 1, means the same)."""
    numbers: dict[str, int | str] = {
        name: value for name, value in (
            ("num_shared_experts", architecture.num_shared_experts),
            ("expert_intermediate_size", architecture.expert_intermediate_size),
            ("dense_first_layers", architecture.dense_first_layers),
            ("moe_layer_interval", architecture.moe_layer_interval),
        ) if value is not None
    }
    latent = architecture.latent_attention
    if latent is not None:
        numbers.update(kv_lora_rank=latent.kv_lora_rank, qk_rope_head_dim=latent.qk_rope_head_dim,
                       qk_nope_head_dim=latent.qk_nope_head_dim, v_head_dim=latent.v_head_dim,
                       q_lora_rank=latent.q_lora_rank or 0)
    local = architecture.local_attention
    if local is not None:
        numbers.update(local_attention_window_tokens=local.window_tokens,
                       local_attention_kind=LOCAL_ATTENTION_KIND_NAMES[local.kind],
                       full_attention_layer_interval=local.full_attention_layer_interval or 0)
    return numbers


# The API spells the local-attention kinds as Kubernetes enum values, the catalog as config words.
LOCAL_ATTENTION_KIND_NAMES = {LocalAttentionKind.SLIDING_WINDOW: "sliding", LocalAttentionKind.CHUNKED: "chunked"}


def _quantizations_within_quality_budget(spec: LLMDeploymentSpec, catalog: Catalog) -> tuple[str, ...]:
    """Quantisations allowed by both spec.resources and spec.slo.quality, in API order. Without
    a quality budget (and no pinned quantisation) only the catalog's near-lossless formats."""
    allowed = set(ApiQuantization)
    if spec.resources is not None and spec.resources.allowed_quantizations is not None:
        allowed &= set(spec.resources.allowed_quantizations)
    quality = spec.slo.quality
    if quality is not None and quality.allowed_quantizations is not None:
        allowed &= set(quality.allowed_quantizations)
    no_budget = quality is None or (quality.allowed_quantizations is None and quality.max_quality_loss_percent is None)
    if no_budget and (spec.plan is None or spec.plan.quantization is None):
        lossless = {q for q in ApiQuantization if catalog.quantizations[q.value].allowed_without_quality_budget}
        if not allowed & lossless:
            raise InvalidSpecError([(
                "spec.resources.allowedQuantizations",
                f"allows only formats that lose quality ({', '.join(sorted(q.value for q in allowed))}) "
                "and spec.slo.quality sets no budget for them; without one the planner uses only "
                f"{', '.join(q.value for q in ApiQuantization if q in lossless)}: allow one of those, or set "
                "spec.slo.quality.allowedQuantizations or maxQualityLossPercent",
            )])
        allowed &= lossless
    if not allowed:
        # Admission cannot see this (CEL compares a pin with each list, not the two lists), so
        # it is reported the same way as a rejected field.
        raise InvalidSpecError([(
            "spec.slo.quality.allowedQuantizations",
            "none of these is in spec.resources.allowedQuantizations, so no quantisation is "
            "left to plan with; allow at least one quantisation in both lists",
        )])
    return tuple(q.value for q in ApiQuantization if q in allowed)


def _workload_from_spec(spec: LLMDeploymentSpec) -> Workload:
    workload = spec.workload
    prefix_sharing_fraction = workload.prefix_sharing_fraction or 0.0
    # The API accepts 1.0, the planner needs less: a prompt that matches the prefix cache
    # completely still has its last token computed to produce the first output token.
    fully_shared_limit = (workload.input_tokens_mean - 1) / workload.input_tokens_mean
    return Workload(
        input_tokens_mean=workload.input_tokens_mean,
        input_tokens_p99=workload.input_tokens_p99,
        output_tokens_mean=workload.output_tokens_mean,
        output_tokens_p99=workload.output_tokens_p99,
        peak_requests_per_sec=workload.peak_requests_per_second,
        prefix_sharing_fraction=min(prefix_sharing_fraction, fully_shared_limit),
    )


def _names(values) -> tuple[str, ...]:
    return tuple(value.value for value in values)


def _search_space_from_spec(spec: LLMDeploymentSpec, catalog: Catalog, cluster_gpus: ClusterGpus | None,
                            speed_factors: tuple[SpeedFactor, ...]) -> SearchSpace:
    # An omitted resources block or list allows every value; an omitted pin leaves it open.
    release = serving_release(spec)
    resources = spec.resources or ResourcesSpec()
    pins = spec.plan or PlanOverrides()
    return SearchSpace(
        gpu_types=_names(resources.allowed_gpu_types) if resources.allowed_gpu_types else tuple(catalog.gpus),
        tensor_parallel_sizes=tuple(sorted(resources.allowed_tensor_parallel_sizes or TENSOR_PARALLEL_SIZES)),
        quantizations=_quantizations_within_quality_budget(spec, catalog),
        kv_cache_dtypes=_names(resources.allowed_kv_cache_dtypes or ApiKvCacheDtype),
        gpu_budget=resources.gpu_budget,
        pinned_gpu_type=pins.gpu_type.value if pins.gpu_type else None,
        pinned_tensor_parallel_size=pins.tensor_parallel_size,
        pinned_quantization=pins.quantization.value if pins.quantization else None,
        pinned_kv_cache_dtype=pins.kv_cache_dtype.value if pins.kv_cache_dtype else None,
        # replicas: 0 means "stop serving, keep the resource" (the scale subresource); the
        # configuration is still planned for the peak workload, so only a positive pin reaches
        # the planner, which cannot predict latency at zero replicas.
        pinned_replicas=pins.replicas or None,
        max_batch_size=spec.engine.max_batch_size,
        max_num_tokens=spec.engine.max_num_tokens,
        max_seq_len=spec.engine.max_seq_len,
        release=release.release,
        release_support=(release.support.for_checkpoints(release, hub_repo_id(spec.model.source), spec.model.source)
                         if release.runtime == Runtime.LLMAPI.value else release.support),
        cluster_gpus=cluster_gpus,
        speed_factors=speed_factors,
    )


def serving_release(spec: LLMDeploymentSpec) -> ReleaseRecord:
    """The pinned release behind spec.engine (runtime and image); InvalidSpecError names the
    field when the image is no pinned release of the runtime."""
    try:
        return release_for(spec.engine.runtime.value, spec.engine.image)
    except ReleaseError as error:
        raise InvalidSpecError([("spec.engine.image", str(error))]) from None


def release_requirement_for_spec(spec: LLMDeploymentSpec,
                                 release: ReleaseRecord | None = None) -> ReleaseRequirement | None:
    """Why the release spec.engine names (`release`, when already resolved) cannot run spec.model at
    the longest request the deployment admits (spec.engine.maxSeqLen); None when it can. What the
    planner marks its plan with, from the same model, request length and release: render refuses
    on it, whatever plan it is given."""
    release = release or serving_release(spec)
    model = model_arch_from_spec(spec.model, context_window_tokens=spec.engine.max_seq_len)
    return release_requirement(release.release, release.support, model, spec.engine.max_seq_len)


def plan_request_from_spec(spec: LLMDeploymentSpec, *, catalog: Catalog | None = None,
                           cluster_gpus: ClusterGpus | None = None,
                           learned: Iterable[LearnedSpeed] = ()) -> PlanRequest:
    """The planner's question for a validated `spec`, on a cluster with `cluster_gpus` (None:
    any GPU type the spec allows), with the speeds `learned` from live traffic (any model's:
    those of the spec's model are used).

    Raises InvalidSpecError for a spec that admission accepts but that leaves nothing to plan
    with (no quantisation allowed by both the resources and the quality budget).
    """
    catalog = catalog or load_catalog()
    quality = spec.slo.quality
    return PlanRequest(
        # An inline model's context window is what its engine is built for: spec.engine.maxSeqLen.
        model=model_arch_from_spec(spec.model, context_window_tokens=spec.engine.max_seq_len, catalog=catalog),
        workload=_workload_from_spec(spec),
        slo=SloTargets(
            ttft_p99_ms=spec.slo.ttft_p99_ms,
            tpot_p99_ms=spec.slo.tpot_p99_ms,
            max_quality_loss_percent=quality.max_quality_loss_percent if quality else None,
        ),
        space=_search_space_from_spec(spec, catalog, cluster_gpus, speed_factors_for(spec, learned)),
    )


def model_key(spec: LLMDeploymentSpec) -> str:
    """The model, as learned speeds name it: the catalog name, else the source of an inline
    architecture."""
    model = spec.model
    return model.name.value if model.name else (model.source or INLINE_MODEL_NAME)[:253]


def speed_factors_for(spec: LLMDeploymentSpec, learned: Iterable[LearnedSpeed]) -> tuple[SpeedFactor, ...]:
    """The spec's model's learned speeds, the best-founded one per GPU type and format."""
    key = model_key(spec)
    best: dict[tuple[str, str], LearnedSpeed] = {}
    for speed in learned:
        pair = (speed.gpu_type.value, speed.quantization.value)
        if speed.model == key and (pair not in best or speed.requests > best[pair].requests):
            best[pair] = speed
    return tuple(SpeedFactor(gpu, quantization, s.speed_factor, s.requests)
                 for (gpu, quantization), s in sorted(best.items()))


def learned_speeds(spec: LLMDeploymentSpec, stored: Iterable[LearnedSpeed], updated: SpeedFactor) -> list[LearnedSpeed]:
    """`stored` with `updated` (of the spec's model) in place of its predecessor, most
    requests first, within the API's bound."""
    entry = LearnedSpeed(model=model_key(spec), gpu_type=ApiGpuType(updated.gpu_type),
                         quantization=ApiQuantization(updated.quantization),
                         speed_factor=round(updated.factor, 4), requests=updated.requests)
    others = [s for s in stored if (s.model, s.gpu_type, s.quantization) != (entry.model, entry.gpu_type,
                                                                                entry.quantization)]
    return sorted([entry, *others], key=lambda s: -s.requests)[:MAX_LEARNED_SPEEDS]


def _fit(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def _prediction(predicted: Predicted) -> PlanPrediction:
    return PlanPrediction(
        ttft_p99_ms=predicted.ttft_p99_ms,
        tpot_p99_ms=predicted.tpot_p99_ms,
        kv_bytes_per_token=predicted.kv_bytes_per_token,
        kv_capacity_tokens=predicted.kv_capacity_tokens,
        max_concurrent_requests=predicted.max_concurrent_requests,
        max_throughput_tokens_per_sec=predicted.max_throughput_tokens_per_sec,
    )


def _rejected_option(option: str, reason: str) -> ApiRejectedOption:
    return ApiRejectedOption(option=_fit(option, MAX_REJECTED_OPTION_CHARS),
                             reason=_fit(reason, MAX_STATUS_LINE_CHARS))


def _closest_option(plan: Plan) -> ApiRejectedOption | None:
    """An infeasible plan's closest option as a rejected entry, or None when it has none.

    The planner reports the closest option in the plan's own fields; the API keeps
    `status.plan`'s configuration for what is served and lists the closest option first in
    `rejected`. The planner states why it falls short in the rationale line naming it.
    """
    if plan.gpu_type is None:
        return None
    # The planner's own label form, so the entry reads like the other rejected options.
    configuration = f"{plan.gpu_type} TP{plan.tensor_parallel_size} {plan.quantization} KV {plan.kv_cache_dtype}"
    replicas = f" x{plan.replicas} replicas" if plan.replicas else ""
    reason = next((line for line in plan.rationale if configuration in line), plan.rationale[0])
    return _rejected_option(configuration + replicas, reason)


def plan_status_from_plan(plan: Plan, peak_requests_per_second: float | None = None) -> PlanStatus:
    """`status.plan` for a planner result, within the API's size limits, with the peak rate
    it was planned for.

    A feasible plan fills the configuration and predictions. An infeasible one leaves them
    empty (nothing is served) and puts the closest option first in `rejected`.
    """
    rationale = [_fit(line, MAX_STATUS_LINE_CHARS) for line in plan.rationale][:MAX_RATIONALE_LINES]
    rejected = [_rejected_option(r.option, r.reason) for r in plan.rejected]
    release_required = (ReleaseRequired.model_validate({
        **release_required_json(plan.release_requirement),
        "message": _fit(plan.release_requirement.message, MAX_STATUS_LINE_CHARS)})
        if plan.release_requirement else None)
    if not plan.feasible:
        closest = _closest_option(plan)
        if closest is not None:
            rejected = [closest] + [r for r in rejected if r.option != closest.option]
        return PlanStatus(rationale=rationale, release_required=release_required,
                          rejected=rejected[:MAX_REJECTED_OPTIONS] or None)
    return PlanStatus(
        gpu_type=ApiGpuType(plan.gpu_type),
        tensor_parallel_size=plan.tensor_parallel_size,
        pipeline_parallel_size=plan.pipeline_parallel_size,
        # Set only beyond their defaults, so a TP-only plan's status reads as before.
        expert_parallel_size=plan.expert_parallel_size if plan.expert_parallel_size > 1 else None,
        attention_data_parallel=True if plan.attention_data_parallel else None,
        nodes_per_replica=plan.nodes_per_replica if plan.nodes_per_replica > 1 else None,
        quantization=ApiQuantization(plan.quantization),
        kv_cache_dtype=ApiKvCacheDtype(plan.kv_cache_dtype),
        replicas=plan.replicas,
        gpus_total=plan.gpus_total,
        summary=plan.summary,
        peak_requests_per_second=peak_requests_per_second,
        predicted=_prediction(plan.predicted),
        rationale=rationale,
        capacity_shortfall=_fit(plan.shortfall.message, MAX_STATUS_LINE_CHARS) if plan.shortfall else None,
        release_required=release_required,
        rejected=rejected[:MAX_REJECTED_OPTIONS] or None,
    )


def plan_from_status(stored: PlanStatus) -> Plan | None:
    """The feasible plan a stored `status.plan` describes, to render it again without
    re-planning; None when it holds no configuration (infeasible, or written by nothing)."""
    if stored.gpu_type is None or stored.tensor_parallel_size is None or stored.quantization is None \
            or stored.kv_cache_dtype is None or stored.replicas is None:
        return None
    return Plan(feasible=True, gpu_type=stored.gpu_type.value, tensor_parallel_size=stored.tensor_parallel_size,
                quantization=stored.quantization.value, kv_cache_dtype=stored.kv_cache_dtype.value,
                replicas=stored.replicas, predicted=None, rationale=tuple(stored.rationale or ()),
                pipeline_parallel_size=stored.pipeline_parallel_size or 1,
                expert_parallel_size=stored.expert_parallel_size or 1,
                attention_data_parallel=bool(stored.attention_data_parallel),
                nodes_per_replica=stored.nodes_per_replica or 1)
