"""A serving fleet in virtual time (pure): replicas running the emulated engine, the Service's
routing, Prometheus' scrapes and the operator's reconcile passes with the real autoscaler policy.

Events, in time order (at one instant: steps end, then requests arrive, replicas become ready,
Prometheus scrapes, the operator decides, and idle engines with work start their next step, so
that a request arriving as a step ends joins the next one, as in the served engine):

- a request arrives and the Service routes it to a ready replica (at random, as kube-proxy's
  default iptables mode does, or round-robin or least-connections, as its IPVS `rr` and `lc`);
  with none ready it fails;
- a replica's step ends: its tokens are out, its TTFT histogram records each first token;
- Prometheus scrapes every ready replica every interval (prometheus_view), each at its own
  phase: Prometheus offsets each target's scrapes within the interval by a hash of the target
  (prometheus/prometheus scrape/target.go, `Target.offset`, in every 2.x release; the sandbox
  runs 2.42), so the newest sample the operator reads is up to one interval old, not always
  fresh;
- every reconcile period the autoscaler decides on the snapshot the operator would read; new
  replicas serve after the start-up delay (pod start, engine load, readiness probe); a removed
  replica leaves the Service at once, finishes what it holds, and counts until it has.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum

from llmfleet.api import AutoscalingSpec
from llmfleet.api.status import ScalingDecision, ScalingSignal
from llmfleet.autoscale import AutoscalerState, ReplicaCapacity, decide
from llmfleet.render.ttft_buckets import slo_ttft_bounds_ms
from llmfleet.simulation.profile import EngineProfile
from llmfleet.simulation.prometheus_view import PodSeries, Sample, ScrapeSettings, TtftHistogram, snapshot
from llmfleet.simulation.replica import Arrival, VirtualEngine
from llmfleet.simulation.routing import DEFAULT_ROUTING, LEAST_CONNECTIONS, RANDOM
from llmfleet.simulation.scheduler import RequestNeverFits, Sequence as EngineSequence

MS_PER_SECOND = 1000.0
# The autoscaler's clock: any fixed instant; reports count seconds from it.
EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class FleetSettings:
    scrape_interval_seconds: float
    window_seconds: int  # the autoscaler's query window, from the scrape interval
    reconcile_interval_seconds: float
    start_up_delay_seconds: float
    routing: str = DEFAULT_ROUTING  # llmfleet.simulation.routing
    queue_observable: bool = True
    waiting_observable: bool = True  # prometheus_view.ScrapeSettings
    seed: int = 0
    # Seconds into each scrape interval at which every replica is scraped; None: each replica
    # at its own phase drawn from the seed, as Prometheus spreads its targets. A fixed phase of
    # 0 scrapes just before each pass: the freshest data the operator could ever have.
    scrape_phase_seconds: float | None = None


@dataclass(frozen=True)
class Engine:
    """One replica's engine and the limits its serving parameters put on a request."""

    profile: EngineProfile
    max_input_tokens: int
    max_sequence_tokens: int


@dataclass(frozen=True)
class Fleet:
    engine: Engine
    initial_replicas: int
    slo_ttft_p99_ms: int
    autoscaling: AutoscalingSpec | None  # None: the initial replicas throughout
    # What the autoscaler is told one replica carries (llmfleet.planner.capacity); None: the p99
    # feedback alone.
    capacity: ReplicaCapacity | None = None


@dataclass(frozen=True)
class RequestResult:
    arrival: Arrival
    replica: str | None
    first_token_ms: float | None = None
    finished_ms: float | None = None
    failure: str | None = None

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_ms is None else self.first_token_ms - self.arrival.arrival_ms

    @property
    def tpot_ms(self) -> float | None:
        if self.finished_ms is None or self.arrival.output_tokens < 2:
            return None
        return (self.finished_ms - self.first_token_ms) / (self.arrival.output_tokens - 1)


@dataclass(frozen=True)
class ScalingEvent:
    time_s: float
    from_replicas: int
    to_replicas: int
    decision: ScalingDecision
    reason: str
    signal: ScalingSignal
    reversal: bool = False  # against the previous change, within the stabilisation window


@dataclass(frozen=True)
class ReplicaSpan:
    name: str
    created_s: float
    ready_s: float | None  # None: never served
    removed_s: float | None  # left the Service; None: kept to the end
    ended_s: float  # drained after removal, or the end of the run


@dataclass(frozen=True)
class FleetRun:
    requests: tuple[RequestResult, ...]
    scaling: tuple[ScalingEvent, ...]
    replicas: tuple[ReplicaSpan, ...]
    end_s: float

    def reversals(self) -> int:
        return sum(event.reversal for event in self.scaling)

    def replica_seconds(self) -> float:
        return sum(span.ended_s - span.created_s for span in self.replicas)

    def peak_replicas(self) -> int:
        """The most replicas existing at once (serving, starting or draining)."""
        changes = sorted([(span.created_s, 1) for span in self.replicas]
                         + [(span.ended_s, -1) for span in self.replicas])  # an end before a start at one instant
        running = peak = 0
        for _, change in changes:
            running += change
            peak = max(peak, running)
        return peak

    def replicas_at(self, time_s: float) -> tuple[int, int]:
        """(replicas existing, replicas serving) at `time_s`."""
        existing = [span for span in self.replicas if span.created_s <= time_s < span.ended_s]
        serving = [span for span in existing if span.ready_s is not None and span.ready_s <= time_s
                   and (span.removed_s is None or time_s < span.removed_s)]
        return len(existing), len(serving)


@dataclass(eq=False)
class _Replica:
    index: int  # in order of creation
    name: str
    engine: VirtualEngine
    created_s: float
    series: PodSeries
    scrape_phase_s: float  # its scrapes fall at this phase of the interval
    histogram: TtftHistogram
    ready_s: float | None = None
    removed_s: float | None = None
    ended_s: float | None = None
    open_requests: int = 0

    @property
    def serving(self) -> bool:
        return self.ready_s is not None and self.removed_s is None


class _Kind(int, Enum):
    # The order of events at one instant.
    STEP_END = 0
    ARRIVAL = 1
    READY = 2
    SCRAPE = 3
    RECONCILE = 4
    STEP_START = 5


Progress = Callable[[float, float], None]


class _Simulation:
    def __init__(self, fleet: Fleet, settings: FleetSettings, arrivals: Sequence[Arrival],
                 progress: Progress | None, progress_every_s: float):
        self.fleet, self.settings = fleet, settings
        # The bounds its pods' TTFT histograms have, as rendered for the SLO and the target.
        self.ttft_bounds_ms = slo_ttft_bounds_ms(fleet.slo_ttft_p99_ms, fleet.autoscaling or AutoscalingSpec())
        self.arrivals = sorted(arrivals, key=lambda arrival: arrival.arrival_ms)
        self.events: list = []
        self.order = itertools.count()
        self.replicas: list[_Replica] = []
        self.names = itertools.count()
        self.round_robin = itertools.count()
        # A stream of its own, so that the scrape phases drawn from the seed do not move with it.
        self.random_routing = random.Random(f"{settings.seed}/routing")
        self.scrape_phases = random.Random(settings.seed)
        self.results: dict[int, RequestResult] = {}
        self.in_flight: dict[EngineSequence, tuple[int, _Replica]] = {}
        self.first_token_ms: dict[int, float] = {}
        self.scaling: list[ScalingEvent] = []
        self.state = AutoscalerState()
        self.desired = fleet.initial_replicas
        self.unfinished = len(self.arrivals)
        self.progress, self.progress_every_s = progress, progress_every_s
        self.last_arrival_s = self.arrivals[-1].arrival_ms / MS_PER_SECOND if self.arrivals else 0.0

    def push(self, time_ms: float, kind: _Kind, payload=None) -> None:
        heapq.heappush(self.events, (time_ms, kind, next(self.order), payload))

    def run(self) -> FleetRun:
        for _ in range(self.fleet.initial_replicas):
            self.add_replica(0.0, ready=True)
        for index, arrival in enumerate(self.arrivals):
            self.push(arrival.arrival_ms, _Kind.ARRIVAL, index)
        if self.fleet.autoscaling is not None:
            self.push(0.0, _Kind.RECONCILE)
        now_ms, next_progress_s = 0.0, 0.0
        handlers = {_Kind.STEP_END: self.step_end, _Kind.ARRIVAL: self.arrive, _Kind.READY: self.ready,
                    _Kind.SCRAPE: self.scrape, _Kind.RECONCILE: self.reconcile, _Kind.STEP_START: self.step_start}
        while self.unfinished:  # an unfinished request has its arrival or its replica's step ahead
            now_ms, kind, _, payload = heapq.heappop(self.events)
            handlers[kind](now_ms, payload)
            if self.progress is not None and now_ms / MS_PER_SECOND >= next_progress_s:
                self.progress(now_ms / MS_PER_SECOND, self.last_arrival_s)
                next_progress_s += self.progress_every_s
        end_s = now_ms / MS_PER_SECOND
        return FleetRun(
            requests=tuple(self.results[index] for index in range(len(self.arrivals))),
            scaling=tuple(self.scaling),
            replicas=tuple(ReplicaSpan(r.name, r.created_s, r.ready_s, r.removed_s,
                                       r.ended_s if r.ended_s is not None else max(end_s, r.created_s))
                           for r in self.replicas),
            end_s=end_s)

    # Replicas

    def add_replica(self, now_s: float, ready: bool) -> None:
        index = next(self.names)
        name = f"replica-{index}"
        engine = VirtualEngine(self.fleet.engine.profile, seed=self.settings.seed + index)
        interval_s = self.settings.scrape_interval_seconds
        phase_s = self.settings.scrape_phase_seconds
        replica = _Replica(index, name, engine, now_s, PodSeries(name),
                           self.scrape_phases.uniform(0, interval_s) if phase_s is None else phase_s % interval_s,
                           TtftHistogram(self.ttft_bounds_ms))
        self.replicas.append(replica)
        if ready:
            self.ready(now_s * MS_PER_SECOND, replica)
        else:
            self.push((now_s + self.settings.start_up_delay_seconds) * MS_PER_SECOND, _Kind.READY, replica)

    def ready(self, now_ms: float, replica: _Replica) -> None:
        if replica.removed_s is None:
            replica.ready_s = now_ms / MS_PER_SECOND
            # Its first scrape: the next instant of its phase, this one included.
            interval_s = self.settings.scrape_interval_seconds
            first_s = replica.scrape_phase_s + interval_s * math.ceil((replica.ready_s - replica.scrape_phase_s) / interval_s)
            self.push(first_s * MS_PER_SECOND, _Kind.SCRAPE, replica)

    def remove_replica(self, now_s: float) -> None:
        # A ReplicaSet deletes pods that are not ready first, then the newest.
        live = [replica for replica in self.replicas if replica.removed_s is None]
        victim = min(live, key=lambda replica: (replica.ready_s is not None, -replica.index))
        victim.removed_s = now_s
        victim.series.scraped = False
        if victim.open_requests == 0:
            victim.ended_s = now_s

    def serving(self) -> list[_Replica]:
        return [replica for replica in self.replicas if replica.serving]

    # Requests

    def route(self) -> _Replica | None:
        serving = self.serving()
        if not serving:
            return None
        if self.settings.routing == LEAST_CONNECTIONS:
            return min(serving, key=lambda replica: replica.open_requests)
        if self.settings.routing == RANDOM:
            return self.random_routing.choice(serving)
        return serving[next(self.round_robin) % len(serving)]

    def arrive(self, now_ms: float, index: int) -> None:
        arrival = self.arrivals[index]
        replica = self.route()
        engine = self.fleet.engine
        if replica is None:
            return self.fail(index, None, "no replica is ready: the Service has no endpoint")
        if arrival.prompt_tokens > engine.max_input_tokens:
            return self.fail(index, replica.name, f"prompt over the engine's maxInputLen {engine.max_input_tokens}")
        output_tokens = min(arrival.output_tokens, engine.max_sequence_tokens - arrival.prompt_tokens)
        sequence = EngineSequence(index, arrival.prompt_tokens, max(output_tokens, 1))
        try:
            replica.engine.scheduler.submit(sequence)
        except RequestNeverFits:
            return self.fail(index, replica.name, "needs more KV blocks than the engine's cache holds")
        self.in_flight[sequence] = (index, replica)
        replica.open_requests += 1
        if replica.engine.step_end_ms is None:
            self.push(now_ms, _Kind.STEP_START, replica)

    def fail(self, index: int, replica: str | None, why: str) -> None:
        self.results[index] = RequestResult(self.arrivals[index], replica, failure=why)
        self.unfinished -= 1

    def step_start(self, now_ms: float, replica: _Replica) -> None:
        if replica.engine.step_end_ms is None and replica.engine.has_work:
            self.push(replica.engine.start_step(now_ms), _Kind.STEP_END, replica)

    def step_end(self, now_ms: float, replica: _Replica) -> None:
        outcome = replica.engine.finish_step()
        for sequence in outcome.emitted:
            if sequence.output_tokens == 1:
                index, _ = self.in_flight[sequence]
                self.first_token_ms[index] = now_ms
                replica.histogram.observe(now_ms - self.arrivals[index].arrival_ms)
        for sequence in outcome.finished:
            index, _ = self.in_flight.pop(sequence)
            self.results[index] = RequestResult(self.arrivals[index], replica.name,
                                                self.first_token_ms.pop(index), now_ms)
            replica.open_requests -= 1
            self.unfinished -= 1
        if replica.removed_s is not None and replica.open_requests == 0:
            replica.ended_s = now_ms / MS_PER_SECOND
        self.push(now_ms, _Kind.STEP_START, replica)  # after this instant's arrivals

    # Prometheus and the operator

    def scrape(self, now_ms: float, replica: _Replica) -> None:
        if not replica.serving:
            return  # removed: it left discovery, and its scrapes end
        stats = replica.engine.scheduler.stats()
        replica.series.samples.append(Sample(
            now_ms / MS_PER_SECOND, replica.histogram.cumulative(), stats.waiting_requests, stats.active_requests,
            stats.max_batch_size, stats.kv_blocks_used, stats.kv_blocks_max))
        self.push(now_ms + self.settings.scrape_interval_seconds * MS_PER_SECOND, _Kind.SCRAPE, replica)

    def reconcile(self, now_ms: float, _=None) -> None:
        now_s = now_ms / MS_PER_SECOND
        spec = self.fleet.autoscaling
        view = snapshot([replica.series for replica in self.replicas],
                        ScrapeSettings(self.settings.scrape_interval_seconds, self.settings.window_seconds,
                                       queue_observable=self.settings.queue_observable,
                                       waiting_observable=self.settings.waiting_observable,
                                       peak_window_seconds=spec.scale_down_stabilization_seconds),
                        now_s, EPOCH, self.ttft_bounds_ms)
        current = min(max(self.desired, spec.min_replicas), spec.max_replicas)
        ready = len(self.serving())
        decision = decide(spec, self.fleet.slo_ttft_p99_ms, view, self.state, current, ready,
                          EPOCH + timedelta(seconds=now_s), capacity=self.fleet.capacity)
        self.state = decision.state
        if decision.desired_replicas != self.desired:
            self.scaling.append(ScalingEvent(now_s, self.desired, decision.desired_replicas, decision.decision,
                                             decision.reason, decision.signal, decision.reversal))
        for _ in range(decision.desired_replicas - self.desired):
            self.add_replica(now_s, ready=False)
        for _ in range(self.desired - decision.desired_replicas):
            self.remove_replica(now_s)
        self.desired = decision.desired_replicas
        self.push(now_ms + self.settings.reconcile_interval_seconds * MS_PER_SECOND, _Kind.RECONCILE)


def simulate(fleet: Fleet, settings: FleetSettings, arrivals: Sequence[Arrival], progress: Progress | None = None,
             progress_every_s: float = 60.0) -> FleetRun:
    """Serve `arrivals` with the fleet, scaling it as the operator would, until the last request
    is answered. `progress(virtual_s, last_arrival_s)` is called every `progress_every_s` of
    virtual time."""
    return _Simulation(fleet, settings, arrivals, progress, progress_every_s).run()
