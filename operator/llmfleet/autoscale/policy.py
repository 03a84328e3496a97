"""The scaling policy: one pure decision per reconcile pass.

Pipeline: bounds -> metrics check -> raw recommendation (the p99 TTFT feedback, and the request
rate at the modelled per-replica capacity) -> stabilisation windows (HPA-style) -> per-step
limits -> cooldown (scale-down) and warm-up (scale-up) gates. docs/autoscaling.md explains each
step and its numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from llmfleet.api import AutoscalingSpec, Reason
from llmfleet.api.status import AutoscalerInputs, ScalingDecision, ScalingSignal
from llmfleet.autoscale.capacity import (
    ReplicaCapacity,
    forecast_requests_per_second,
    futile_scale_up,
    rate_rule,
    scale_down_threshold,
)
from llmfleet.autoscale.snapshot import MetricsSnapshot, ReplicaObservation
from llmfleet.autoscale.state import AutoscalerState, Recommendation, in_force, record

# Absorbs float error in replicas x factor, so that 10 x 1.1 is 11 replicas, not 12.
_CEIL_SLACK = 1e-9
_MAX_PROPOSED_REPLICAS = 1_000_000


@dataclass(frozen=True)
class PolicyTuning:
    """Policy constants that AutoscalingSpec does not expose (documented in docs/autoscaling.md)."""

    # The newest sample may be this many scrape intervals old (the snapshot's cadence): two
    # scrapes in a row may fail.
    stale_after_scrapes: int = 3
    # Removing a replica raises the load on the others; TTFT climbs steeply near saturation,
    # so only a p99 under half the target leaves room for that.
    scale_down_below_target_fraction: float = 0.5
    # A replica is removed only if the rest would keep KV cache and batch slots in use under
    # this share.
    scale_down_max_utilization: float = 0.7
    # Waiting requests per replica that count as a backlog: enough to scale up on the queue
    # alone while no request got a first token in the window (a stalled fleet has no TTFT).
    backlog_waiting_per_replica: float = 4.0
    # Below this many waiting requests per replica, queue growth is noise, not a signal.
    queue_growth_min_waiting_per_replica: float = 1.0
    # How long not-ready replicas block further scale-ups; a slow engine load must not
    # cascade into more replicas, a replica that never becomes ready must not block forever.
    warmup_timeout_seconds: float = 600.0
    # While the fleet breaches, a replica idle or with its p99 under this share of the target
    # has capacity to spare: the breach is then where requests land, not how many replicas serve.
    spare_replica_below_target_fraction: float = 0.5
    # Replicas named in a message, at most.
    named_replicas: int = 3


DEFAULT_TUNING = PolicyTuning()


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    decision: ScalingDecision
    reason: str  # a sentence for status.autoscaler.reason and the event
    signal: ScalingSignal  # which signal decided
    metrics_available: bool
    metrics_reason: str  # CamelCase, for the MetricsAvailable condition
    metrics_message: str
    inputs: AutoscalerInputs
    state: AutoscalerState
    # Why requests are not spread over the replicas (some swamped while others idle), when the
    # breach is one of routing, not of capacity; None otherwise.
    imbalance: str | None = None
    # A change opposite to the last one within the longer stabilisation window of it (counted
    # in state.reversals).
    reversal: bool = False


_FEEDBACK = ScalingSignal.TTFT_FEEDBACK


@dataclass(frozen=True)
class _Proposal:
    replicas: int
    reason: str
    signal: ScalingSignal = _FEEDBACK
    imbalance: str | None = None


# Reactive scaling needs seconds to add capacity (scrape, pass, engine load) while TTFT climbs
# steeply near saturation: without a target of its own, the autoscaler steers this far under the
# SLO (above the prefill floor, when known), so that scaling starts before users see a breach.
DEFAULT_TARGET_SHARE_OF_SLO = 0.6


def target_ttft_p99_ms(spec: AutoscalingSpec, slo_ttft_p99_ms: int, prefill_floor_ms: float | None = None) -> int:
    """The p99 TTFT the autoscaler steers to: spec.autoscaling's target, else 60 % of the way
    from the prefill floor (the p99 TTFT at a vanishing load, when modelled; else 0) to the SLO;
    never above the SLO. Only waiting climbs with load, so the margin is kept on it: 60 % of an
    SLO that the prompts' own prefill nearly fills is a target no replica count reaches."""
    floor = prefill_floor_ms if prefill_floor_ms is not None and prefill_floor_ms < slo_ttft_p99_ms else 0.0
    default_ms = max(1, round(floor + (slo_ttft_p99_ms - floor) * DEFAULT_TARGET_SHARE_OF_SLO))
    return min(spec.target_ttft_p99_ms or default_ms, slo_ttft_p99_ms)


def decide(spec: AutoscalingSpec, slo_ttft_p99_ms: int, snapshot: MetricsSnapshot,
           state: AutoscalerState, current_replicas: int, ready_replicas: int, now: datetime,
           tuning: PolicyTuning = DEFAULT_TUNING, capacity: ReplicaCapacity | None = None) -> Decision:
    """Desired replicas for this pass. `current_replicas` is the desired count in force
    (warming replicas included), `ready_replicas` how many of them serve. `capacity`: what one
    replica carries at the target (`ReplicaCapacity`, which names the target it was modelled at);
    None leaves the p99 feedback alone."""
    target_ms = capacity.target_ttft_p99_ms if capacity is not None else target_ttft_p99_ms(spec, slo_ttft_p99_ms)
    bounded = min(max(current_replicas, spec.min_replicas), spec.max_replicas)
    metrics_problem = _metrics_problem(snapshot, now, tuning)
    recommended = None
    if metrics_problem is None and bounded == current_replicas:
        recommended = _recommend(spec, target_ms, snapshot, current_replicas, tuning, capacity)
        if recommended is None:
            metrics_problem = (Reason.NO_TTFT_DATA, "no request got a first token in the window, "
                                                    "and the queue is below the backlog threshold")
        elif recommended.replicas < current_replicas \
                and (partial := _partial_data(snapshot, ready_replicas)) is not None:
            # The sums miss replicas, so they understate the load: evidence enough for more
            # replicas, none for fewer. (Only then is it reported: a replica just ready is
            # missing until its first scrape, which must not flap the condition.)
            metrics_problem = partial
            recommended = _Proposal(current_replicas, f"{recommended.reason}, but {partial[1]}: "
                                    f"holding {current_replicas} replicas", ScalingSignal.METRICS_UNAVAILABLE)
    # The bounds are the user's and apply at once; without metrics nothing else moves.
    if bounded != current_replicas:
        proposal = _Proposal(bounded, f"{current_replicas} replicas is outside minReplicas "
                             f"{spec.min_replicas}..maxReplicas {spec.max_replicas}: "
                             f"scaling to {bounded}", ScalingSignal.REPLICA_BOUNDS)
    elif recommended is None:
        proposal = _Proposal(current_replicas, f"holding {current_replicas} replicas: "
                             f"{metrics_problem[1]}", ScalingSignal.METRICS_UNAVAILABLE)
    else:
        proposal = recommended

    keep_seconds = max(spec.scale_up_stabilization_seconds, spec.scale_down_stabilization_seconds)
    history = record(state.recommendations, Recommendation(now, proposal.replicas), keep_seconds)
    if recommended is None:
        desired, reason = proposal.replicas, proposal.reason
    else:
        desired, reason = _stabilise_and_limit(spec, state, history, recommended,
                                               current_replicas, ready_replicas, now, tuning)

    decision = (ScalingDecision.SCALE_UP if desired > current_replicas else
                ScalingDecision.SCALE_DOWN if desired < current_replicas else
                ScalingDecision.HOLD)
    # The user's bounds moving the count are no flapping of the autoscaler's.
    reversal = (decision != ScalingDecision.HOLD and proposal.signal != ScalingSignal.REPLICA_BOUNDS
                and _reverses(state, decision, keep_seconds, now))
    if reversal:
        reason += (f" (a reversal: the last change, {(now - state.last_scale_time).total_seconds():.0f} s ago, "
                   f"was a {state.last_scale_direction.value})")
    return Decision(
        desired_replicas=desired,
        decision=decision,
        reason=reason,
        signal=proposal.signal,
        metrics_available=metrics_problem is None,
        metrics_reason=metrics_problem[0] if metrics_problem else Reason.METRICS_FRESH,
        metrics_message=metrics_problem[1] if metrics_problem else _fresh_message(snapshot, now),
        inputs=_inputs(spec, snapshot, target_ms, current_replicas, ready_replicas, capacity),
        imbalance=recommended.imbalance if recommended is not None else None,
        reversal=reversal,
        state=AutoscalerState(
            last_scale_time=now if desired != current_replicas else state.last_scale_time,
            warming_since=_warming_since(state, desired, current_replicas, ready_replicas, now),
            recommendations=history,
            last_scale_direction=decision if desired != current_replicas else state.last_scale_direction,
            reversals=state.reversals + reversal,
        ),
    )


def _reverses(state: AutoscalerState, decision: ScalingDecision, window_seconds: float, now: datetime) -> bool:
    """Whether `decision` goes against the last change, made within `window_seconds`: a sign the
    last one was wrong (a scale-down the load did not allow, a scale-up it did not need)."""
    return (state.last_scale_direction not in (None, decision) and state.last_scale_time is not None
            and (now - state.last_scale_time).total_seconds() < window_seconds)


def _metrics_problem(snapshot: MetricsSnapshot, now: datetime,
                     tuning: PolicyTuning) -> tuple[str, str] | None:
    """(CamelCase reason, message) when the snapshot cannot be trusted, else None."""
    if snapshot.error is not None:
        return snapshot.error_reason.value, f"Prometheus query failed: {snapshot.error}"
    if snapshot.sample_time is None:
        return Reason.NO_DATA, "Prometheus has no samples from the serving pods"
    interval = snapshot.scrape_interval_seconds
    if interval is None:
        return Reason.NO_DATA, "the scrape interval is unknown, so the samples' freshness cannot be judged"
    age, limit = _age_seconds(snapshot, now), stale_after_seconds(interval, tuning)
    if age > limit:
        return Reason.STALE_DATA, (f"the newest sample is {age:.0f} s old (limit {limit:g} s, "
                                   f"{tuning.stale_after_scrapes} scrape intervals of {interval:g} s)")
    return None


def stale_after_seconds(scrape_interval_seconds: float, tuning: PolicyTuning = DEFAULT_TUNING) -> float:
    """The age past which the newest sample no longer describes the fleet."""
    return tuning.stale_after_scrapes * scrape_interval_seconds


def _fresh_message(snapshot: MetricsSnapshot, now: datetime) -> str:
    window = f", {snapshot.window_seconds} s window" if snapshot.window_seconds is not None else ""
    return (f"Prometheus answers; newest sample {_age_seconds(snapshot, now):.0f} s old "
            f"(scrape interval {snapshot.scrape_interval_seconds:g} s{window})")


def _partial_data(snapshot: MetricsSnapshot, ready_replicas: int) -> tuple[str, str] | None:
    """(reason, message) when fewer serving pods report metrics than replicas are ready."""
    reporting = snapshot.reporting_pods
    if reporting is None or reporting >= ready_replicas:
        return None
    return Reason.PARTIAL_DATA, (f"only {reporting} of {ready_replicas} ready replicas report metrics to "
                                 "Prometheus; scaling down waits until all do")


def _age_seconds(snapshot: MetricsSnapshot, now: datetime) -> float:
    # A sample stamped slightly ahead of `now` (clock skew) counts as fresh.
    return max(0.0, (now - snapshot.sample_time).total_seconds())


def _recommend(spec: AutoscalingSpec, target_ms: int, snapshot: MetricsSnapshot, current: int,
               tuning: PolicyTuning, capacity: ReplicaCapacity | None) -> _Proposal | None:
    """The replica count the fresh metrics call for, before stabilisation and limits: the larger
    of the p99 feedback's and the request rate's at the modelled capacity, a scale-down only
    where that capacity holds the window's peak rate; None when they hold no usable signal."""
    feedback = _feedback(spec, target_ms, snapshot, current, tuning, capacity)
    # Requests piled on some replicas while others idle is where they land: the idle ones are
    # capacity the rate rule would count as missing (seen in e2e: 4 req/s sent to one of two).
    if (feedback is None or feedback.imbalance is not None
            or capacity is None or capacity.requests_per_second is None):
        return feedback
    by_rate = rate_rule(spec, target_ms, snapshot, current, capacity, feedback.replicas, feedback.reason)
    if by_rate is None:
        return feedback
    replicas, signal, reason = by_rate
    return replace(feedback, replicas=replicas, signal=signal, reason=reason)


def _feedback(spec: AutoscalingSpec, target_ms: int, snapshot: MetricsSnapshot, current: int,
              tuning: PolicyTuning, capacity: ReplicaCapacity | None) -> _Proposal | None:
    """What the p99 TTFT and the queue call for."""
    tolerance = spec.tolerance_percent / 100
    queue_factor = _queue_growth_factor(snapshot, current, tuning)
    queue_empty, queue_text = _queue_empty(snapshot, tuning)
    ttft = snapshot.ttft_p99_ms

    if ttft is not None:
        ratio = ttft / target_ms
        observed = f"p99 TTFT {describe_ttft_p99(ttft, snapshot)}"
        if ratio > 1 + tolerance or queue_factor > 1 + tolerance:
            breach = (f"{observed} against a {target_ms} ms target (x{ratio:.2f})"
                      + _queue_growth_text(snapshot, queue_factor))
            imbalance = _imbalance(snapshot, target_ms, tuning)
            if imbalance is not None:
                return _Proposal(current, f"{breach}, but {imbalance}: more replicas would not "
                                 f"help, holding {current}", imbalance=imbalance)
            proposal = _scale_up(current, max(ratio, queue_factor), breach)
            # A growing queue is load beyond the fleet's capacity; a p99 longer than the longest
            # prompt the engine admits takes alone is waiting the model does not see (it may be
            # wrong: no speed learned yet). Both are acted on whatever the model says.
            if capacity is not None and queue_factor <= 1 + tolerance and snapshot.requests_per_second \
                    and ttft <= capacity.longest_prompt_ttft_ms:
                futile = futile_scale_up(spec, target_ms, snapshot.requests_per_second, capacity, current,
                                         proposal.replicas)
                if futile is not None:
                    return _Proposal(current, f"{breach}, but {futile}; not scaling up", ScalingSignal.PREFILL_BOUND)
            return proposal
        if ratio >= 1 - tolerance:
            return _Proposal(current, f"{observed} is within {spec.tolerance_percent:g}% of the "
                             f"{target_ms} ms target")
        low_ms, low_text = scale_down_threshold(target_ms, capacity, tuning.scale_down_below_target_fraction)
        if ttft < low_ms and queue_empty:
            return _scale_down(spec, snapshot, current, tuning, f"{observed} is under {low_text} and {queue_text}")
        return _Proposal(current, f"{observed} is under the {target_ms} ms target, but not "
                         f"under {low_text} with an empty queue")

    # No first token in the window: an idle fleet, a stalled one, or no signal.
    if snapshot.requests_per_second == 0 and queue_empty:
        return _scale_down(spec, snapshot, current, tuning, f"no request in the window and {queue_text}")
    waiting = snapshot.waiting_requests
    if waiting is not None and waiting >= tuning.backlog_waiting_per_replica * current:
        proposal = _scale_up(current, queue_factor,
                             f"no request got a first token in the window but {waiting:.0f} wait "
                             f"({waiting / current:.1f} per replica)")
        return replace(proposal, signal=ScalingSignal.QUEUE_BACKLOG)
    return None


def _imbalance(snapshot: MetricsSnapshot, target_ms: int, tuning: PolicyTuning) -> str | None:
    """Why the breach is one of routing, when it is: some replicas breach the target while
    others are idle or far under it (a Service balancing connections, not requests, can leave
    a backlog at one replica). More replicas would share only the new requests, if any."""
    replicas = snapshot.replicas
    spare_ms = target_ms * tuning.spare_replica_below_target_fraction
    breaching = [r for r in replicas if r.ttft_p99_ms is not None and r.ttft_p99_ms > target_ms]
    spare = [r for r in replicas if r.requests_per_second == 0
             or (r.ttft_p99_ms is not None and r.ttft_p99_ms < spare_ms)]
    if not breaching or not spare:
        return None
    def named(group: list[ReplicaObservation], describe) -> str:
        shown = ", ".join(f"{r.pod} ({describe(r)})" for r in group[:tuning.named_replicas])
        return shown + (f" and {len(group) - tuning.named_replicas} more"
                        if len(group) > tuning.named_replicas else "")
    return (f"requests pile up at {len(breaching)} of {len(replicas)} replicas while "
            f"{len(spare)} are idle or under {spare_ms:.0f} ms: "
            f"{named(breaching, lambda r: f'p99 TTFT {describe_ttft_p99(r.ttft_p99_ms, snapshot)}')} against "
            f"{named(spare, lambda r: 'idle' if r.requests_per_second == 0 else f'p99 TTFT {r.ttft_p99_ms:.0f} ms')}")


def _queue_empty(snapshot: MetricsSnapshot, tuning: PolicyTuning) -> tuple[bool, str]:
    """Whether no request waits, and how that is known. Releases that export no waiting count
    (the series is absent: unknown, not zero) leave it to KV cache and batch-slot use: the
    engine queues a request only when one of them is full, so both well under the scale-down
    ceiling mean nothing waits. A release with no queue metrics at all leaves it to TTFT."""
    if not snapshot.queue_observable:
        return True, "the release exports no queue metrics (p99 TTFT alone decides)"
    if snapshot.waiting_requests is not None:
        return snapshot.waiting_requests < 1, "no request waits"
    uses = (snapshot.kv_cache_utilization, snapshot.batch_utilization)
    if any(use is None for use in uses):
        return False, "the queue is unknown"
    ceiling = tuning.scale_down_max_utilization
    return (all(use < ceiling for use in uses),
            f"KV cache and batch slots are under {ceiling:.0%} in use, so none waits")


def _queue_growth_factor(snapshot: MetricsSnapshot, current: int, tuning: PolicyTuning) -> float:
    """Capacity needed over capacity in use, from the queue: arrivals are the served rate plus
    the queue's growth. 1.0 when the queue is not a signal."""
    growth, served, waiting = (snapshot.waiting_growth_per_second, snapshot.requests_per_second,
                               snapshot.waiting_requests)
    if growth is None or served is None or waiting is None or growth <= 0 or served <= 0:
        return 1.0
    if waiting < tuning.queue_growth_min_waiting_per_replica * current:
        return 1.0
    return (served + growth) / served


def _queue_growth_text(snapshot: MetricsSnapshot, queue_factor: float) -> str:
    if queue_factor <= 1.0:
        return ""
    return (f"; the queue grows by {snapshot.waiting_growth_per_second:.1f} requests/s at "
            f"{snapshot.requests_per_second:.1f} served/s (x{queue_factor:.2f})")


def _scale_up(current: int, factor: float, why: str) -> _Proposal:
    """Replicas in proportion to the breach, and at least one more."""
    # A near-zero served rate makes the queue factor explode (even to inf): bound the raw
    # proposal; maxScaleUpStep and maxReplicas cut it down afterwards.
    return _Proposal(max(current + 1, math.ceil(min(current * factor, _MAX_PROPOSED_REPLICAS) - _CEIL_SLACK)), why)


def _scale_down(spec: AutoscalingSpec, snapshot: MetricsSnapshot, current: int,
                tuning: PolicyTuning, why: str) -> _Proposal:
    """The fewest replicas that keep KV cache and batch-slot use under their ceiling (the
    busier of the two decides); one fewer when neither is known. Never below minReplicas."""
    if current <= spec.min_replicas:
        return _Proposal(current, f"{why}; already at minReplicas {spec.min_replicas}")
    uses = {name: value for name, value in (("KV cache", snapshot.kv_cache_utilization),
                                            ("batch slot", snapshot.batch_utilization))
            if value is not None}
    if not uses:
        return _Proposal(current - 1, why)
    name, use = max(uses.items(), key=lambda item: item[1])
    ceiling = tuning.scale_down_max_utilization
    needed = math.ceil(current * use / ceiling - _CEIL_SLACK)
    if needed >= current:
        return _Proposal(current, f"{why}, but {name} use {use:.0%} would exceed {ceiling:.0%} "
                         "on fewer replicas", ScalingSignal.UTILIZATION)
    return _Proposal(max(spec.min_replicas, needed), f"{why}; {name} use {use:.0%}", ScalingSignal.UTILIZATION)


def _stabilise_and_limit(spec: AutoscalingSpec, state: AutoscalerState,
                         history: tuple[Recommendation, ...], proposal: _Proposal, current: int,
                         ready: int, now: datetime, tuning: PolicyTuning) -> tuple[int, str]:
    """HPA's stabilisation (lowest recommendation over the scale-up window, highest over the
    scale-down window), then per-step limits and bounds, then the cooldown (scale-down) and
    warm-up (scale-up) gates."""
    # A window counts only once the history reaches back to its start, so a fresh history
    # (new deployment, lost status) waits a whole window before scaling down.
    up_candidates, up_covered = in_force(history, spec.scale_up_stabilization_seconds, now)
    down_candidates, down_covered = in_force(history, spec.scale_down_stabilization_seconds, now)
    reason = proposal.reason
    if min(up_candidates) > current and up_covered:
        stabilised = min(up_candidates)
        window_note = f" (lowest over the {spec.scale_up_stabilization_seconds} s window)"
    elif max(down_candidates) < current and down_covered:
        stabilised = max(down_candidates)
        window_note = f" (highest over the {spec.scale_down_stabilization_seconds} s window)"
    elif proposal.replicas < current:
        return current, (f"{reason}; holding {current} replicas until {proposal.replicas} or "
                         "fewer is recommended throughout the "
                         f"{spec.scale_down_stabilization_seconds} s stabilisation window")
    elif proposal.replicas > current:
        return current, (f"{reason}; holding {current} replicas until more is recommended "
                         f"throughout the {spec.scale_up_stabilization_seconds} s scale-up "
                         "stabilisation window")
    else:
        return current, reason

    stepped = min(max(stabilised, current - spec.max_scale_down_step),
                  current + spec.max_scale_up_step)
    desired = min(max(stepped, spec.min_replicas), spec.max_replicas)
    if desired == current:
        bound = (f"maxReplicas is {spec.max_replicas}" if stabilised > current
                 else f"minReplicas is {spec.min_replicas}")
        return current, f"{reason}; holding {current} replicas: {bound}"
    # The cooldown holds only scale-downs: a breach is never left waiting for it, and a
    # scale-up's new replicas are covered by the warm-up gate below.
    if desired < current and state.last_scale_time is not None:
        quiet_until = state.last_scale_time + timedelta(seconds=spec.cooldown_seconds)
        if now < quiet_until:
            return current, (f"{reason}; holding {current} replicas for the cooldown, "
                             f"{(quiet_until - now).total_seconds():.0f} s left")
    warming = current - ready
    if desired > current and warming > 0:
        since = state.warming_since or now
        if (now - since).total_seconds() < tuning.warmup_timeout_seconds:
            return current, (f"{reason}; holding {current} replicas while {warming} warm up "
                             f"(for at most {tuning.warmup_timeout_seconds:.0f} s)")
    verb = "scaling up" if desired > current else "scaling down"
    return desired, (f"{reason}; {verb} from {current} to {desired} replicas"
                     f"{_limit_note(spec, proposal.replicas, stabilised, desired, window_note)}")


def _limit_note(spec: AutoscalingSpec, proposed: int, stabilised: int, desired: int,
                window_note: str) -> str:
    """Which rule moved the count away from the raw recommendation, if any."""
    if desired < stabilised:
        return (f" (maxReplicas {spec.max_replicas})" if desired == spec.max_replicas
                else f" (maxScaleUpStep {spec.max_scale_up_step})")
    if desired > stabilised:
        return f" (maxScaleDownStep {spec.max_scale_down_step})"
    return window_note if stabilised != proposed else ""


def _warming_since(state: AutoscalerState, desired: int, current: int, ready: int,
                   now: datetime) -> datetime | None:
    if desired > current:
        return now  # the new replicas start warming now
    if ready < current:
        return state.warming_since or now
    return None


def describe_ttft_p99(ttft_p99_ms: float | None, snapshot: MetricsSnapshot) -> str | None:
    """A p99 TTFT in words, None without data: "over N ms" at the histogram's top edge, which
    is all Prometheus can say of a tail beyond it."""
    if ttft_p99_ms is None:
        return None
    top = snapshot.ttft_histogram_top_ms
    return f"over {ttft_p99_ms:.0f} ms" if top is not None and ttft_p99_ms >= top else f"{ttft_p99_ms:.0f} ms"


def display_round(value: float | None, digits: int) -> float | None:
    """Rounded for status: a histogram quantile or a rate is not precise to 15 digits, and
    `kubectl get` prints what status holds."""
    return None if value is None else round(value, digits)


def _inputs(spec: AutoscalingSpec, snapshot: MetricsSnapshot, target_ms: int, current: int, ready: int,
            capacity: ReplicaCapacity | None) -> AutoscalerInputs:
    kv = snapshot.kv_cache_utilization
    return AutoscalerInputs(
        peak_requests_per_second=display_round(snapshot.requests_per_second_peak, 3),
        forecast_requests_per_second=display_round(forecast_requests_per_second(spec, snapshot), 3),
        replica_capacity_requests_per_second=display_round(capacity and capacity.requests_per_second, 3),
        prefill_ttft_p99_ms=display_round(capacity and capacity.prefill_ttft_p99_ms, 1),
        speed_factor=display_round(capacity and capacity.speed_factor, 4),
        observed_ttft_p99_ms=display_round(snapshot.ttft_p99_ms, 1),
        target_ttft_p99_ms=target_ms,
        current_replicas=current,
        ready_replicas=ready,
        requests_per_second=display_round(snapshot.requests_per_second, 3),
        kv_cache_utilization_percent=None if kv is None else round(min(100.0, max(0.0, kv * 100)), 1),
    )
