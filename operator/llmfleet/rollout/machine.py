"""Canary rollouts as a state machine whose whole state lives in status.canary.

One call of `advance` per reconcile pass: from the stored state, the spec's steps, what the
cluster shows (build done, ready replicas) and the time, it returns the next state and how many
replicas each revision gets. Nothing else is remembered, so an operator restarted in any phase
continues where it was: no step repeated, no timer reset.

Traffic follows replicas. Both revisions sit behind the one Service, which balances connections
over ready pods, so the canary's share is canary / (stable + canary) replicas. Stable keeps all
its replicas until the promotion: the canary is added on top (it must fit the GPU budget, which
caps it), so a rollback never has to bring stable capacity back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from llmfleet.api import CanaryPhase, Reason, RolloutGates, RolloutStep
from llmfleet.rollout.analysis import Outcome, Verdict

TERMINAL = {CanaryPhase.PROMOTED, CanaryPhase.ROLLED_BACK, CanaryPhase.SUPERSEDED}
# The manual commands, by verb, with what each does (`llmfleet rollout --help` lists them).
COMMANDS = {
    "promote": "skip the remaining steps: scale the canary to all replicas, then make it stable",
    "abort": "roll the canary back: scale it to zero; the stable revision serves on",
    "pause": "hold the canary at its current step until resume",
    "resume": "continue a paused canary (a pause step without duration ends)",
    "retry": "roll out a revision that was rolled back before",
}


@dataclass(frozen=True)
class Command:
    """A manual command: the llmfleet.io/rollout-command annotation, `<verb>/<id>`; each new
    value is carried out once."""

    verb: str
    raw: str

    @staticmethod
    def parse(raw: str | None) -> "Command | None":
        if not raw:
            return None
        verb = raw.split("/", 1)[0]
        return Command(verb, raw) if verb in COMMANDS else None


@dataclass(frozen=True)
class CanaryState:
    phase: CanaryPhase
    stable_revision: str
    canary_revision: str
    step_index: int = 0
    canary_replicas: int = 0
    step_started: datetime | None = None
    message: str = ""
    failed_revisions: tuple[str, ...] = ()
    last_command: str | None = None
    # The analysis step's last verdict, and when it was reached (one per intervalSeconds).
    verdict: Outcome | None = None
    verdict_message: str = ""
    evaluated: datetime | None = None
    # The golden-prompt check's last verdict (spec.rollout.quality), reached while Warming.
    quality: Outcome | None = None
    quality_message: str = ""

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL


@dataclass(frozen=True)
class Observed:
    """What one pass sees of the rollout."""

    target_revision: str  # the revision the spec asks for
    stable_revision: str  # the revision that serves
    built: bool  # the target's build/prepare Job succeeded
    build_failed: bool
    canary_ready: int  # ready replicas of the target revision
    stable_replicas: int  # the serving replicas (the plan's or the autoscaler's)
    max_canary_replicas: int  # what the GPU budget leaves beside stable
    now: datetime
    command: Command | None = None
    analysis: Verdict | None = None  # the metric gate's verdict, when this pass queried one
    quality: Verdict | None = None  # the golden prompts' verdict, when this pass asked them
    # Why the canary's replicas are not ready (its pods' scheduling or container state), when
    # this pass looked: past canaryReadyDeadlineSeconds.
    not_ready_reason: str | None = None


@dataclass(frozen=True)
class Split:
    """Replicas per revision for this pass."""

    stable_replicas: int
    canary_replicas: int

    @property
    def weight_percent(self) -> int:
        total = self.stable_replicas + self.canary_replicas
        return round(100 * self.canary_replicas / total) if total else 0


@dataclass(frozen=True)
class Decision:
    state: CanaryState
    split: Split
    events: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (reason, message)


def canary_replicas_for(weight_percent: int, stable_replicas: int) -> int:
    """Canary replicas beside `stable_replicas` for a traffic share of `weight_percent`: the
    nearest share a whole number of replicas gives, at least one."""
    if weight_percent >= 100:
        return stable_replicas
    return max(1, round(stable_replicas * weight_percent / (100 - weight_percent)))


def _first_weight(steps: tuple[RolloutStep, ...]) -> int:
    return next((step.set_weight for step in steps if step.set_weight is not None), 0)


def _weight_at(steps: tuple[RolloutStep, ...], step_index: int) -> int:
    """The canary's share at a step: the last `setWeight` at or before it, the first one's
    before any was reached (Warming)."""
    reached = [step.set_weight for step in steps[:step_index + 1] if step.set_weight is not None]
    return reached[-1] if reached else _first_weight(steps)


def _replicas(weight_percent: int, observed: Observed) -> int:
    return min(canary_replicas_for(weight_percent, observed.stable_replicas), observed.max_canary_replicas)


def _start(observed: Observed, failed: tuple[str, ...], last_command: str | None, message: str) -> CanaryState:
    return CanaryState(CanaryPhase.PREPARING, observed.stable_revision, observed.target_revision,
                       step_started=observed.now, message=message, failed_revisions=failed,
                       last_command=last_command)


def _enter(state: CanaryState, phase: CanaryPhase, observed: Observed, message: str, **changes) -> CanaryState:
    return replace(state, phase=phase, step_started=observed.now, message=message, **changes)


def advance(state: CanaryState | None, steps: tuple[RolloutStep, ...], observed: Observed,
            gates: RolloutGates = RolloutGates(), check_quality: bool = False) -> Decision:
    """The next state and split for a target revision that differs from the stable one;
    `check_quality`: the canary must pass the golden prompts before its first step."""
    events: list[tuple[str, str]] = []
    failed = state.failed_revisions if state else ()
    last_command = state.last_command if state else None
    command = observed.command if observed.command and observed.command.raw != last_command else None
    if command is not None:
        last_command = command.raw
    if state is None or state.canary_revision != observed.target_revision or state.stable_revision != \
            observed.stable_revision:
        if state is not None and state.active:
            events.append((Reason.CANARY_SUPERSEDED, f"canary {state.canary_revision} superseded by "
                                               f"{observed.target_revision}"))
        retry = command is not None and command.verb == "retry"
        if observed.target_revision in failed and not retry:
            state = CanaryState(CanaryPhase.ROLLED_BACK, observed.stable_revision, observed.target_revision,
                                step_started=observed.now, failed_revisions=failed, last_command=last_command,
                                message=f"revision {observed.target_revision} was rolled back before; "
                                        "`llmfleet rollout retry` tries it again")
            return Decision(state, Split(observed.stable_replicas, 0), tuple(events))
        state = _start(observed, tuple(r for r in failed if r != observed.target_revision), last_command,
                       f"preparing revision {observed.target_revision}")
        events.append((Reason.CANARY_STARTED, state.message))
        command = None
    state = replace(state, last_command=last_command)
    if command is not None:
        state, more = _apply_command(state, command, steps, observed)
        events += more
    state = _keep_share(state, steps, observed)
    state, more = _progress(state, steps, observed, gates, check_quality)
    events += more
    return Decision(state, _split(state, observed), tuple(events))


def _apply_command(state: CanaryState, command: Command, steps, observed: Observed):
    if command.verb == "retry" and state.phase == CanaryPhase.ROLLED_BACK:
        failed = tuple(r for r in state.failed_revisions if r != state.canary_revision)
        state = _start(observed, failed, state.last_command, f"retrying revision {state.canary_revision}")
        return state, [(Reason.CANARY_STARTED, state.message)]
    if not state.active:
        return state, []
    if command.verb == "abort":
        return _roll_back(state, observed, "aborted by hand")
    if command.verb == "promote" and state.phase != CanaryPhase.PREPARING:
        return (_enter(state, CanaryPhase.PROMOTING, observed, "promoted by hand"),
                [(Reason.CANARY_PROMOTING, "promoted by hand")])
    if command.verb == "pause" and state.phase in (CanaryPhase.WARMING, CanaryPhase.PROGRESSING):
        return _enter(state, CanaryPhase.PAUSED, observed, "paused by hand"), [(Reason.CANARY_PAUSED, "paused by hand")]
    if command.verb == "resume" and state.phase == CanaryPhase.PAUSED:
        step = steps[state.step_index] if state.step_index < len(steps) else None
        # Resuming a pause step ends it.
        index = state.step_index + (1 if step is not None and step.pause is not None else 0)
        return (_enter(state, CanaryPhase.PROGRESSING, observed, "resumed by hand", step_index=index),
                [(Reason.CANARY_RESUMED, "resumed by hand")])
    return state, []


def _warming_message(replicas: int) -> str:
    return f"waiting for {replicas} canary replica(s) to be ready"


def _keep_share(state: CanaryState, steps: tuple[RolloutStep, ...], observed: Observed) -> CanaryState:
    """The canary's replicas follow the stable revision's, which the autoscaler sizes, at the
    current step's weight: a scale-up or -down between `setWeight` steps keeps the canary's
    share. A canary without replicas (Preparing, or paused for want of GPU budget) gets none."""
    if state.phase not in (CanaryPhase.WARMING, CanaryPhase.PROGRESSING, CanaryPhase.PAUSED) \
            or state.canary_replicas < 1:
        return state
    replicas = max(1, _replicas(_weight_at(steps, state.step_index), observed))
    if state.phase == CanaryPhase.WARMING and replicas != state.canary_replicas:
        state = replace(state, message=_warming_message(replicas))
    return replace(state, canary_replicas=replicas)


def _roll_back(state: CanaryState, observed: Observed, why: str):
    message = f"canary {state.canary_revision} rolled back: {why}; stable {state.stable_revision} serves"
    return (_enter(state, CanaryPhase.ROLLED_BACK, observed, message, canary_replicas=0,
                   failed_revisions=(*state.failed_revisions, state.canary_revision)[-16:]),
            [(Reason.CANARY_ROLLED_BACK, message)])


def _next_step(state: CanaryState, observed: Observed, label: str) -> CanaryState:
    return _enter(state, CanaryPhase.PROGRESSING, observed, f"{label} done", step_index=state.step_index + 1,
                  verdict=None, verdict_message="", evaluated=None)


def analysis_due(state: CanaryState, step: RolloutStep, now: datetime) -> bool:
    """Whether this pass should query the metric gate of the current analysis step."""
    return (state.phase == CanaryPhase.PROGRESSING and step.analysis is not None
            and (state.evaluated is None
                 or (now - state.evaluated).total_seconds() >= step.analysis.interval_seconds))


def _progress(state: CanaryState, steps: tuple[RolloutStep, ...], observed: Observed, gates: RolloutGates,
              check_quality: bool):
    """Move through every phase whose exit condition already holds."""
    events: list[tuple[str, str]] = []
    while True:
        phase = state.phase
        if phase == CanaryPhase.PREPARING:
            if observed.build_failed:
                state, more = _roll_back(state, observed, "its build/prepare Job failed")
                return state, events + more
            if not observed.built:
                return state, events
            replicas = _replicas(_first_weight(steps), observed)
            if replicas < 1:
                state = _enter(state, CanaryPhase.PAUSED, observed,
                               f"resources.gpuBudget leaves no GPUs for a canary replica beside "
                               f"{observed.stable_replicas} stable one(s); raise it, or promote or abort by hand")
                events.append((Reason.CANARY_PAUSED, state.message))
                return state, events
            state = _enter(state, CanaryPhase.WARMING, observed, _warming_message(replicas), canary_replicas=replicas)
            events.append((Reason.CANARY_WARMING, state.message))
        elif phase == CanaryPhase.WARMING:
            if observed.canary_ready < state.canary_replicas:
                return _wait_for_replicas(state, state.canary_replicas, observed, gates, events)
            if check_quality and state.quality != Outcome.SUCCESSFUL:
                state, more, passed = _check_quality(state, observed, gates)
                events += more
                if not passed:
                    return state, events
            state = _enter(state, CanaryPhase.PROGRESSING, observed, "step 1", step_index=0)
        elif phase == CanaryPhase.PROGRESSING:
            if state.step_index >= len(steps):
                state = _enter(state, CanaryPhase.PROMOTING, observed, "all steps done; promoting")
                events.append((Reason.CANARY_PROMOTING, state.message))
                continue
            step = steps[state.step_index]
            label = f"step {state.step_index + 1}/{len(steps)}"
            if step.set_weight is not None:
                replicas = _replicas(step.set_weight, observed)
                if replicas != state.canary_replicas:
                    state = replace(state, canary_replicas=replicas,
                                    message=f"{label}: setWeight {step.set_weight}%, {replicas} canary replica(s)")
                if observed.canary_ready < replicas:
                    return _wait_for_replicas(state, replicas, observed, gates, events)
                state = _next_step(state, observed, label)
            elif step.pause is not None:
                if step.pause.duration_seconds == 0:
                    state = _enter(state, CanaryPhase.PAUSED, observed,
                                   f"{label}: paused until `llmfleet rollout resume`")
                    events.append((Reason.CANARY_PAUSED, state.message))
                    return state, events
                waited = (observed.now - state.step_started).total_seconds()
                if waited < step.pause.duration_seconds:
                    return replace(state, message=f"{label}: pause {step.pause.duration_seconds} s "
                                                  f"({waited:.0f} s done)"), events
                state = _next_step(state, observed, label)
            else:
                state, more, done = _analyse(state, step, observed, gates, label)
                events += more
                if not done:
                    return state, events
        elif phase == CanaryPhase.PROMOTING:
            state = replace(state, canary_replicas=observed.stable_replicas)
            if observed.canary_ready < observed.stable_replicas:
                return state, events
            state = _enter(state, CanaryPhase.PROMOTED, observed,
                           f"revision {state.canary_revision} promoted; it is stable")
            events.append((Reason.CANARY_PROMOTED, state.message))
            return state, events
        else:  # Paused and the terminal phases hold
            return state, events


def replicas_overdue(state: CanaryState, gates: RolloutGates, now: datetime) -> bool:
    """Whether the replicas the current phase or step waits for are past their deadline."""
    return (state.phase in (CanaryPhase.WARMING, CanaryPhase.PROGRESSING) and state.step_started is not None
            and (now - state.step_started).total_seconds() >= gates.canary_ready_deadline_seconds)


def _wait_for_replicas(state: CanaryState, replicas: int, observed: Observed, gates: RolloutGates, events: list):
    """Hold for the canary's replicas; roll back once they are overdue."""
    if not replicas_overdue(state, gates, observed.now):
        return state, events
    why = observed.not_ready_reason or "the pods give no reason"
    state, more = _roll_back(state, observed, f"{observed.canary_ready}/{replicas} canary replica(s) ready "
                                              f"{gates.canary_ready_deadline_seconds} s after they were asked for "
                                              f"(canaryReadyDeadlineSeconds): {why}")
    return state, events + more


def _check_quality(state: CanaryState, observed: Observed, gates: RolloutGates):
    """(state, events, passed) for the golden prompts of a ready canary: Failed rolls back;
    Inconclusive or Error (a replica did not answer) holds, and pauses for a person
    analysisDeadlineSeconds after Warming began."""
    if observed.quality is not None:
        state = replace(state, quality=observed.quality.outcome, quality_message=observed.quality.message)
        if state.quality == Outcome.FAILED:
            state, events = _roll_back(state, observed, f"quality gate failed: {state.quality_message}")
            return state, events, False
        if state.quality == Outcome.SUCCESSFUL:
            return state, [(Reason.CANARY_QUALITY_PASSED, state.quality_message)], True
    verdict = f"{state.quality.value}: {state.quality_message}" if state.quality else "checking"
    if (observed.now - state.step_started).total_seconds() >= gates.analysis_deadline_seconds:
        state = _enter(state, CanaryPhase.PAUSED, observed,
                       f"golden prompts without a verdict {gates.analysis_deadline_seconds} s after warming began "
                       f"({verdict}); promote or abort by hand")
        return state, [(Reason.CANARY_PAUSED, state.message)], False
    return replace(state, message=f"canary ready; golden prompts: {verdict}"), [], False


def _analyse(state: CanaryState, step: RolloutStep, observed: Observed, gates: RolloutGates, label: str):
    """(state, events, done) for an analysis step: a Failed verdict rolls back at once; the step
    passes when its duration is over and the last verdict is Successful; Inconclusive, Error or
    StableDegraded holds, and pauses for a person past analysisDeadlineSeconds."""
    duration = step.analysis.duration_seconds
    if observed.analysis is not None and analysis_due(state, step, observed.now):
        state = replace(state, verdict=observed.analysis.outcome, verdict_message=observed.analysis.message,
                        evaluated=observed.now)
        if state.verdict == Outcome.FAILED:
            state, events = _roll_back(state, observed, f"analysis failed: {state.verdict_message}")
            return state, events, False
    waited = (observed.now - state.step_started).total_seconds()
    verdict = f"{state.verdict.value}: {state.verdict_message}" if state.verdict else "no verdict yet"
    if waited >= duration and state.verdict == Outcome.SUCCESSFUL:
        return _next_step(state, observed, label), [(Reason.CANARY_ANALYSIS_SUCCESSFUL, state.verdict_message)], True
    if waited >= duration + gates.analysis_deadline_seconds:
        state = _enter(state, CanaryPhase.PAUSED, observed,
                       f"{label}: analysis without a verdict {gates.analysis_deadline_seconds} s past its "
                       f"duration ({verdict}); promote or abort by hand")
        return state, [(Reason.CANARY_PAUSED, state.message)], False
    return replace(state, message=f"{label}: analysis {min(waited, duration):.0f}/{duration} s, {verdict}"), [], False


def _split(state: CanaryState, observed: Observed) -> Split:
    if state.phase in (CanaryPhase.ROLLED_BACK, CanaryPhase.SUPERSEDED, CanaryPhase.PREPARING):
        return Split(observed.stable_replicas, 0)
    return Split(observed.stable_replicas, state.canary_replicas)


def supersede(state: CanaryState, now: datetime, reason: str) -> CanaryState:
    """A canary whose target the spec left for the stable revision (a revert)."""
    return replace(state, phase=CanaryPhase.SUPERSEDED, canary_replicas=0, step_started=now, message=reason)
