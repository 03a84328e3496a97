"""Per-request records, percentiles, run summaries and the Pareto frontier (pure).

Latencies are measured from the request's *arrival* (its scheduled time in an open loop), not
from when the client got round to sending it, so a generator that falls behind shows up as
latency instead of hiding it (no coordinated omission); `send_lag_ms` tells the two apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it; times are seconds from the start of the run."""

    index: int
    endpoint: str
    input_tokens: int
    output_tokens_requested: int
    arrival_s: float
    send_s: float = math.nan
    token_times_s: Sequence[float] = field(default_factory=list)
    end_s: float = math.nan
    final: bool = False  # the server flagged its last response
    error: str | None = None

    @property
    def status(self) -> str:
        """ok; error (the server or the stream reported one); truncated (the stream ended, or the
        run stopped waiting, before the final response)."""
        if self.error is not None:
            return "error"
        return "ok" if self.final else "truncated"

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def send_lag_ms(self) -> float:
        return (self.send_s - self.arrival_s) * 1000

    @property
    def ttft_ms(self) -> float:
        return (self.token_times_s[0] - self.arrival_s) * 1000 if self.output_tokens else math.nan

    @property
    def tpot_ms(self) -> float:
        """Mean gap after the first token (NaN with fewer than two tokens)."""
        if self.output_tokens < 2:
            return math.nan
        return (self.token_times_s[-1] - self.token_times_s[0]) / (self.output_tokens - 1) * 1000

    @property
    def e2e_ms(self) -> float:
        return (self.end_s - self.arrival_s) * 1000

    def token_gaps_ms(self) -> np.ndarray:
        return np.diff(np.asarray(self.token_times_s, dtype=np.float64)) * 1000


CSV_COLUMNS = ("index", "endpoint", "status", "arrival_s", "send_s", "send_lag_ms", "input_tokens",
               "output_tokens_requested", "output_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "error")


def csv_row(record: RequestRecord) -> dict:
    def rounded(value: float, digits: int):
        return "" if math.isnan(value) else round(value, digits)

    return {"index": record.index, "endpoint": record.endpoint, "status": record.status,
            "arrival_s": rounded(record.arrival_s, 6), "send_s": rounded(record.send_s, 6),
            "send_lag_ms": rounded(record.send_lag_ms, 3), "input_tokens": record.input_tokens,
            "output_tokens_requested": record.output_tokens_requested, "output_tokens": record.output_tokens,
            "ttft_ms": rounded(record.ttft_ms, 3), "tpot_ms": rounded(record.tpot_ms, 3),
            "e2e_ms": rounded(record.e2e_ms, 3), "error": record.error or ""}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, linear between closest ranks (numpy's default); None when empty."""
    finite = [value for value in values if not math.isnan(value)]
    return float(np.percentile(finite, q)) if finite else None


def distribution(values: Sequence[float]) -> dict:
    finite = np.asarray([value for value in values if not math.isnan(value)], dtype=np.float64)
    if finite.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(finite, PERCENTILES)
    return {"count": int(finite.size), "mean": _round(finite.mean()), "p50": _round(p50), "p95": _round(p95),
            "p99": _round(p99), "max": _round(finite.max())}


def _round(value: float) -> float:
    return round(float(value), 3)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met_by(self, record: RequestRecord) -> bool:
        if record.status != "ok":
            return False
        if self.ttft_ms is not None and not record.ttft_ms <= self.ttft_ms:
            return False
        # A one-token answer has no TPOT, so it cannot miss a TPOT objective.
        return self.tpot_ms is None or math.isnan(record.tpot_ms) or record.tpot_ms <= self.tpot_ms


@dataclass(frozen=True)
class ClientStats:
    """The generator's own health: if these are large, the numbers measure the client."""

    max_in_flight: int
    in_flight_cap: int
    in_flight_cap_hits: int  # arrivals that had to wait for a free slot (sent late)
    callback_us: Sequence[float]  # time spent in each stream callback

    def to_json_dict(self, records: Sequence[RequestRecord]) -> dict:
        return {"send_lag_ms": distribution([record.send_lag_ms for record in records]),
                "callback_us": distribution(self.callback_us),
                "max_in_flight": self.max_in_flight, "in_flight_cap": self.in_flight_cap,
                "in_flight_cap_hits": self.in_flight_cap_hits}


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: Slo, window_s: float,
              client: ClientStats | None = None) -> dict:
    """The JSON summary of a run. Latency percentiles are over completed (ok) requests; rates are
    over `duration_s`, the run's wall time from the first scheduled arrival to the last response."""
    completed = [record for record in records if record.status == "ok"]
    output_tokens = sum(record.output_tokens for record in records)
    summary = {
        "requests": len(records),
        "completed": len(completed),
        "errors": sum(record.status == "error" for record in records),
        "truncated": sum(record.status == "truncated" for record in records),
        "duration_s": _round(duration_s),
        "achieved_rate_per_second": _round(len(completed) / duration_s) if duration_s > 0 else None,
        "output_tokens": output_tokens,
        "output_tokens_per_second": _round(output_tokens / duration_s) if duration_s > 0 else None,
        "ttft_ms": distribution([record.ttft_ms for record in completed]),
        "tpot_ms": distribution([record.tpot_ms for record in completed]),
        "itl_ms": distribution(np.concatenate([record.token_gaps_ms() for record in completed])
                               if completed else []),
        "e2e_ms": distribution([record.e2e_ms for record in completed]),
        "goodput": _goodput(records, duration_s, slo),
        "windows": time_windows(records, duration_s, window_s),
    }
    if client is not None:
        summary["client"] = client.to_json_dict(records)
    first_error = next((record.error for record in records if record.error), None)
    if first_error is not None:
        summary["first_error"] = first_error
    return summary


def _goodput(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> dict | None:
    if slo.ttft_ms is None and slo.tpot_ms is None:
        return None
    good = sum(slo.met_by(record) for record in records)
    return {"slo_ttft_ms": slo.ttft_ms, "slo_tpot_ms": slo.tpot_ms,
            "requests_per_second": _round(good / duration_s) if duration_s > 0 else None,
            "share": _round(good / len(records)) if records else None}


def time_windows(records: Sequence[RequestRecord], duration_s: float, window_s: float) -> list[dict]:
    """Per window of `window_s` over the whole run (the drain after the last arrival included):
    arrivals and their rate, completions, errors, TTFT p50/p99 of the requests arriving in it,
    and output tokens/s streamed in it."""
    if duration_s <= 0:
        return []
    count = max(1, math.ceil(duration_s / window_s - 1e-9))  # no sliver window from rounding
    arriving: list[list[RequestRecord]] = [[] for _ in range(count)]
    for record in records:
        arriving[min(count - 1, int(record.arrival_s // window_s))].append(record)
    edges = np.arange(count + 1, dtype=np.float64) * window_s
    edges[-1] = duration_s  # the last window may be shorter: it ends with the run
    token_times = np.concatenate([np.asarray(record.token_times_s, dtype=np.float64) for record in records]
                                 ) if records else np.empty(0)
    tokens_per_window, _ = np.histogram(token_times, bins=edges)
    ends = [record.end_s for record in records if record.status == "ok"]
    completions_per_window, _ = np.histogram(ends, bins=edges)
    windows = []
    for index, window_records in enumerate(arriving):
        ttfts = [record.ttft_ms for record in window_records if record.status == "ok"]
        width_s = edges[index + 1] - edges[index]
        windows.append({
            "start_s": _round(edges[index]),
            "arrivals": len(window_records),
            "arrival_rate_per_second": _round(len(window_records) / width_s),
            "completed": int(completions_per_window[index]),
            "errors": sum(record.status != "ok" for record in window_records),
            "ttft_p50_ms": _maybe_round(percentile(ttfts, 50)),
            "ttft_p99_ms": _maybe_round(percentile(ttfts, 99)),
            "output_tokens_per_second": _round(tokens_per_window[index] / width_s),
        })
    return windows


def _maybe_round(value: float | None) -> float | None:
    return None if value is None else _round(value)


def pareto_frontier(points: Sequence[dict]) -> list[dict]:
    """The points no other point beats: higher `output_tokens_per_second` is better, lower
    `ttft_p99_ms` and `tpot_p99_ms` are better. Sorted by throughput."""
    def dominates(a: dict, b: dict) -> bool:
        no_worse = (a["output_tokens_per_second"] >= b["output_tokens_per_second"]
                    and a["ttft_p99_ms"] <= b["ttft_p99_ms"] and a["tpot_p99_ms"] <= b["tpot_p99_ms"])
        better = (a["output_tokens_per_second"] > b["output_tokens_per_second"]
                  or a["ttft_p99_ms"] < b["ttft_p99_ms"] or a["tpot_p99_ms"] < b["tpot_p99_ms"])
        return no_worse and better

    usable = [point for point in points if None not in
              (point["output_tokens_per_second"], point["ttft_p99_ms"], point["tpot_p99_ms"])]
    frontier = [point for point in usable if not any(dominates(other, point) for other in usable)]
    return sorted(frontier, key=lambda point: point["output_tokens_per_second"])
