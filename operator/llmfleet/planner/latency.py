"""Latency and throughput model of one TensorRT-LLM engine (one replica = one TP group).

Every forward step of in-flight batching carries one token for each decoding request plus
(part of) the prompts admitted into it. A step costs the larger of
  - memory time: weights read once + the batch's KV read, over effective HBM bandwidth, and
  - compute time: GEMM + attention FLOPs over effective tensor-core throughput,
plus the layout's communication (TP all-reduces, the MoE all-to-all under attention data
parallelism, pipeline hand-offs, each over NVLink within a node or the node pool's network across
nodes) and a fixed launch/scheduling overhead per pipeline stage.
Efficiency factors come from the catalog's calibration (fitted to public measurements).

With pipeline parallelism the step is the cycle in which every decoding sequence advances one
token: the batch runs as PP micro-batches, each through every stage, so each GPU streams its
stage's weights once per micro-batch (PP times a cycle: as many bytes as its TP alone would read)
while the FLOPs and the KV reads are shared by all TP x PP GPUs. That is why PP buys memory but no
decode speed; with fewer micro-batches than stages the stages wait for each other (the bubble).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmfleet.catalog import Calibration, GpuType, KvCacheDtype, ModelArch, QuantizationFormat
from llmfleet.planner.layout import Layout
from llmfleet.planner.memory import (
    UNQUANTIZED_BYTES_PER_PARAM,
    MemoryFit,
    layer_params_per_gpu,
    memory_fit,
)

# Attention (FMHA) runs in 16 bit regardless of the GEMM format.
ATTENTION_PRECISION = "bf16"
Z_P99 = 2.3263478740408408  # standard normal 99th percentile
P99_TAIL = 0.01
# steady_step_seconds: rounds of its fixed-point climb, and the relative step at which it has arrived.
STEADY_STATE_ROUNDS = 200
STEADY_STATE_TOLERANCE = 1e-9
# Beyond this p99/mean ratio a lognormal fit has no solution; treat longer tails as this one.
MAX_LOGNORMAL_P99_OVER_MEAN = math.exp(Z_P99 ** 2 / 2) - 1e-9


@dataclass(frozen=True)
class Engine:
    """A configuration plus the per-step constants derived from it."""

    model: ModelArch
    gpu: GpuType
    quantization: QuantizationFormat
    kv_dtype: KvCacheDtype
    layout: Layout
    max_batch_size: int
    max_num_tokens: int
    fit: MemoryFit
    # Linear-layer weights one rank streams per step, every stage's (see weight_bytes_read_per_step).
    streamed_layer_params: int
    calibration: Calibration
    effective_bandwidth_bytes_per_sec: float
    prefill_gemm_flops_per_sec: float
    decode_gemm_flops_per_sec: float
    prefill_attention_flops_per_sec: float
    decode_attention_flops_per_sec: float
    # Per step (latencies) and per token carried (bytes over the link), by kind.
    allreduce_seconds_per_step: float
    allreduce_seconds_per_token: float
    alltoall_seconds_per_step: float
    alltoall_seconds_per_token: float
    handoff_seconds_per_step: float
    handoff_seconds_per_token: float

    @property
    def tensor_parallel_size(self) -> int:
        return self.layout.tensor_parallel_size

    @property
    def communication_seconds_per_step(self) -> float:
        return self.allreduce_seconds_per_step + self.alltoall_seconds_per_step + self.handoff_seconds_per_step

    @property
    def communication_seconds_per_token(self) -> float:
        return self.allreduce_seconds_per_token + self.alltoall_seconds_per_token + self.handoff_seconds_per_token

    @property
    def overhead_seconds_per_step(self) -> float:
        """The fixed launch/scheduling overhead, once per stage on every token's path."""
        return self.layout.pipeline_parallel_size * self.calibration.step_overhead_ms / 1000.0


def generation_efficiency_scale(gpu: GpuType, calibration: Calibration) -> float:
    """Multiplier on the compute and memory-bandwidth efficiencies for a GPU generation that has
    its own fitted factor (calibration.yaml's generation_efficiency_scales, each fitted to that
    generation's rows). 1.0, no effect, for Hopper (the reference the shared factors are fitted
    to) and for any generation without one, whose estimates use the shared factors alone."""
    return calibration.generation_efficiency_scale(gpu.generation)


def moe_efficiency_scale(model: ModelArch, calibration: Calibration) -> float:
    """Multiplier on the compute and memory-bandwidth efficiencies for models with experts (fitted
    to the Mixtral rows); 1.0 for dense models."""
    return calibration.moe_efficiency_scale if model.num_experts > 1 else 1.0


def tensor_parallel_scale(tensor_parallel_size: int, calibration: Calibration) -> float:
    """Multiplier on the compute and memory-bandwidth efficiencies of a TP group (fitted per TP size
    to the rows with that TP): each rank's GEMMs are narrower and its kernel launches and
    synchronisation are not divided by TP, so a rank reaches less of its peak as TP grows. 1.0
    for TP1 and for a size without a fitted factor."""
    return calibration.tensor_parallel_scale(tensor_parallel_size)


def build_engine(model: ModelArch, gpu: GpuType, quantization: QuantizationFormat, kv_dtype: KvCacheDtype,
                 parallel: Layout | int, calibration: Calibration, *, max_batch_size: int,
                 max_num_tokens: int, kv_cache_free_gpu_mem_fraction: float, speed_factor: float = 1.0,
                 gpus_per_node: int | None = None) -> Engine:
    """`parallel`: the replica's layout, or a TP size alone. `speed_factor`: how much faster than
    the calibrated model this configuration was seen to run (learned from live metrics,
    `planner.live`); it scales the compute and memory efficiencies as the generation, MoE and TP
    factors do. `gpus_per_node`: the replica's GPUs on each of its nodes, where they are known
    (a running rank group); the planner fills whole nodes of the GPU type."""
    layout = Layout.of(parallel)
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    cal = calibration
    scale = (generation_efficiency_scale(gpu, cal) * moe_efficiency_scale(model, cal)
             * tensor_parallel_scale(tp, cal) * speed_factor)
    # Every GPU of every stage computes: pipelined micro-batches keep them all busy.
    gemm = gpu.dense_flops_per_sec(quantization.activation_precision) * tp * pp * scale
    attention = gpu.dense_flops_per_sec(ATTENTION_PRECISION) * tp * pp * scale
    nvlink = (gpu.interconnect_bandwidth_bytes_per_sec * cal.interconnect_efficiency
              * cal.generation_interconnect_scale(gpu.generation))
    network = gpu.inter_node_bandwidth_bytes_per_sec * cal.interconnect_efficiency
    collective_latency_s = cal.allreduce_latency_us * 1e-6
    activation_bytes = model.hidden_size * UNQUANTIZED_BYTES_PER_PARAM
    # Per-token link times are shared by the PP micro-batches running at once on different stages.
    allreduces = 0 if tp == 1 or layout.attention_data_parallel else 2 * model.num_layers
    # Ring all-reduce moves 2(TP-1)/TP of the message per rank, within the stage's node.
    allreduce_per_step = allreduces * collective_latency_s
    allreduce_per_token = allreduces * activation_bytes * 2 * (tp - 1) / tp / nvlink / pp
    if layout.attention_data_parallel and tp > 1:
        # Each rank dispatches its own tokens (1/TP of them) to the ranks of their experts and takes
        # the results back: per MoE layer two messages of experts_per_token hidden states, all but
        # the 1/EP share staying on the rank.
        ep = layout.expert_parallel_size
        alltoall_per_step = 2 * model.num_moe_layers * collective_latency_s
        alltoall_per_token = (2 * model.num_moe_layers * model.experts_per_token * activation_bytes
                              * (ep - 1) / ep / tp / nvlink / pp)
    else:
        alltoall_per_step = alltoall_per_token = 0.0
    # A token's path around the pipeline: PP - 1 forward hand-offs of its hidden state and the
    # sampled token back to the first stage; the ones between nodes go over the network.
    nodes = layout.nodes(gpus_per_node or gpu.max_gpus_per_node)
    cross, cross_forward = (nodes, nodes - 1) if nodes > 1 else (0, 0)
    if pp > 1:
        handoff_per_step = ((pp - cross) * collective_latency_s + cross * gpu.inter_node_latency_us * 1e-6)
        handoff_per_token = activation_bytes * ((pp - 1 - cross_forward) / nvlink + cross_forward / network) / pp
    else:
        handoff_per_step = handoff_per_token = 0.0
    return Engine(
        model=model, gpu=gpu, quantization=quantization, kv_dtype=kv_dtype, layout=layout,
        max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
        streamed_layer_params=layer_params_per_gpu(
            model, Layout(tp, 1, layout.expert_parallel_size, layout.attention_data_parallel)),
        fit=memory_fit(model, gpu, quantization, kv_dtype, layout, cal, max_num_tokens=max_num_tokens,
                       max_batch_size=max_batch_size,
                       kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction),
        calibration=cal,
        effective_bandwidth_bytes_per_sec=gpu.memory_bandwidth_bytes_per_sec * cal.memory_bandwidth_efficiency * scale,
        prefill_gemm_flops_per_sec=gemm * cal.prefill_compute_efficiency,
        decode_gemm_flops_per_sec=gemm * cal.decode_compute_efficiency,
        prefill_attention_flops_per_sec=attention * cal.prefill_compute_efficiency,
        decode_attention_flops_per_sec=attention * cal.decode_compute_efficiency,
        allreduce_seconds_per_step=allreduce_per_step,
        allreduce_seconds_per_token=allreduce_per_token,
        alltoall_seconds_per_step=alltoall_per_step,
        alltoall_seconds_per_token=alltoall_per_token,
        handoff_seconds_per_step=handoff_per_step,
        handoff_seconds_per_token=handoff_per_token,
    )


def weight_bytes_read_per_step(engine: Engine, decode_batch: float) -> float:
    """Weights one rank streams per step: all of them for dense models; for MoE only the experts
    the batch's tokens are routed to (expected distinct experts under uniform routing). With PP a
    rank streams its stage once per micro-batch, as many bytes per step as its TP group alone."""
    model, layout = engine.model, engine.layout
    tp = layout.tensor_parallel_size
    q_bytes = engine.quantization.weight_bytes_per_param
    lm_head = model.lm_head_params / layout.attention_tensor_parallel_size * UNQUANTIZED_BYTES_PER_PARAM
    layers = engine.streamed_layer_params
    if not model.is_moe:
        return layers * q_bytes + lm_head
    # Routed experts only: shared experts are read every step like the dense weights.
    all_experts = model.num_moe_layers * model.num_experts * model.mlp_params_per_expert / tp
    miss = (1 - model.experts_per_token / model.num_experts) ** max(decode_batch, 1.0)
    touched_fraction = 1 - miss
    return (layers - all_experts + all_experts * touched_fraction) * q_bytes + lm_head


def gemm_flops_per_token(model: ModelArch) -> float:
    return 2.0 * model.active_layer_params


def rank_local_gemm_flops_per_token(model: ModelArch) -> float:
    """The part of gemm_flops_per_token that, under attention data parallelism, only the token's own
    rank computes: all but its routed experts (attention projections, dense MLPs, shared experts,
    router), whose weights every rank holds whole."""
    routed = model.num_moe_layers * model.experts_per_token * model.mlp_params_per_expert
    return 2.0 * (model.active_layer_params - routed)


def rank_imbalance_slowdown(ranks: int, balanced_seconds: float, rest_seconds: float) -> float:
    """How much longer than `balanced_seconds` (that work spread evenly over the ranks) a step waits
    for prompt work that only its own rank can do, when the ranks meet at every MoE layer. Each rank
    is busy with such work a fraction q = balanced / (rest + balanced) of a step on average, in whole
    prompts, independently of the others; the step lasts until the busiest rank is done, so it waits
    the work's span whenever any rank has some: (1 - (1 - q)^ranks) of the time, against q spread
    evenly. 1 when prompts keep every rank busy (q -> 1), `ranks` for a rare prompt (q -> 0).
    TensorRT-LLM's ADP balance blog measures the effect (docs/source/blogs/tech_blog/
    blog10_ADP_Balance_Strategy.md: an iteration takes its slowest rank's time; 54 % mean balance)."""
    if ranks == 1 or balanced_seconds <= 0:
        return 1.0
    busy = balanced_seconds / (rest_seconds + balanced_seconds)
    return (1 - (1 - busy) ** ranks) / busy


def lm_head_flops(model: ModelArch) -> float:
    return 2.0 * model.vocab_size * model.hidden_size


def decode_attention_flops(model: ModelArch, context_tokens: float) -> float:
    """QK^T and AV for one new token over its context (local layers: their window), 2 FLOPs per
    multiply-add per head over the query-key and value dimensions (ModelArch.decode_attention_dims)."""
    qk_dim, v_dim = model.decode_attention_dims
    return 2.0 * model.num_attention_heads * (qk_dim + v_dim) * model.attended_tokens(context_tokens)


def prefill_attention_flops(model: ModelArch, new_tokens: float, prefix_tokens: float) -> float:
    """Causal QK^T and AV for new_tokens that follow prefix_tokens already in the cache."""
    qk_dim, v_dim = model.prefill_attention_dims
    return 2.0 * model.num_attention_heads * (qk_dim + v_dim) * model.attended_pairs(prefix_tokens, new_tokens)


def step_seconds(engine: Engine, decode_batch: float, decode_context_tokens: float,
                 prefill_tokens: float = 0.0, prefill_attention: float = 0.0,
                 prefill_sequences: float = 0.0, one_prompt: bool = False) -> float:
    """Duration of one in-flight-batching step. Its kernels run one after another, each bounded
    by its own roofline: the GEMMs by streaming the weights or by their FLOPs, decode attention
    by reading the KV cache or by its FLOPs, prefill attention by its FLOPs; then the all-reduces
    and a fixed overhead. (One roofline over the whole step, max(memory, compute), let the KV
    reads of a large long-context batch hide under the GEMMs' compute: long answers were
    estimated up to twice the measured throughput; docs/planner.md, Latency model.)
    Under attention DP a prompt's attention, dense layers and LM head run on its own rank alone:
    `one_prompt` (a prompt's own prefill, for its TTFT) waits for that rank; otherwise the step
    carries many requests' prompts, spread over the ranks (`rank_imbalance_slowdown`)."""
    model = engine.model
    ranks = engine.layout.sequence_shards
    prompt_local_flops = (prefill_tokens * rank_local_gemm_flops_per_token(model)
                          + prefill_sequences * lm_head_flops(model)) if ranks > 1 else 0.0
    prompt_shared_flops = (prefill_tokens * gemm_flops_per_token(model) + prefill_sequences * lm_head_flops(model)
                           - prompt_local_flops)
    weights_s = weight_bytes_read_per_step(engine, decode_batch) / engine.effective_bandwidth_bytes_per_sec
    gemm_s = (decode_batch * (gemm_flops_per_token(model) + lm_head_flops(model)) / engine.decode_gemm_flops_per_sec
              + prompt_shared_flops / engine.prefill_gemm_flops_per_sec)
    kv_read_s = (decode_batch * engine.fit.kv_bytes_read_per_sequence(decode_context_tokens)
                 / engine.effective_bandwidth_bytes_per_sec)
    decode_attention_s = (decode_batch * decode_attention_flops(model, decode_context_tokens)
                          / engine.decode_attention_flops_per_sec)
    prefill_attention_s = prefill_attention / engine.prefill_attention_flops_per_sec
    communication_s = (engine.communication_seconds_per_step
                       + (decode_batch + prefill_tokens) * engine.communication_seconds_per_token)
    rest_s = (max(weights_s, gemm_s) + max(kv_read_s, decode_attention_s) + communication_s
              + engine.overhead_seconds_per_step + (0.0 if ranks > 1 else prefill_attention_s))
    prompt_local_s = (prompt_local_flops / engine.prefill_gemm_flops_per_sec
                      + (prefill_attention_s if ranks > 1 else 0.0))
    slowdown = ranks if one_prompt else rank_imbalance_slowdown(ranks, prompt_local_s, rest_s)
    return rest_s + slowdown * prompt_local_s


def prefill_chunks(engine: Engine, new_tokens: float, decode_batch: float) -> int:
    """Steps a prompt is computed in: chunks of what max_num_tokens leaves beside the decode batch."""
    budget = max(1.0, engine.max_num_tokens - decode_batch)
    return max(1, math.ceil(new_tokens / budget))


def prefill_seconds(engine: Engine, new_tokens: float, prefix_tokens: float, decode_batch: float,
                    decode_context_tokens: float) -> float:
    """Time from a prompt's first step to its first token, chunked by max_num_tokens (the decode
    batch shares each step's token budget). With PP a step's prompt work is spread over the stages
    as if they ran at once; the last chunk, though, passes them one after another before its first
    token exists: PP - 1 more times its own work (the pipeline bubble of a prompt)."""
    chunks = prefill_chunks(engine, new_tokens, decode_batch)
    chunk = new_tokens / chunks
    total = last_chunk_s = 0.0
    for index in range(chunks):
        done = prefix_tokens + index * chunk
        last_chunk_s = step_seconds(engine, decode_batch, decode_context_tokens, chunk,
                                    prefill_attention_flops(engine.model, chunk, done),
                                    prefill_sequences=1.0 if index == chunks - 1 else 0.0, one_prompt=True)
        total += last_chunk_s
    stages = engine.layout.pipeline_parallel_size
    if stages > 1:
        total += (stages - 1) * (last_chunk_s - step_seconds(engine, decode_batch, decode_context_tokens))
    return total


def prompt_occupancy_seconds(engine: Engine, new_tokens: float, prefix_tokens: float, decode_batch: float,
                             decode_context_tokens: float, other_prompt_tokens: float = 0.0) -> float:
    """Time a prompt adds to the steps it is computed in. Prompts are counted whole, chunk by
    chunk, not spread over every step: a memory-bound decode step takes a few prompt tokens
    almost free, but a step carrying a chunk of up to max_num_tokens, or several prompts, is
    compute-bound. Each chunk shares its step with `other_prompt_tokens` (the mean prompt tokens
    a step carries at this load, as far as the token budget leaves room) and takes its share, by
    tokens, of what the step's prompt tokens add to the decode step."""
    decode_s = step_seconds(engine, decode_batch, decode_context_tokens)
    if new_tokens <= 0:  # all of it reused from the cache: only its LM head is computed
        return step_seconds(engine, decode_batch, decode_context_tokens, prefill_sequences=1.0) - decode_s
    chunks = prefill_chunks(engine, new_tokens, decode_batch)
    chunk = new_tokens / chunks
    room = max(0.0, engine.max_num_tokens - decode_batch - chunk)
    others = min(other_prompt_tokens, room)
    total = 0.0
    for index in range(chunks):
        attention = prefill_attention_flops(engine.model, chunk, prefix_tokens + index * chunk)
        completed = (1.0 if index == chunks - 1 else 0.0) + others / new_tokens
        shared_s = step_seconds(engine, decode_batch, decode_context_tokens, chunk + others,
                                attention * (chunk + others) / chunk, prefill_sequences=completed)
        total += chunk / (chunk + others) * (shared_s - decode_s)
    return total


def saturation_batch(engine: Engine, input_tokens: float, output_tokens: float) -> int:
    """Largest steady decode batch: bounded by max_batch_size, by the KV cache holding whole
    sequences (input + output, as guaranteed_no_evict reserves them) and by max_num_tokens
    having to carry the decode tokens plus the prompts that replace finished requests."""
    by_kv = engine.fit.max_sequences(input_tokens + output_tokens, engine.max_batch_size)
    by_tokens = max(1, int(engine.max_num_tokens / (1 + input_tokens / output_tokens)))
    return max(0, min(by_kv, by_tokens))


def saturation_throughput_tokens_per_sec(engine: Engine, input_tokens: float, output_tokens: float,
                                         prefix_tokens: float = 0.0) -> float:
    """Output tokens/s of one replica fed without limit: B sequences decoding in every step and,
    per step on average, B / output_tokens new prompts (finished requests are replaced), each
    adding its occupancy."""
    batch = saturation_batch(engine, input_tokens, output_tokens)
    if batch == 0:
        return 0.0
    context = input_tokens + output_tokens / 2
    new_tokens = input_tokens - prefix_tokens
    prompts_per_step = batch / output_tokens
    occupancy = prompt_occupancy_seconds(engine, new_tokens, prefix_tokens, batch, context,
                                         prompts_per_step * new_tokens)
    step = step_seconds(engine, batch, context) + prompts_per_step * occupancy
    return batch / step


def steady_step_seconds(engine: Engine, requests_per_sec: float, new_input_tokens: float,
                        prefix_tokens: float, output_tokens: float, decode_context_tokens: float) -> float | None:
    """Mean step time tau at an arrival rate, or None when the engine cannot keep up.

    Per second the engine runs 1/tau steps, each decoding the batch B = rate x output_tokens x tau
    (Little's law), and takes `rate` prompts, each adding its occupancy (`prompt_occupancy_seconds`).
    So tau x (1 - rate x occupancy(B)) = decode_step(B). The decode step is a maximum of affine
    maps in tau, max(weights, GEMMs) + max(KV reads, attention) + all-reduce + overhead (a sum of
    maxima is the maximum of the sums), whose least fixed point is the largest of the pieces'
    fixed points. The occupancy (and, for MoE, the weights streamed) grows with B, so each round
    takes them at the previous round's B: from tau = 0 the rounds climb to the least fixed point.
    A piece with slope of one or more, or rounds still climbing after STEADY_STATE_ROUNDS, means
    work arrives faster than steps can absorb it.
    """
    model = engine.model
    rate = requests_per_sec
    decode_per_tau = rate * output_tokens
    bandwidth = engine.effective_bandwidth_bytes_per_sec
    gemm_slope = decode_per_tau * (gemm_flops_per_token(model) + lm_head_flops(model)) / engine.decode_gemm_flops_per_sec
    attention_slope = max(decode_per_tau * engine.fit.kv_bytes_read_per_sequence(decode_context_tokens) / bandwidth,
                          decode_per_tau * decode_attention_flops(model, decode_context_tokens)
                          / engine.decode_attention_flops_per_sec)
    fixed_slope = attention_slope + decode_per_tau * engine.communication_seconds_per_token
    fixed = engine.communication_seconds_per_step + engine.overhead_seconds_per_step
    tau = 0.0
    for _ in range(STEADY_STATE_ROUNDS):
        batch = decode_per_tau * tau
        free = 1 - rate * prompt_occupancy_seconds(engine, new_input_tokens, prefix_tokens, batch,
                                                   decode_context_tokens, rate * tau * new_input_tokens)
        if free <= gemm_slope + fixed_slope:
            return None
        weights_s = weight_bytes_read_per_step(engine, batch) / bandwidth
        next_tau = max((weights_s + fixed) / (free - fixed_slope), fixed / (free - gemm_slope - fixed_slope))
        if next_tau - tau <= STEADY_STATE_TOLERANCE * next_tau:
            return next_tau
        tau = next_tau
    return None


def lognormal_cv(mean: float, p99: float) -> float:
    """Coefficient of variation of a lognormal with this mean and 99th percentile."""
    ratio = min(p99 / mean, MAX_LOGNORMAL_P99_OVER_MEAN)
    if ratio <= 1.0:
        return 0.0
    # p99/mean = exp(z*sigma - sigma^2/2): take the smaller root for sigma.
    sigma = Z_P99 - math.sqrt(Z_P99 ** 2 - 2 * math.log(ratio))
    return math.sqrt(math.expm1(sigma ** 2))


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `offered_load` < `servers`."""
    term = total = 1.0
    for count in range(1, servers):
        term *= offered_load / count
        total += term
    all_busy = term * offered_load / servers * servers / (servers - offered_load)
    return all_busy / (total + all_busy)


def slot_wait_seconds(slots: int, slots_in_use: float, hold_s: float) -> tuple[float, float]:
    """(mean, p99) wait for a free sequence slot, as in M/M/c with c = slots and mean hold
    `hold_s`: Erlang C gives the chance of waiting, and a waiting request's wait is exponential
    with mean hold_s / (c - load). Holds are less variable than exponential, which alone would
    halve the wait (Allen-Cunneen), but so scaled the model fell short of the emulator's
    scheduler at every load tried; the plain form is the conservative one
    (docs/benchmarks/planner-vs-emulator.md)."""
    waiting = erlang_c(slots, slots_in_use)
    mean_if_waiting = hold_s / (slots - slots_in_use)
    p99 = mean_if_waiting * math.log(waiting / P99_TAIL) if waiting > P99_TAIL else 0.0
    return waiting * mean_if_waiting, p99


def poisson_p99(mean: float) -> int:
    """99th percentile of a Poisson count (exact sum for small means, normal beyond)."""
    if mean <= 0:
        return 0
    if mean > 200:
        return math.ceil(mean + Z_P99 * math.sqrt(mean))
    term = cumulative = math.exp(-mean)
    count = 0
    while cumulative < 1 - P99_TAIL:
        count += 1
        term *= mean / count
        cumulative += term
    return count


@dataclass(frozen=True)
class LoadPrediction:
    ttft_p99_ms: float
    # The mean the p99 is built on (each part's mean); what a mean-TTFT measurement checks.
    ttft_mean_ms: float
    tpot_p99_ms: float
    queue_wait_p99_ms: float
    decode_batch: float
    concurrency_p99: int
    problem: str | None


def predict_at_load(engine: Engine, requests_per_sec: float, input_tokens_mean: float, input_tokens_p99: float,
                    output_tokens_mean: float, output_tokens_p99: float,
                    prefix_sharing_fraction: float) -> LoadPrediction:
    """p99 TTFT and TPOT of one replica receiving Poisson arrivals at requests_per_sec.

    A request first waits for a sequence slot: the engine holds at most `slots` sequences
    (max_batch_size, or fewer when the KV cache cannot reserve that many at p99 length), each
    for its whole life, so slots are the servers of an M/G/c queue (`slot_wait_seconds`).
    Admitted prompts then compete for the engine's compute: each one adds an 'occupancy' (the
    extra time it puts into the steps it rides in). Prompts wait for each other as in an M/G/1
    queue, whose mean wait is Pollaczek-Khinchine and whose tail is taken as exponential,
    P(W > t) = rho exp(-rho t / E[W]). TTFT = slot wait + prompt queue wait + wait for the
    running step to end + the prompt's own prefill; its p99 is the sum of the means plus the
    root-sum-square of each part's excess at p99 (the parts are taken as independent). TPOT is
    the steady step time plus the p99 of prompt interference over the request's decode life (a
    compound Poisson sum).
    """
    rate = requests_per_sec
    prefix = input_tokens_mean * prefix_sharing_fraction
    new_mean = input_tokens_mean - prefix
    new_p99 = input_tokens_p99 - input_tokens_p99 * prefix_sharing_fraction
    decode_context = input_tokens_mean + output_tokens_mean / 2
    tau = steady_step_seconds(engine, rate, new_mean, prefix, output_tokens_mean, decode_context)
    if tau is None:
        return LoadPrediction(math.inf, math.inf, math.inf, math.inf, math.inf, 0,
                              f"overloaded: {rate:.3g} req/s exceeds what one replica can process")
    batch = rate * output_tokens_mean * tau
    if batch >= engine.max_num_tokens:
        return LoadPrediction(math.inf, math.inf, math.inf, math.inf, batch, 0,
                              f"overloaded: a decode batch of {batch:.0f} leaves no room in max_num_tokens "
                              f"{engine.max_num_tokens} for prompts")
    # Active decode sequences of an M/G/inf system are Poisson distributed.
    concurrency_p99 = poisson_p99(batch)
    slots = engine.fit.max_sequences(input_tokens_p99 + output_tokens_p99, engine.max_batch_size)
    base_step = step_seconds(engine, batch, decode_context)
    occupancy = prompt_occupancy_seconds(engine, new_mean, prefix, batch, decode_context, rate * tau * new_mean)
    rho = rate * occupancy
    if rho >= 1:
        return LoadPrediction(math.inf, math.inf, math.inf, math.inf, batch, concurrency_p99,
                              f"overloaded: prompts need {rho:.0%} of the engine")
    cv = lognormal_cv(input_tokens_mean, input_tokens_p99)
    occupancy_second_moment = occupancy ** 2 * (1 + cv ** 2)
    wait_mean = rate * occupancy_second_moment / (2 * (1 - rho))
    wait_p99 = wait_mean / rho * math.log(rho / P99_TAIL) if rho > P99_TAIL else 0.0
    prefill_mean = prefill_seconds(engine, new_mean, prefix, batch, decode_context)
    prefill_p99 = prefill_seconds(engine, new_p99, input_tokens_p99 * prefix_sharing_fraction, batch, decode_context)
    decode_steps = max(1.0, output_tokens_mean - 1)
    # A slot is held from admission to the last token; its length varies with the answer's.
    slot_hold_s = wait_mean + prefill_mean + decode_steps * tau
    slots_in_use = rate * slot_hold_s
    if slots_in_use >= slots:
        holds = (f"the engine's {slots} batch slots" if slots == engine.max_batch_size else
                 f"the {slots} sequences of p99 context {input_tokens_p99 + output_tokens_p99:.0f} tokens "
                 "the KV cache holds")
        kind = "overloaded" if slots == engine.max_batch_size else "KV cache"
        return LoadPrediction(math.inf, math.inf, math.inf, math.inf, batch, concurrency_p99,
                              f"{kind}: {slots_in_use:.1f} requests in flight on average need more than {holds}")
    slot_wait_mean, slot_wait_p99 = slot_wait_seconds(slots, slots_in_use, slot_hold_s)
    ttft_mean = slot_wait_mean + wait_mean + base_step / 2 + prefill_mean
    excess = math.sqrt((slot_wait_p99 - slot_wait_mean) ** 2 + (wait_p99 - wait_mean) ** 2
                       + (base_step / 2) ** 2 + (prefill_p99 - prefill_mean) ** 2)
    interference_sd = math.sqrt(rate * decode_steps * tau * occupancy_second_moment) / decode_steps
    return LoadPrediction(
        ttft_p99_ms=(ttft_mean + excess) * 1000,
        ttft_mean_ms=ttft_mean * 1000,
        tpot_p99_ms=(tau + Z_P99 * interference_sd) * 1000,
        queue_wait_p99_ms=wait_p99 * 1000,
        decode_batch=batch,
        concurrency_p99=concurrency_p99,
        problem=None,
    )


def predict_at_concurrency(engine: Engine, input_tokens: float, output_tokens: float,
                           concurrency: int) -> tuple[float, float]:
    """(TTFT s, TPOT s) with `concurrency` clients in a closed loop (each sends its next request
    when the previous one ends). Clients beyond the engine's capacity wait for a free slot."""
    decode_context = input_tokens + output_tokens / 2
    active = min(concurrency, max(1, saturation_batch(engine, input_tokens, output_tokens)))
    others = active - 1
    # The other clients' prompts arrive once per output_tokens steps each.
    other_prompts = others / output_tokens
    tpot = step_seconds(engine, active, decode_context, other_prompts * input_tokens,
                        other_prompts * prefill_attention_flops(engine.model, input_tokens, 0.0),
                        prefill_sequences=other_prompts)
    ttft = prefill_seconds(engine, input_tokens, 0.0, others, decode_context)
    waiting = concurrency - active
    if waiting > 0:
        request_seconds = ttft + (output_tokens - 1) * tpot
        ttft += waiting / active * request_seconds
    return ttft, tpot
