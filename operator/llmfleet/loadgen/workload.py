"""What to send: request plans from arrivals and length distributions, traces, prompts (pure)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from llmfleet.loadgen.lengths import LengthDistribution

TRACE_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
_LENGTH_CHUNK = 1024
# Pronounceable four-letter words, 16 x 4 x 16 x 4 = 4096 of them: one word is about one token.
_CONSONANTS, _VOWELS = "bdfghjklmnprstvz", "aeio"
VOCABULARY = np.array([a + b + c + d for a in _CONSONANTS for b in _VOWELS for c in _CONSONANTS for d in _VOWELS])


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line and the fix."""


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    arrival_s: float | None  # offset from the start of the run; None in a closed loop
    input_tokens: int
    output_tokens: int


def planned_requests(input_lengths: LengthDistribution, output_lengths: LengthDistribution, seed: int,
                     arrivals_s: Iterable[float | None] | None = None) -> Iterator[PlannedRequest]:
    """Requests numbered from 0 with sampled lengths; one per arrival, or endless without arrivals.

    Lengths are drawn in chunks from one generator seeded by `seed`, so request i always gets
    the same lengths whatever the arrivals are.
    """
    rng = np.random.default_rng([seed, 1])
    arrivals = itertools.repeat(None) if arrivals_s is None else arrivals_s
    index = 0
    inputs = outputs = np.empty(0, dtype=np.int64)
    for arrival_s in arrivals:
        if index % _LENGTH_CHUNK == 0:
            inputs = input_lengths.sample(rng, _LENGTH_CHUNK)
            outputs = output_lengths.sample(rng, _LENGTH_CHUNK)
        position = index % _LENGTH_CHUNK
        yield PlannedRequest(index, arrival_s, int(inputs[position]), int(outputs[position]))
        index += 1


def parse_trace(text: str, jsonl: bool) -> list[PlannedRequest]:
    """Requests from a trace: CSV with a header naming `arrival_s,input_tokens,output_tokens`, or
    JSON lines with those keys; sorted by arrival."""
    rows = _jsonl_rows(text) if jsonl else _csv_rows(text)
    requests = []
    for line_number, row in rows:
        arrival_s = _trace_number(row, "arrival_s", line_number, float)
        input_tokens = _trace_number(row, "input_tokens", line_number, int)
        output_tokens = _trace_number(row, "output_tokens", line_number, int)
        if arrival_s < 0 or input_tokens < 1 or output_tokens < 1:
            raise TraceError(f"line {line_number}: arrival_s must be >= 0 and token counts >= 1, got {row}")
        requests.append((arrival_s, input_tokens, output_tokens))
    if not requests:
        raise TraceError("the trace has no requests")
    requests.sort(key=lambda request: request[0])
    return [PlannedRequest(index, *request) for index, request in enumerate(requests)]


def _csv_rows(text: str) -> Iterator[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [column for column in TRACE_COLUMNS if column not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"the CSV header must name {','.join(TRACE_COLUMNS)}; missing {missing}")
    for row in reader:
        yield reader.line_num, row


def _jsonl_rows(text: str) -> Iterator[tuple[int, dict]]:
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"line {line_number}: not JSON: {error.msg}") from None
        if not isinstance(row, dict):
            raise TraceError(f"line {line_number}: expected an object with keys {', '.join(TRACE_COLUMNS)}")
        yield line_number, row


def _trace_number(row: dict, key: str, line_number: int, kind: type):
    if row.get(key) in (None, ""):
        raise TraceError(f"line {line_number}: no {key}")
    try:
        value = kind(float(row[key])) if kind is int else kind(row[key])
    except (TypeError, ValueError):
        raise TraceError(f"line {line_number}: {key} {row[key]!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"line {line_number}: {key} must be finite")
    return value


class PromptFactory:
    """Synthetic prompts of whitespace-separated words, deterministic in (seed, request index).

    The first `shared_prefix_fraction` of every prompt is the same word sequence, as a shared
    system prompt is, so engines with prefix reuse can hit their cache; the rest is the
    request's own.
    """

    def __init__(self, seed: int, shared_prefix_fraction: float = 0.0):
        if not 0 <= shared_prefix_fraction <= 1:
            raise ValueError(f"shared prefix fraction must be within 0..1, got {shared_prefix_fraction}")
        self._seed = seed
        self._shared_prefix_fraction = shared_prefix_fraction
        self._shared_prefix = np.empty(0, dtype=VOCABULARY.dtype)

    def prompt(self, request_index: int, tokens: int) -> str:
        shared_tokens = math.floor(self._shared_prefix_fraction * tokens)
        if shared_tokens > len(self._shared_prefix):
            self._shared_prefix = self._words(np.random.default_rng([self._seed, 2]), max(shared_tokens, 1024))
        own = self._words(np.random.default_rng([self._seed, 3, request_index]), tokens - shared_tokens)
        return " ".join(itertools.chain(self._shared_prefix[:shared_tokens], own))

    @staticmethod
    def _words(rng: np.random.Generator, count: int) -> np.ndarray:
        return VOCABULARY[rng.integers(0, len(VOCABULARY), size=count)]
