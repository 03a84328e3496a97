"""Runs load against Triton: an open loop on a schedule, or closed loops of N clients (I/O)."""

from __future__ import annotations

import csv
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmfleet.loadgen.stats import CSV_COLUMNS, ClientStats, RequestRecord, csv_row, percentile
from llmfleet.loadgen.transport import CallbackTimer, RequestStream, RunClock
from llmfleet.loadgen.workload import PlannedRequest, PromptFactory


@dataclass(frozen=True)
class Target:
    endpoints: list[str]
    model: str | None  # None until check_endpoints picks the served one


@dataclass
class RunResult:
    records: list[RequestRecord]
    duration_s: float  # from the first arrival (0) to the last response or the give-up time
    client: ClientStats
    stopped_at_s: float | None = None  # when a stop request ended the sending early


PREOPENED_STREAMS_PER_ENDPOINT = 16


class _InFlight:
    """Requests sent and not finished; the finished ones for the progress line and the summary."""

    def __init__(self):
        self.finished: list[RequestRecord] = []
        self.count = 0
        self.peak = 0
        self._changed = threading.Condition()

    def add(self) -> None:
        with self._changed:
            self.count += 1
            self.peak = max(self.peak, self.count)

    def done(self, record: RequestRecord) -> None:
        with self._changed:
            self.count -= 1
            self.finished.append(record)
            self._changed.notify_all()

    def wait_below(self, limit: int, deadline_s: float | None = None) -> bool:
        """Wait until fewer than `limit` are in flight; False if the deadline (monotonic) passed."""
        with self._changed:
            while self.count >= limit:
                remaining = None if deadline_s is None else deadline_s - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True


class _Progress(threading.Thread):
    """A status line on stderr: redrawn each second on a terminal, a new line every 10 s otherwise."""

    def __init__(self, label: str, total_s: float, in_flight: _InFlight, sent: Callable[[], int]):
        super().__init__(daemon=True)
        self._label, self._total_s, self._in_flight, self._sent = label, total_s, in_flight, sent
        self._terminal = sys.stderr.isatty()
        self._stopped = threading.Event()
        self._start_s = time.monotonic()

    def run(self) -> None:
        interval_s = 1.0 if self._terminal else 10.0
        last_finished, last_s = 0, self._start_s
        while not self._stopped.wait(interval_s):
            now_s = time.monotonic()
            finished = list(self._in_flight.finished)
            p99 = percentile([record.ttft_ms for record in finished if record.status == "ok"], 99)
            errors = sum(record.status != "ok" for record in finished)
            rate = (len(finished) - last_finished) / (now_s - last_s)
            last_finished, last_s = len(finished), now_s
            line = (f"{self._label} {now_s - self._start_s:6.1f}/{self._total_s:.0f} s  sent {self._sent():6d}  "
                    f"done {len(finished):6d} ({rate:6.1f}/s)  in flight {self._in_flight.count:4d}  "
                    f"p99 TTFT {'-' if p99 is None else f'{p99:8.1f} ms'}  errors {errors}")
            print(("\r" + line) if self._terminal else line, end="" if self._terminal else "\n",
                  file=sys.stderr, flush=True)

    def finish(self) -> None:
        self._stopped.set()
        self.join()
        if self._terminal:
            print(file=sys.stderr)


def run_open_loop(target: Target, plan: Sequence[PlannedRequest], prompts: PromptFactory, duration_s: float,
                  max_in_flight: int, drain_timeout_s: float, quiet: bool,
                  max_stream_age_s: float = float("inf"), stop: threading.Event | None = None) -> RunResult:
    """Send each planned request at its arrival time whatever is in flight (open loop); only the
    `max_in_flight` safety cap can delay a send, and every such wait is counted. Once `stop` is
    set nothing more is sent; what is in flight finishes (within the drain timeout)."""
    stop = stop or threading.Event()
    stopped_at_s = None
    timer, in_flight, clock = CallbackTimer(), _InFlight(), RunClock()
    idle: dict[str, list[RequestStream]] = {endpoint: [] for endpoint in target.endpoints}
    all_streams: list[RequestStream] = []
    pool_lock = threading.Lock()

    def on_done(stream: RequestStream, record: RequestRecord) -> None:
        if not stream.broken:
            with pool_lock:
                idle[stream.endpoint].append(stream)
        in_flight.done(record)

    def stream_for(endpoint: str) -> RequestStream:
        with pool_lock:
            # Broken and aged streams are closed here, not on their own callback thread. Aged
            # ones so that a Service balancing connections spreads load onto new replicas.
            retired = [stream for stream in idle[endpoint]
                       if stream.broken or stream.age_s() > max_stream_age_s]
            for stream in retired:
                stream.close()
            idle[endpoint] = [stream for stream in idle[endpoint] if stream not in retired]
            if idle[endpoint]:
                return idle[endpoint].pop()
        stream = RequestStream(endpoint, target.model, clock, timer, on_done)
        all_streams.append(stream)
        return stream

    sent = 0
    cap_hits = 0
    progress = None if quiet else _Progress("load", duration_s, in_flight, lambda: sent)
    with _Reporting(progress):
        try:
            # Opening a stream takes milliseconds: open some before the clock starts, more on demand.
            for endpoint in target.endpoints:
                idle[endpoint] = [stream_for(endpoint)
                                  for _ in range(min(PREOPENED_STREAMS_PER_ENDPOINT, max_in_flight))]
            clock.start()
            for planned in plan:
                endpoint = target.endpoints[planned.index % len(target.endpoints)]
                prompt = prompts.prompt(planned.index, planned.input_tokens)  # prepared before its arrival
                record = RequestRecord(planned.index, endpoint, planned.input_tokens, planned.output_tokens,
                                       arrival_s=planned.arrival_s)
                stream = stream_for(endpoint)
                delay_s = planned.arrival_s - clock.now_s()
                if (delay_s > 0 and stop.wait(delay_s)) or stop.is_set():
                    stopped_at_s = clock.now_s()
                    break
                if in_flight.count >= max_in_flight:
                    cap_hits += 1
                    in_flight.wait_below(max_in_flight)
                if stream.age_s() > max_stream_age_s:
                    # Aged while waiting for the arrival: at low rates a stream picked young was
                    # sent on seconds later, after its replica had left the Service and stopped.
                    stream.close()
                    stream = stream_for(endpoint)
                in_flight.add()
                stream.send(record, prompt)
                sent += 1
            remaining_s = 0.0 if stopped_at_s is not None else max(0.0, duration_s - clock.now_s())
            in_flight.wait_below(1, deadline_s=time.monotonic() + remaining_s + drain_timeout_s)
        finally:  # open streams have non-daemon threads: close them whatever happened
            abandoned = _abandon_all(all_streams)
    records = sorted(in_flight.finished + abandoned, key=lambda record: record.index)
    end_s = max([record.end_s for record in records] + [duration_s if stopped_at_s is None else stopped_at_s])
    return RunResult(records, end_s, ClientStats(in_flight.peak, max_in_flight, cap_hits, timer.samples_us),
                     stopped_at_s)


def run_closed_loop(target: Target, requests: Iterator[PlannedRequest], prompts: PromptFactory, concurrency: int,
                    duration_s: float, drain_timeout_s: float, quiet: bool) -> RunResult:
    """`concurrency` clients, each with its own stream, sending its next request as soon as the
    previous one finishes, until `duration_s` has passed; then the last requests finish."""
    timer, in_flight, clock = CallbackTimer(), _InFlight(), RunClock()
    next_request = _Locked(requests)

    def record_for(stream: RequestStream) -> tuple[RequestRecord, str]:
        planned = next_request()
        in_flight.add()
        record = RequestRecord(planned.index, stream.endpoint, planned.input_tokens, planned.output_tokens,
                               arrival_s=clock.now_s())
        return record, prompts.prompt(planned.index, planned.input_tokens)

    def on_done(stream: RequestStream, record: RequestRecord) -> None:
        # Count the next request in flight before this one leaves, so the count never dips to 0
        # between two requests of a client. A broken stream ends its client: reopening it here,
        # on its own callback thread, would deadlock.
        follow_up = record_for(stream) if not stream.broken and clock.now_s() < duration_s else None
        in_flight.done(record)
        if follow_up:
            stream.send(*follow_up)

    streams: list[RequestStream] = []
    progress = None if quiet else _Progress(f"concurrency {concurrency}", duration_s, in_flight,
                                            lambda: len(in_flight.finished) + in_flight.count)
    with _Reporting(progress):
        try:
            streams.extend(RequestStream(target.endpoints[worker % len(target.endpoints)], target.model, clock,
                                         timer, on_done) for worker in range(concurrency))
            clock.start()
            for stream in streams:
                stream.send(*record_for(stream))
            time.sleep(max(0.0, duration_s - clock.now_s()))
            in_flight.wait_below(1, deadline_s=time.monotonic() + drain_timeout_s)
        finally:
            abandoned = _abandon_all(streams)
    records = sorted(in_flight.finished + abandoned, key=lambda record: record.index)
    end_s = max([record.end_s for record in records] + [duration_s])
    return RunResult(records, end_s, ClientStats(in_flight.peak, concurrency, 0, timer.samples_us))


def _abandon_all(streams: Sequence[RequestStream]) -> list[RequestRecord]:
    """Close every stream; the requests still open are returned (truncated)."""
    return [record for stream in streams if (record := stream.abandon()) is not None]


class _Reporting:
    """Runs the progress line (if any) for the duration of a `with` block."""

    def __init__(self, progress: _Progress | None):
        self._progress = progress

    def __enter__(self):
        if self._progress:
            self._progress.start()

    def __exit__(self, *exc_info):
        if self._progress:
            self._progress.finish()


class _Locked:
    """next() of an iterator shared by callback threads."""

    def __init__(self, iterator: Iterator):
        self._iterator = iterator
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            return next(self._iterator)


def write_requests_csv(path: Path, records: Sequence[RequestRecord], extra: dict | None = None) -> None:
    extra = extra or {}
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=[*extra, *CSV_COLUMNS])
        writer.writeheader()
        for record in records:
            writer.writerow({**extra, **csv_row(record)})


def write_json(path: Path, body: dict) -> None:
    path.write_text(json.dumps(body, indent=2, allow_nan=False) + "\n", encoding="utf-8")
