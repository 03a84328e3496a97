"""The emulated engine's step loop: a background thread that runs the scheduler in real time.

It knows nothing of Triton: requests arrive with a `TokenSink` (where tokens go) and the loop
reports to an `EngineObserver` (where metrics go). Each step sleeps until its modelled end, then
delivers its tokens. The step's deadline is measured from the previous step's deadline, not from
when delivery finished, so the host work of one step (planning, sending responses) is hidden in
the next step's sleep, as a GPU overlaps the host scheduler; only work longer than a whole step
shows up as lateness, which the loop measures and reports as its overhead.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from llmfleet.simulation.kvcache import prompt_block_hashes
from llmfleet_sandbox.emulator.outputs import OutputModel
from llmfleet.simulation.profile import EngineProfile
from llmfleet.simulation.scheduler import Scheduler, SchedulerStats, Sequence
from llmfleet.simulation.timing import jitter_multiplier, step_duration_ms

if TYPE_CHECKING:
    from llmfleet_sandbox.faults import Fault

STATS_PERIOD_S = 0.1  # TensorRT-LLM's default stats_check_period_ms is 100
# Asking the client connection whether a request was cancelled costs a round trip to the Triton
# process, so each running request is asked at most this often.
CANCEL_POLL_INTERVAL_S = 0.2


class TokenSink(Protocol):
    def send(self, token_id: int, final: bool) -> None:
        """Deliver one token; raise if the client is gone."""

    def abort(self, message: str) -> None:
        """End the stream with an error (the engine stops before the request finished)."""

    def close(self) -> None:
        """End a cancelled stream: a decoupled model owes Triton a final flag even then."""

    def is_cancelled(self) -> bool: ...


class EngineObserver(Protocol):
    def first_token(self, ttft_ms: float) -> None: ...

    def request_finished(self, input_tokens: int, output_tokens: int) -> None: ...

    def iteration_stats(self, stats: SchedulerStats, overhead: "OverheadStats") -> None: ...


@dataclass
class OverheadStats:
    """Lateness of token delivery against the modelled step end, over steps so far."""

    steps: int = 0
    modelled_ms_total: float = 0.0
    overhead_ms_total: float = 0.0
    overhead_ms_max: float = 0.0
    host_work_ms_total: float = 0.0  # planning + delivery per step, mostly hidden in the sleep

    def record(self, modelled_ms: float, overhead_ms: float, host_work_ms: float) -> None:
        self.steps += 1
        self.modelled_ms_total += modelled_ms
        self.overhead_ms_total += overhead_ms
        self.overhead_ms_max = max(self.overhead_ms_max, overhead_ms)
        self.host_work_ms_total += host_work_ms

    @property
    def overhead_ms_mean(self) -> float:
        return self.overhead_ms_total / self.steps if self.steps else 0.0

    @property
    def host_work_ms_mean(self) -> float:
        return self.host_work_ms_total / self.steps if self.steps else 0.0

    def summary(self) -> str:
        return (f"{self.steps} steps, modelled {self.modelled_ms_total / max(self.steps, 1):.2f} ms/step, "
                f"overhead mean {self.overhead_ms_mean:.3f} ms max {self.overhead_ms_max:.3f} ms, "
                f"host work {self.host_work_ms_mean:.3f} ms/step")


@dataclass(eq=False)
class _Request:
    sequence: Sequence
    sink: TokenSink
    arrival_s: float
    tokens: Iterator[int]
    last_cancel_check_s: float
    first_token_s: float | None = None
    done: bool = False


class InjectedFailure(ValueError):
    """A request the sandbox's error fault fails (llmfleet_sandbox.faults)."""


@dataclass
class EmulatedEngine:
    profile: EngineProfile
    observer: EngineObserver
    outputs: OutputModel
    # The sandbox's fault as it is now (llmfleet_sandbox.faults.LiveFault), asked at each request
    # and step: its slowdown multiplies every step's duration (each of its costs alike), its
    # error percent is the share of requests to fail. None: no fault.
    fault: Callable[[], Fault] | None = None
    overhead: OverheadStats = field(default_factory=OverheadStats)

    def __post_init__(self) -> None:
        self._scheduler = Scheduler(self.profile)
        self._requests: dict[Sequence, _Request] = {}
        self._lock = threading.Lock()
        self._work_arrived = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._step_rng = random.Random(self.profile.seed)
        self._request_ids = itertools.count()
        self._failures_owed = 0.0
        self._thread = threading.Thread(target=self._run, name="emulated-engine-steps", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt_token_ids: list[int], max_output_tokens: int, sink: TokenSink) -> None:
        """Queue a request; raises `RequestNeverFits` or ValueError when it can never run."""
        if max_output_tokens < 1:
            raise ValueError(f"request_output_len must be at least 1, got {max_output_tokens}")
        token_ids = [int(token_id) for token_id in prompt_token_ids]
        if not token_ids:
            raise ValueError("the prompt has no tokens")
        error_percent = self.fault().error_percent if self.fault else 0.0
        if error_percent:
            # Evenly spread, so that any window of requests fails close to the share asked for.
            with self._lock:
                self._failures_owed += error_percent / 100
                failing = self._failures_owed >= 1
                self._failures_owed -= 1 if failing else 0
            if failing:
                raise InjectedFailure("injected fault: the engine failed this request (sandbox --error-percent)")
        sequence = Sequence(request_id=next(self._request_ids), prompt_tokens=len(token_ids),
                            max_output_tokens=max_output_tokens,
                            prompt_block_hashes=prompt_block_hashes(token_ids, self.profile.kv_block_tokens))
        now = time.monotonic()
        with self._lock:
            self._scheduler.submit(sequence)
            self._requests[sequence] = _Request(sequence, sink, now, self.outputs.tokens(token_ids), now)
            self._work_arrived.notify()

    def stop(self, reason: str = "engine stopped before the request finished") -> None:
        """Stop the loop and end every unfinished stream with an error and the final flag."""
        self._stopping.set()
        with self._lock:
            self._work_arrived.notify()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            unfinished = [request for request in self._requests.values() if not request.done]
            for request in unfinished:
                self._scheduler.cancel(request.sequence)
                request.done = True
            self._requests.clear()
        for request in unfinished:
            try:
                request.sink.abort(reason)
            except Exception:  # the client may be gone already; nothing more to tell it
                pass

    def _run(self) -> None:
        step_start_s = time.monotonic()
        next_stats_s = step_start_s
        while True:
            with self._lock:
                idle_stats = None if self._scheduler.has_work else self._scheduler.stats()
            if idle_stats is not None:  # show the idle engine before sleeping until work comes
                self.observer.iteration_stats(idle_stats, self.overhead)
            with self._lock:
                while not self._stopping.is_set() and not self._scheduler.has_work:
                    self._work_arrived.wait()
                    step_start_s = time.monotonic()
                if self._stopping.is_set():
                    return
                plan = self._scheduler.plan_step()
                stats = self._scheduler.stats() if step_start_s >= next_stats_s else None
            if stats is not None:
                self.observer.iteration_stats(stats, self.overhead)
                next_stats_s = step_start_s + STATS_PERIOD_S
            slowdown = self.fault().slowdown if self.fault else 1.0
            modelled_ms = (step_duration_ms(self.profile, plan.work) * slowdown
                           * jitter_multiplier(self._step_rng, self.profile.jitter_fraction))
            deadline_s = step_start_s + modelled_ms / 1000
            host_work_s = time.monotonic() - step_start_s
            if self._stopping.wait(max(0.0, deadline_s - time.monotonic())):
                return
            delivery_start_s = time.monotonic()
            with self._lock:
                outcome = self._scheduler.complete_step(plan)
                emitted = [self._requests[sequence] for sequence in outcome.emitted if sequence in self._requests]
            first_tokens, finished = self._deliver(emitted)
            lateness_s = time.monotonic() - deadline_s
            # Metrics and cancellation checks come after the tokens are out: the next step's
            # sleep absorbs them.
            self._observe(first_tokens, finished)
            self._poll_cancellations(delivery_start_s)
            now_s = time.monotonic()
            host_work_s += now_s - delivery_start_s
            self.overhead.record(modelled_ms, lateness_s * 1000, host_work_s * 1000)
            # Lateness under one step is absorbed by the next step; beyond that, the loop restarts
            # its clock instead of running later steps back to back to catch up.
            step_start_s = deadline_s if lateness_s < modelled_ms / 1000 else now_s

    def _deliver(self, emitted: list[_Request]) -> tuple[list[_Request], list[_Request]]:
        """Send each request its token; return those that got their first token and those done."""
        first_tokens, finished = [], []
        for request in emitted:
            sequence = request.sequence
            final = sequence.finished
            token_id = next(request.tokens)
            try:
                request.sink.send(token_id, final)
            except Exception:  # the client went away: free its blocks like a cancellation
                self._cancel(request)
                continue
            if request.first_token_s is None:
                request.first_token_s = time.monotonic()
                first_tokens.append(request)
            if final:
                finished.append(request)
        if finished:
            with self._lock:
                for request in finished:
                    request.done = True
                    self._requests.pop(request.sequence, None)
        return first_tokens, finished

    def _observe(self, first_tokens: list[_Request], finished: list[_Request]) -> None:
        for request in first_tokens:
            self.observer.first_token((request.first_token_s - request.arrival_s) * 1000)
        for request in finished:
            self.observer.request_finished(request.sequence.prompt_tokens, request.sequence.output_tokens)

    def _poll_cancellations(self, now_s: float) -> None:
        with self._lock:
            due = [request for request in self._requests.values()
                   if now_s - request.last_cancel_check_s >= CANCEL_POLL_INTERVAL_S]
        for request in due:
            request.last_cancel_check_s = now_s
            if request.sink.is_cancelled():
                self._cancel(request)

    def _cancel(self, request: _Request) -> None:
        with self._lock:
            if request.done:
                return
            request.done = True
            self._requests.pop(request.sequence, None)
            self._scheduler.cancel(request.sequence)
        try:
            request.sink.close()
        except Exception:  # noqa: BLE001 - the client is gone; nothing left to tell it
            pass
