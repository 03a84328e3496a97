"""Search for the plan with the fewest GPUs meeting the SLO, and what-if estimates."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmfleet.catalog import Catalog, GpuType, KvCacheDtype, ModelArch, QuantizationFormat, load_catalog
from llmfleet.catalog.release_record import release_requirement
from llmfleet.planner.latency import (
    Engine,
    LoadPrediction,
    build_engine,
    predict_at_concurrency,
    predict_at_load,
    saturation_throughput_tokens_per_sec,
)
from llmfleet.planner.layout import Layout
from llmfleet.planner.memory import (
    activation_bytes_per_gpu,
    kv_bytes_per_token,
    layout_problem,
    weight_bytes_per_gpu,
)
from llmfleet.planner.placement import per_node, replica_extent, replicas_per_node, replicas_that_fit
from llmfleet.planner.types import (
    CapacityShortfall,
    ClusterGpus,
    Estimate,
    Plan,
    PlanRequest,
    Predicted,
    RejectedOption,
    SearchSpace,
    Workload,
)

REJECTED_PER_REASON = 3
REJECTED_TOTAL = 24
# Without a GPU budget, a configuration that misses the SLO even at this many times the
# replicas its throughput needs is judged unable to meet it at any scale.
UNBOUNDED_REPLICA_FACTOR = 1024


@dataclass(frozen=True)
class _Option:
    gpu: GpuType
    layout: Layout
    quantization: QuantizationFormat
    kv_dtype: KvCacheDtype

    @property
    def tensor_parallel_size(self) -> int:
        return self.layout.tensor_parallel_size

    @property
    def label(self) -> str:
        return f"{self.gpu.name} {self.layout.label} {self.quantization.name} KV {self.kv_dtype.name}"

    @property
    def nodes(self) -> int:
        return self.layout.nodes(self.gpu.max_gpus_per_node)

    @property
    def layout_complexity(self) -> tuple[int, int, bool]:
        """Fewer stages, then no EP, then no ADP: each adds communication the model only
        approximates, so at equal GPUs and cost the simpler layout is preferred."""
        return (self.layout.pipeline_parallel_size, self.layout.expert_parallel_size,
                self.layout.attention_data_parallel)

    @property
    def quality_cost_percent(self) -> float:
        return self.quantization.quality_cost_percent + self.kv_dtype.quality_cost_percent


@dataclass(frozen=True)
class _Outcome:
    option: _Option
    reason_class: str | None  # None when the SLO is met
    reason: str
    replicas: int = 0
    engine: Engine | None = None
    prediction: LoadPrediction | None = None
    violation: float = math.inf  # max(predicted / target) over TTFT and TPOT; < 1 means met

    @property
    def gpus(self) -> int:
        return self.replicas * self.option.layout.gpus

    @property
    def cost(self) -> float:
        return self.gpus * self.option.gpu.relative_cost_per_gpu_hour


@dataclass(frozen=True)
class _GpuLimits:
    """What a search may use of the cluster, node by node, a replica's GPUs on one node: for the
    SLO plan, each node's schedulable GPUs (a replica must fit one node; replicas beyond what the
    nodes hold make a shortfall, not a refusal); for a plan that fits now, each node's free GPUs,
    replicas included. A type without nodes has none."""

    gpus_by_node: dict[str, tuple[tuple[str, int], ...]]  # per GPU type: (node, GPUs)
    kind: str  # "schedulable" or "free", for reasons
    reason_class: str
    caps_replicas: bool

    @classmethod
    def schedulable(cls, cluster: ClusterGpus) -> "_GpuLimits":
        return cls(cls._by_type(cluster, lambda n: n.allocatable), "schedulable", "cluster", False)

    @classmethod
    def free(cls, cluster: ClusterGpus) -> "_GpuLimits":
        return cls(cls._by_type(cluster, lambda n: n.free), "free", "capacity", True)

    @staticmethod
    def _by_type(cluster: ClusterGpus, gpus) -> dict[str, tuple[tuple[str, int], ...]]:
        by_type: dict[str, tuple[tuple[str, int], ...]] = {}
        for node in cluster.nodes:
            by_type[node.gpu_type] = (*by_type.get(node.gpu_type, ()), (node.node, gpus(node)))
        return by_type

    def nodes(self, gpu_type: str) -> tuple[tuple[str, int], ...]:
        return self.gpus_by_node.get(gpu_type, ())

    def total(self, gpu_type: str) -> int:
        return sum(gpus for _, gpus in self.nodes(gpu_type))

    def largest_node(self, gpu_type: str) -> int:
        return max((gpus for _, gpus in self.nodes(gpu_type)), default=0)

    def replicas(self, gpu_type: str, gpus_per_replica: int, nodes_per_replica: int = 1) -> int:
        return replicas_that_fit(self.nodes(gpu_type), gpus_per_replica, nodes_per_replica)

    def per_node(self, gpu_type: str) -> str:
        return f"{self.kind} per node: {per_node(self.nodes(gpu_type))}"

    def hold(self, gpu_type: str, gpus_per_replica: int, nodes_per_replica: int = 1) -> str:
        """E.g. "the free H100-SXM-80GB hold 1 replica(s) of 8 GPUs on one node (free per node: n1 8, n2 4)";
        a replica spanning nodes is held by that many nodes with its part free each."""
        return (f"the {self.kind} {gpu_type} hold {self.replicas(gpu_type, gpus_per_replica, nodes_per_replica)} "
                f"replica(s) of {gpus_per_replica} GPUs {replica_extent(gpus_per_replica, nodes_per_replica)} "
                f"({self.per_node(gpu_type)})")


def resolve_model(model: ModelArch | str, catalog: Catalog) -> ModelArch:
    return catalog.model(model) if isinstance(model, str) else model


def support_problem(model: ModelArch, option: _Option) -> tuple[str, str] | None:
    """(reason class, message) when the GPU cannot run this shape, else None."""
    gpu, quant, kv, tp = option.gpu, option.quantization, option.kv_dtype, option.tensor_parallel_size
    if quant.name not in gpu.supported_quantizations or gpu.compute_capability < quant.min_compute_capability:
        return "unsupported", f"{gpu.name} ({gpu.generation}) does not run {quant.name}"
    if kv.name not in gpu.supported_kv_cache_dtypes or gpu.compute_capability < kv.min_compute_capability:
        return "unsupported", f"{gpu.name} ({gpu.generation}) has no {kv.name} KV cache"
    if tp > gpu.max_gpus_per_node:
        return "tensor-parallel", f"TP{tp} exceeds {gpu.max_gpus_per_node} GPUs per node"
    problem = layout_problem(model, option.layout)
    if problem:
        return "tensor-parallel", problem
    return None


def engine_in_space(model: ModelArch, option: _Option, catalog: Catalog, space: SearchSpace,
                    speed_factor: float | None = None) -> Engine:
    """`option`'s engine with the space's engine limits, at `speed_factor` (None: the one the
    space learned for it, else the model's own speed)."""
    if speed_factor is None:
        learned = space.speed_factor(option.gpu.name, option.quantization.name)
        speed_factor = (learned.factor if learned else 1.0) / (1 + space.speed_margin)
    return build_engine(model, option.gpu, option.quantization, option.kv_dtype, option.layout,
                        catalog.calibration, max_batch_size=space.max_batch_size,
                        max_num_tokens=space.max_num_tokens,
                        kv_cache_free_gpu_mem_fraction=space.kv_cache_free_gpu_mem_fraction,
                        speed_factor=speed_factor)


def plan_option(plan: Plan, catalog: Catalog) -> _Option:
    """The configuration a (feasible) plan serves."""
    return _Option(catalog.gpu(plan.gpu_type), plan.layout, catalog.quantization(plan.quantization),
                   catalog.kv_cache_dtype(plan.kv_cache_dtype))


def _gib(value: float) -> str:
    return f"{value / 2**30:.1f} GiB"


def _predict(engine: Engine, request: PlanRequest, replicas: int) -> tuple[LoadPrediction, float]:
    w = request.workload
    prediction = predict_at_load(engine, w.peak_requests_per_sec / replicas, w.input_tokens_mean, w.input_tokens_p99,
                                 w.output_tokens_mean, w.output_tokens_p99, w.prefix_sharing_fraction)
    if prediction.problem:
        return prediction, math.inf
    violation = max(prediction.ttft_p99_ms / request.slo.ttft_p99_ms, prediction.tpot_p99_ms / request.slo.tpot_p99_ms)
    return prediction, violation


def _slo_failure(prediction: LoadPrediction, request: PlanRequest) -> tuple[str, str]:
    if prediction.problem:
        kind = "kv-capacity" if prediction.problem.startswith("KV") else "overloaded"
        return kind, prediction.problem
    slo = request.slo
    misses = []
    if prediction.ttft_p99_ms > slo.ttft_p99_ms:
        misses.append(f"p99 TTFT {prediction.ttft_p99_ms:.0f} ms > {slo.ttft_p99_ms:g} ms")
    if prediction.tpot_p99_ms > slo.tpot_p99_ms:
        misses.append(f"p99 TPOT {prediction.tpot_p99_ms:.1f} ms > {slo.tpot_p99_ms:g} ms")
    ttft_ratio = prediction.ttft_p99_ms / slo.ttft_p99_ms
    tpot_ratio = prediction.tpot_p99_ms / slo.tpot_p99_ms
    return ("ttft-slo" if ttft_ratio >= tpot_ratio else "tpot-slo"), "; ".join(misses)


def _saturation_requests_per_sec(engine: Engine, workload: Workload) -> float:
    """Requests/s one replica of `engine` serves fed without limit, the workload's shared prefixes reused."""
    return saturation_throughput_tokens_per_sec(
        engine, workload.input_tokens_mean, workload.output_tokens_mean,
        workload.input_tokens_mean * workload.prefix_sharing_fraction) / workload.output_tokens_mean


def _search_replicas(engine: Engine, option: _Option, request: PlanRequest, saturation_rps: float,
                     best_gpus: int | None, limits: _GpuLimits | None) -> _Outcome:
    """Fewest replicas of this configuration meeting the SLO (prediction is monotone in load), from
    `saturation_rps` (`_saturation_requests_per_sec`)."""
    w, space = request.workload, request.space
    tp = option.layout.gpus  # GPUs per replica
    spans = option.nodes
    if saturation_rps <= 0:
        return _Outcome(option, "kv-capacity", "KV cache cannot hold one mean-length request")
    fewest = max(1, math.ceil(w.peak_requests_per_sec / saturation_rps))
    if space.pinned_replicas is not None:
        fewest = most = space.pinned_replicas
        if space.gpu_budget and most * tp > space.gpu_budget:
            return _Outcome(option, "gpu-budget", f"{most} pinned replicas need {most * tp} GPUs ({tp} each "
                            f"{replica_extent(tp, spans)}), budget is {space.gpu_budget}", replicas=most, engine=engine)
        if limits is not None and limits.caps_replicas and limits.replicas(option.gpu.name, tp, spans) < most:
            return _Outcome(option, limits.reason_class, f"{most} pinned replicas need {tp} GPUs each "
                            f"{replica_extent(tp, spans)}; {limits.hold(option.gpu.name, tp, spans)}",
                            replicas=most, engine=engine)
    else:
        most = space.gpu_budget // tp if space.gpu_budget else fewest * UNBOUNDED_REPLICA_FACTOR
        if best_gpus is not None and fewest * tp > best_gpus:
            return _Outcome(option, "more-gpus", f"needs at least {fewest * tp} GPUs for the throughput, "
                            f"more than the chosen plan's {best_gpus}", replicas=fewest, engine=engine)
        if most < fewest:
            return _Outcome(option, "gpu-budget", f"needs at least {fewest * tp} GPUs for the throughput, "
                            f"budget is {space.gpu_budget}", replicas=max(most, 0), engine=engine)
        scope = "within the GPU budget" if space.gpu_budget else "at any replica count"
        if limits is not None and limits.caps_replicas and limits.replicas(option.gpu.name, tp, spans) < most:
            most = limits.replicas(option.gpu.name, tp, spans)
            scope = f"within what the {limits.kind} {option.gpu.name} hold, a replica {replica_extent(tp, spans)}"
            if most < fewest:
                return _Outcome(option, limits.reason_class, f"needs at least {fewest} replicas ({fewest * tp} "
                                f"GPUs) for the throughput; {limits.hold(option.gpu.name, tp, spans)}",
                                replicas=most, engine=engine)
    prediction, violation = _predict(engine, request, most)
    if violation > 1:
        kind, reason = _slo_failure(prediction, request)
        if space.pinned_replicas is None:
            reason = f"{reason} ({scope}: {most} replicas)"
        return _Outcome(option, kind, reason, most, engine, prediction, violation)
    low, high = fewest, most
    while low < high:
        middle = (low + high) // 2
        if _predict(engine, request, middle)[1] <= 1:
            high = middle
        else:
            low = middle + 1
    prediction, violation = _predict(engine, request, low)
    return _Outcome(option, None, "meets the SLO", low, engine, prediction, violation)


def _predicted(engine: Engine, request: PlanRequest, prediction: LoadPrediction | None) -> Predicted:
    w = request.workload
    return Predicted(
        ttft_p99_ms=prediction.ttft_p99_ms if prediction else math.inf,
        tpot_p99_ms=prediction.tpot_p99_ms if prediction else math.inf,
        kv_bytes_per_token=kv_bytes_per_token(engine.model, engine.kv_dtype),
        kv_capacity_tokens=engine.fit.kv_capacity_tokens,
        max_concurrent_requests=engine.fit.max_sequences(w.input_tokens_p99 + w.output_tokens_p99,
                                                         engine.max_batch_size),
        max_throughput_tokens_per_sec=saturation_throughput_tokens_per_sec(
            engine, w.input_tokens_mean, w.output_tokens_mean, w.input_tokens_mean * w.prefix_sharing_fraction),
    )


def _bounded_rejections(outcomes: list[_Outcome]) -> tuple[RejectedOption, ...]:
    """The best few of each reason class: fewest GPUs first, then nearest to the SLO."""
    by_class: dict[str, list[_Outcome]] = {}
    for outcome in outcomes:
        by_class.setdefault(outcome.reason_class or "not-chosen", []).append(outcome)
    kept: list[RejectedOption] = []
    for _, group in sorted(by_class.items()):
        group.sort(key=lambda o: (o.violation, o.gpus or math.inf, o.cost, o.option.label))
        for outcome in group[:REJECTED_PER_REASON]:
            replicas = f" x{outcome.replicas} replicas" if outcome.replicas else ""
            kept.append(RejectedOption(option=outcome.option.label + replicas,
                                       reason=f"{outcome.reason_class or 'not-chosen'}: {outcome.reason}"))
    return tuple(kept[:REJECTED_TOTAL])


def _layouts(model: ModelArch, gpu: GpuType, quantization: QuantizationFormat, tps: list[int],
             space: SearchSpace, catalog: Catalog) -> list[Layout]:
    """The layouts searched for one GPU type and format. TP alone always. PP only where no TP
    size alone holds the weights on one node: it buys memory, not speed (each GPU streams as many
    weight bytes per step as its TP group alone, and a prompt waits out the bubble). For models
    with experts, EP over every divisor of TP that divides the experts, and attention data
    parallelism with EP = TP (the layout TensorRT-LLM's DeepSeek recipes use); only what the
    serving release builds."""
    support = space.release_support
    stages = [1]
    if (support is None or support.pipeline_parallel) and not any(
            weight_bytes_per_gpu(model, quantization, tp) + activation_bytes_per_gpu(
                model, tp, space.max_num_tokens, space.max_batch_size) + catalog.calibration.runtime_reserve_bytes
            < gpu.memory_bytes for tp in tps):
        stages = sorted(set(space.pipeline_parallel_sizes) | {1})
    layouts = []
    for pp in stages:
        # A layout whose one replica exceeds the GPU budget is not searched.
        for tp in (tp for tp in tps if pp == 1 or not space.gpu_budget or tp * pp <= space.gpu_budget):
            layouts.append(Layout(tp, pp))
            if not model.is_moe or tp == 1:
                continue
            if support is None or support.expert_parallel:
                layouts.extend(Layout(tp, pp, ep) for ep in range(2, tp + 1) if tp % ep == 0)
            if support is None or (support.expert_parallel and support.attention_data_parallel):
                layouts.append(Layout(tp, pp, tp, attention_data_parallel=True))
    return layouts


def _placement_problem(option: _Option, limits: _GpuLimits, space: SearchSpace) -> tuple[str, str] | None:
    """Why the cluster's nodes cannot hold one replica: a TP group on one node, a replica larger
    than a node over whole-node parts."""
    gpu_name, gpus, nodes = option.gpu.name, option.layout.gpus, option.nodes
    if not limits.total(gpu_name):
        return limits.reason_class, f"0 {gpu_name} are {limits.kind}; {space.cluster_gpus.describe()}"
    if nodes == 1 and limits.largest_node(gpu_name) < gpus:
        return limits.reason_class, f"a replica needs {gpus} {limits.kind} {gpu_name} on one node; {limits.per_node(gpu_name)}"
    if nodes > 1 and limits.replicas(gpu_name, gpus, nodes) < 1:
        return limits.reason_class, (f"a replica needs {nodes} nodes with {gpus // nodes} {limits.kind} {gpu_name} "
                                     f"each; {limits.per_node(gpu_name)}")
    return None


def _options(request: PlanRequest, catalog: Catalog, rejected: list[_Outcome],
             limits: _GpuLimits | None) -> list[_Option]:
    space = request.space
    gpus = [space.pinned_gpu_type] if space.pinned_gpu_type else list(space.gpu_types)
    tps = [space.pinned_tensor_parallel_size] if space.pinned_tensor_parallel_size else list(space.tensor_parallel_sizes)
    quants = [space.pinned_quantization] if space.pinned_quantization else list(space.quantizations)
    kvs = [space.pinned_kv_cache_dtype] if space.pinned_kv_cache_dtype else list(space.kv_cache_dtypes)
    options = []
    for gpu_name in gpus:
        gpu = catalog.gpu(gpu_name)
        for quant_name in quants:
            quantization = catalog.quantization(quant_name)
            for layout in _layouts(request.model, gpu, quantization, sorted(set(tps)), space, catalog):
                for kv_name in kvs:
                    option = _Option(gpu, layout, quantization, catalog.kv_cache_dtype(kv_name))
                    problem = support_problem(request.model, option)
                    if problem is None and limits is not None:
                        problem = _placement_problem(option, limits, space)
                    if problem is None and space.release_support is not None:
                        why = (space.release_support.problem(gpu_name, quant_name, kv_name, space.release)
                               or space.release_support.layout_problem(
                                   layout.pipeline_parallel_size, layout.expert_parallel_size,
                                   layout.attention_data_parallel, space.release))
                        problem = ("release", why) if why else None
                    budget = request.slo.max_quality_loss_percent
                    if problem is None and budget is not None and option.quality_cost_percent > budget:
                        problem = ("quality", f"quality cost {option.quality_cost_percent:.1f}% "
                                   f"({quant_name} + KV {kv_name}) exceeds the {budget:g}% budget")
                    if problem:
                        rejected.append(_Outcome(option, problem[0], problem[1]))
                    else:
                        options.append(option)
    return options


def plan(request: PlanRequest, catalog: Catalog | None = None) -> Plan:
    """The configuration with the fewest GPUs meeting p99 TTFT and TPOT at peak load
    (ties: lower relative cost, then more headroom, then lower quality cost).

    Given the cluster's GPUs, only types it has are chosen, and a replica's GPUs must fit one of
    its nodes. When that plan needs more replicas than the free GPUs hold (a replica's GPUs on
    one node), a plan meeting the SLO on the free GPUs is chosen instead; failing that, the SLO
    plan's configuration with the replicas the free GPUs hold (or, if they hold none, the SLO
    plan itself, waiting for GPUs), with the shortfall said, node by node. A model the serving
    release cannot run is planned all the same, the plan marked with the release it needs."""
    catalog = catalog or load_catalog()
    return _mark_release_requirement(_plan_for_cluster(request, catalog), request, catalog)


def _mark_release_requirement(chosen: Plan, request: PlanRequest, catalog: Catalog) -> Plan:
    """The plan, marked with the release it needs where the serving release cannot run the
    model's architecture at the longest request the deployment admits: planned all the same, so
    the user sees the plan and why it waits, and refused at render (nothing renders a model the
    image cannot run)."""
    space, w = request.space, request.workload
    if space.release_support is None or space.release is None:
        return chosen
    needed = release_requirement(space.release, space.release_support, resolve_model(request.model, catalog),
                                 space.max_seq_len or w.input_tokens_p99 + w.output_tokens_p99)
    if needed is None:
        return chosen
    return replace(chosen, release_requirement=needed, rationale=(*chosen.rationale, f"not rendered: {needed.message}"))


def _plan_for_cluster(request: PlanRequest, catalog: Catalog) -> Plan:
    cluster = request.space.cluster_gpus
    if cluster is None:
        return _plan_within(request, catalog, None)
    slo_plan = _plan_within(request, catalog, _GpuLimits.schedulable(cluster))
    if not slo_plan.feasible:
        return slo_plan
    free = _GpuLimits.free(cluster)
    gpu_type = slo_plan.gpu_type
    gpus_per_replica = slo_plan.tensor_parallel_size * slo_plan.pipeline_parallel_size
    nodes = slo_plan.nodes_per_replica
    fitting = free.replicas(gpu_type, gpus_per_replica, nodes)
    if slo_plan.replicas <= fitting:
        return replace(slo_plan, rationale=(*slo_plan.rationale, _placement(slo_plan, free)))
    label = f"{slo_plan.replicas} x {gpu_type} {slo_plan.layout.label} {slo_plan.quantization} KV {slo_plan.kv_cache_dtype}"
    fits_now = _plan_within(request, catalog, free)
    if fits_now.feasible:
        return replace(fits_now, rationale=(*fits_now.rationale, _placement(fits_now, free),
                                            f"{label} would need {slo_plan.replicas} replicas of {gpus_per_replica} "
                                            f"GPUs; {free.hold(gpu_type, gpus_per_replica, nodes)}"))
    shortfall = CapacityShortfall(label, gpu_type, slo_plan.replicas, gpus_per_replica, fitting,
                                  cluster.of(gpu_type).free, cluster.of(gpu_type).allocatable, free.nodes(gpu_type),
                                  nodes)
    if fitting == 0 or request.space.pinned_replicas is not None:
        return replace(slo_plan, shortfall=shortfall, rationale=(
            *slo_plan.rationale, f"{free.hold(gpu_type, gpus_per_replica, nodes)}: pods beyond them wait for GPUs"))
    return replace(slo_plan, replicas=fitting, shortfall=shortfall, rationale=(
        *slo_plan.rationale, f"serving {fitting} replica(s), what the free {gpu_type} hold, a replica "
                             f"{replica_extent(gpus_per_replica, nodes)} "
                             f"({free.per_node(gpu_type)}), until {slo_plan.replicas - fitting} more fit"))


def _placement(chosen: Plan, free: _GpuLimits) -> str:
    """Where the free GPUs hold the plan's replicas, e.g. "placement: 3 replica(s) of 4 GPUs,
    each on one node; replicas the free H100-SXM-80GB hold per node: n1 2, n2 1". The scheduler
    binds the pods; with replicas of one size any order it binds them in fits as many
    (planner.placement)."""
    gpus_per_replica = chosen.tensor_parallel_size * chosen.pipeline_parallel_size
    if chosen.nodes_per_replica > 1:
        return (f"placement: {chosen.replicas} replica(s) of {gpus_per_replica} GPUs, each "
                f"{replica_extent(gpus_per_replica, chosen.nodes_per_replica)}; {free.per_node(chosen.gpu_type)}")
    room = replicas_per_node(free.nodes(chosen.gpu_type), gpus_per_replica)
    return (f"placement: {chosen.replicas} replica(s) of {gpus_per_replica} GPUs, each on one node; replicas the "
            f"free {chosen.gpu_type} hold per node: {per_node(room)}")


def _plan_within(request: PlanRequest, catalog: Catalog, limits: _GpuLimits | None) -> Plan:
    model = resolve_model(request.model, catalog)
    request = PlanRequest(model, request.workload, request.slo, request.space)
    w, space = request.workload, request.space
    context_p99 = w.input_tokens_p99 + w.output_tokens_p99
    if context_p99 > model.max_position_embeddings:
        reason = (f"p99 context {context_p99:.0f} tokens exceeds the model's "
                  f"{model.max_position_embeddings}-token context window")
        return Plan(False, None, None, None, None, 0, None, (reason,))
    rejected: list[_Outcome] = []
    viable: list[tuple[int, _Option, Engine, float]] = []
    for option in _options(request, catalog, rejected, limits):
        engine = engine_in_space(model, option, catalog, space)
        fit = engine.fit
        if not fit.weights_fit:
            needed = fit.weight_bytes_per_gpu + fit.activation_bytes_per_gpu + fit.runtime_reserve_bytes
            rejected.append(_Outcome(option, "memory", f"weights {_gib(fit.weight_bytes_per_gpu)} + activations "
                                     f"{_gib(fit.activation_bytes_per_gpu)} + runtime {_gib(fit.runtime_reserve_bytes)} "
                                     f"per GPU exceed {_gib(option.gpu.memory_bytes)}",
                                     violation=1 + needed / option.gpu.memory_bytes))
            continue
        if fit.max_sequences(context_p99, space.max_batch_size) < 1:
            rejected.append(_Outcome(option, "kv-capacity", f"KV cache of {fit.kv_capacity_tokens} tokens cannot "
                                     f"hold one p99-context request ({context_p99:.0f} tokens)", engine=engine))
            continue
        saturation_rps = _saturation_requests_per_sec(engine, w)
        fewest_gpus = math.ceil(w.peak_requests_per_sec / saturation_rps) * option.layout.gpus
        viable.append((fewest_gpus, option, engine, saturation_rps))
    viable.sort(key=lambda item: (item[0], item[0] * item[1].gpu.relative_cost_per_gpu_hour, item[1].label))
    met: list[_Outcome] = []
    best_gpus: int | None = None  # the fewest GPUs of a configuration that met the SLO so far
    for _, option, engine, saturation_rps in viable:
        outcome = _search_replicas(engine, option, request, saturation_rps, best_gpus, limits)
        if outcome.reason_class is None:
            met.append(outcome)
            best_gpus = outcome.gpus if best_gpus is None else min(best_gpus, outcome.gpus)
        else:
            rejected.append(outcome)
    evaluated = len(met) + len(rejected)
    if met:
        met.sort(key=lambda o: (o.gpus, round(o.cost, 6), o.option.layout_complexity, o.violation,
                                o.option.quality_cost_percent, o.option.label))
        chosen, others = met[0], met[1:]
        rejected.extend(_Outcome(o.option, "not-chosen", _why_not(o, chosen), o.replicas, o.engine, o.prediction,
                                 o.violation) for o in others)
        return _plan_from(chosen, True, request, evaluated, len(met), rejected)
    scored = [o for o in rejected if o.engine is not None and o.prediction is not None]
    if scored:
        closest = min(scored, key=lambda o: (o.violation, o.gpus, o.cost, o.option.label))
        return _plan_from(closest, False, request, evaluated, 0, [o for o in rejected if o is not closest])
    reasons = sorted({o.reason_class for o in rejected if o.reason_class})
    headline = "no configuration fits: " + (", ".join(reasons) if reasons else "the search space is empty")
    closest_fit = min((o for o in rejected if o.reason_class == "memory"), key=lambda o: o.violation, default=None)
    rationale = [headline]
    if closest_fit:
        rationale.append(f"closest: {closest_fit.option.label}: {closest_fit.reason}")
    if closest_fit is None:
        return Plan(False, None, None, None, None, 0, None, tuple(rationale), _bounded_rejections(rejected))
    return _layout_fields(Plan(False, closest_fit.option.gpu.name, closest_fit.option.tensor_parallel_size,
                               closest_fit.option.quantization.name, closest_fit.option.kv_dtype.name, 0,
                               None, tuple(rationale), _bounded_rejections(rejected)), closest_fit.option)


def _layout_fields(plan: Plan, option: _Option) -> Plan:
    layout = option.layout
    return replace(plan, pipeline_parallel_size=layout.pipeline_parallel_size,
                   expert_parallel_size=layout.expert_parallel_size,
                   attention_data_parallel=layout.attention_data_parallel, nodes_per_replica=option.nodes)


def _why_not(outcome: _Outcome, chosen: _Outcome) -> str:
    if outcome.gpus > chosen.gpus:
        return f"meets the SLO but needs {outcome.gpus} GPUs (chosen: {chosen.gpus})"
    if round(outcome.cost, 6) > round(chosen.cost, 6):
        return f"meets the SLO with {outcome.gpus} GPUs but costs {outcome.cost:.2f} (chosen: {chosen.cost:.2f})"
    if outcome.option.layout_complexity > chosen.option.layout_complexity:
        return (f"meets the SLO with {outcome.gpus} GPUs at equal cost, but {chosen.option.layout.label} does "
                f"with less communication than {outcome.option.layout.label}")
    return (f"meets the SLO with {outcome.gpus} GPUs at equal cost but less headroom "
            f"({1 - outcome.violation:.0%} vs {1 - chosen.violation:.0%}) or more quality cost")


def _plan_from(outcome: _Outcome, feasible: bool, request: PlanRequest, evaluated: int, meeting: int,
               rejected: list[_Outcome]) -> Plan:
    option, engine, prediction = outcome.option, outcome.engine, outcome.prediction
    w, slo = request.workload, request.slo
    predicted = _predicted(engine, request, prediction)
    fit = engine.fit
    label = f"{outcome.replicas} x {option.label}"
    rationale = [f"evaluated {evaluated} configurations (GPU x TP x quantisation x KV dtype); {meeting} met the SLO "
                 f"without needing more GPUs than the best found so far"]
    if feasible:
        rationale.append(f"chosen {label}: fewest GPUs ({outcome.gpus}) meeting p99 TTFT {slo.ttft_p99_ms:g} ms "
                         f"and p99 TPOT {slo.tpot_p99_ms:g} ms at {w.peak_requests_per_sec:g} req/s; "
                         f"ties broken by relative cost, then headroom")
        rationale.append(f"headroom {1 - outcome.violation:.0%} to the tighter of the two SLO targets")
    else:
        rationale.append(f"infeasible; closest option {label}: {outcome.reason_class}: {outcome.reason}")
    if prediction and math.isfinite(prediction.ttft_p99_ms):
        rationale.append(
            f"per replica at {w.peak_requests_per_sec / max(outcome.replicas, 1):.3g} req/s: decode batch "
            f"{prediction.decode_batch:.1f} (p99 {prediction.concurrency_p99}), p99 queue wait "
            f"{prediction.queue_wait_p99_ms:.0f} ms, p99 TTFT {prediction.ttft_p99_ms:.0f} ms, "
            f"p99 TPOT {prediction.tpot_p99_ms:.1f} ms")
    rationale.append(
        f"memory per GPU: weights {_gib(fit.weight_bytes_per_gpu)}, activations {_gib(fit.activation_bytes_per_gpu)}, "
        f"runtime {_gib(fit.runtime_reserve_bytes)}, KV pool {_gib(fit.kv_budget_bytes_per_gpu)} = "
        f"{fit.kv_capacity_tokens} tokens, {predicted.max_concurrent_requests} requests at p99 context")
    learned = request.space.speed_factor(option.gpu.name, option.quantization.name)
    margin = request.space.speed_margin
    if learned is not None:
        rationale.append(f"live metrics: {learned.gpu_type} {learned.quantization} ran at {learned.factor:.2f}x the "
                         f"modelled speed over {learned.requests} requests; predictions for {option.label} use "
                         + (f"{learned.factor / (1 + margin):.2f}x, that less a {margin:.0%} margin" if margin
                            else "that"))
    elif margin:
        rationale.append(f"predictions for {option.label} use {1 / (1 + margin):.2f}x the modelled speed, "
                         f"a {margin:.0%} margin")
    budget = request.slo.max_quality_loss_percent
    rationale.append(f"quality cost {option.quality_cost_percent:.1f}% ({option.quantization.name} + KV "
                     f"{option.kv_dtype.name})" + (f" within the {budget:g}% budget" if budget is not None else ""))
    rationale.extend(_layout_rationale(outcome, rejected))
    return _layout_fields(Plan(
        feasible=feasible,
        gpu_type=option.gpu.name,
        tensor_parallel_size=option.tensor_parallel_size,
        quantization=option.quantization.name,
        kv_cache_dtype=option.kv_dtype.name,
        replicas=outcome.replicas,
        predicted=predicted,
        rationale=tuple(rationale),
        rejected=_bounded_rejections(rejected),
    ), option)


def _family(layout: Layout) -> str:
    """`TP`, `TP x PP`, `TP x EP`, `TP x EP + ADP`, ...: a layout without its sizes."""
    return " x ".join(["TP"] + (["PP"] if layout.pipeline_parallel_size > 1 else [])
                      + (["EP"] if layout.expert_parallel_size > 1 else [])) + (
        " + ADP" if layout.attention_data_parallel else "")


def _closeness(outcome: _Outcome) -> tuple[bool, float, float]:
    """Meeting the SLO first, then fewest GPUs, then nearest to the SLO."""
    return (outcome.reason_class not in (None, "not-chosen"), outcome.gpus or math.inf, outcome.violation)


def _layout_rationale(chosen: _Outcome, others: list[_Outcome]) -> list[str]:
    """Why this layout and not the others: said when the layout is more than TP or when other
    layouts were searched (a TP-only plan among TP-only options reads as before)."""
    option, engine = chosen.option, chosen.engine
    layout = option.layout
    families: dict[str, _Outcome] = {}
    for other in others:
        family = _family(other.option.layout)
        if family == _family(layout) or other.reason_class in ("unsupported", "quality"):
            continue
        best = families.get(family)
        if best is None or _closeness(other) < _closeness(best):
            families[family] = other
    if layout.is_tensor_parallel_only and not families:
        return []
    batch = chosen.prediction.decode_batch if chosen.prediction and math.isfinite(chosen.prediction.decode_batch) else 0
    why = []
    if layout.pipeline_parallel_size > 1:
        why.append(f"{layout.pipeline_parallel_size} pipeline stages because no TP size alone holds the weights "
                   f"on one {option.gpu.name}; the replica spans {option.nodes} node(s), a stage's TP group within "
                   f"one, stage hand-offs {1000 * (engine.handoff_seconds_per_step + batch * engine.handoff_seconds_per_token):.2f} "
                   f"ms per step ({'over the network between nodes' if option.nodes > 1 else 'over NVLink'}), "
                   f"and a prompt's last chunk passes the stages one after another (the bubble)")
    if layout.attention_data_parallel:
        why.append(f"attention data parallel over {layout.tensor_parallel_size} ranks: each holds whole attention "
                   f"and its own sequences' KV, so the cache holds {engine.fit.kv_capacity_tokens} tokens per replica "
                   f"instead of every rank repeating the same sequences; MoE all-to-all "
                   f"{1000 * (engine.alltoall_seconds_per_step + batch * engine.alltoall_seconds_per_token):.2f} ms per step")
    elif layout.expert_parallel_size > 1:
        why.append(f"experts whole on {layout.expert_parallel_size} ranks (expert TP {layout.expert_tensor_parallel_size})")
    lines = [f"layout {layout.label}: " + ("; ".join(why) if why else "tensor parallelism alone")]
    if families:
        lines.append("other layouts: " + "; ".join(
            f"{family} (best {o.option.label}" + (f" x{o.replicas}" if o.replicas else "")
            + f"): {o.reason_class or 'not-chosen'}: {o.reason}" for family, o in sorted(families.items())))
    return lines


def _runnable_engine(model: ModelArch, gpu_type: str, parallel: Layout | int, quantization: str, kv_dtype: str,
                     context_tokens: int, catalog: Catalog, *, max_batch_size: int, max_num_tokens: int,
                     kv_cache_free_gpu_mem_fraction: float) -> tuple[_Option, Engine]:
    """The engine of a fixed configuration (`parallel`: its layout, or a TP size alone); ValueError
    when it cannot run (unsupported format, bad layout, weights or one request of `context_tokens`
    do not fit)."""
    option = _Option(catalog.gpu(gpu_type), Layout.of(parallel), catalog.quantization(quantization),
                     catalog.kv_cache_dtype(kv_dtype))
    problem = support_problem(model, option)
    if problem:
        raise ValueError(problem[1])
    engine = build_engine(model, option.gpu, option.quantization, option.kv_dtype, option.layout,
                          catalog.calibration, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                          kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction)
    if not engine.fit.weights_fit:
        raise ValueError(f"{option.label}: weights {_gib(engine.fit.weight_bytes_per_gpu)} per GPU do not fit")
    if engine.fit.max_sequences(context_tokens, max_batch_size) < 1:
        raise ValueError(f"{option.label}: KV cache of {engine.fit.kv_capacity_tokens} tokens cannot hold "
                         f"one {context_tokens}-token request")
    return option, engine


def estimate(model: ModelArch | str, gpu_type: str, tensor_parallel_size: int, quantization: str, kv_dtype: str,
             isl: int, osl: int, concurrency: int = 1, *, catalog: Catalog | None = None,
             max_batch_size: int = 2048, max_num_tokens: int = 8192,
             kv_cache_free_gpu_mem_fraction: float = 0.9) -> Estimate:
    """What-if numbers for one replica of a fixed configuration. Raises ValueError when the
    configuration cannot run (unsupported format, bad TP, weights or one request do not fit)."""
    if min(isl, osl, concurrency) < 1:
        raise ValueError("isl, osl and concurrency must be at least 1")
    catalog = catalog or load_catalog()
    model = resolve_model(model, catalog)
    option, engine = _runnable_engine(model, gpu_type, tensor_parallel_size, quantization, kv_dtype, isl + osl,
                                      catalog, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                                      kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction)
    ttft_s, tpot_s = predict_at_concurrency(engine, isl, osl, concurrency)
    return Estimate(
        kv_bytes_per_token=kv_bytes_per_token(model, option.kv_dtype),
        kv_capacity_tokens=engine.fit.kv_capacity_tokens,
        max_concurrent_requests=engine.fit.max_sequences(isl + osl, max_batch_size),
        max_throughput_tokens_per_sec=saturation_throughput_tokens_per_sec(engine, isl, osl),
        ttft_ms=ttft_s * 1000,
        tpot_ms=tpot_s * 1000,
    )


def max_throughput_tokens_per_sec(model: ModelArch | str, gpu_type: str, parallel: Layout | int,
                                  quantization: str, kv_dtype: str, isl: int, osl: int, *, catalog: Catalog,
                                  max_batch_size: int = 2048, max_num_tokens: int = 8192,
                                  kv_cache_free_gpu_mem_fraction: float = 0.9) -> float:
    """estimate()'s max_throughput_tokens_per_sec alone, without its latencies (the calibration
    fit evaluates it a hundred thousand times). `parallel`: the replica's layout, or a TP size alone."""
    _, engine = _runnable_engine(resolve_model(model, catalog), gpu_type, parallel, quantization,
                                 kv_dtype, isl + osl, catalog, max_batch_size=max_batch_size,
                                 max_num_tokens=max_num_tokens,
                                 kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction)
    return saturation_throughput_tokens_per_sec(engine, isl, osl)
