"""Length distributions, traces and synthetic prompts."""

from __future__ import annotations

import numpy as np
import pytest

from llmfleet.loadgen.lengths import (FixedLength, LengthError, LognormalLength, UniformLength,
                                      parse_length_distribution)
from llmfleet.loadgen.workload import PromptFactory, TraceError, parse_trace, planned_requests


def test_length_syntax():
    assert parse_length_distribution("128") == parse_length_distribution("fixed:128") == FixedLength(128)
    assert parse_length_distribution("uniform:64:256") == UniformLength(64, 256)
    assert parse_length_distribution("lognormal:512:2048") == LognormalLength(512, 2048)


@pytest.mark.parametrize("spec, message", [
    ("0", "at least 1"), ("uniform:9:3", "high must be at least low"), ("lognormal:500:100", "at least the mean"),
    ("lognormal:100:100000", "at most"), ("gamma:3:4", "use N, fixed:N"), ("fixed:x", "not a whole number"),
])
def test_bad_lengths_say_what_is_wrong(spec, message):
    with pytest.raises(LengthError, match=message):
        parse_length_distribution(spec)


def test_uniform_covers_both_ends():
    samples = UniformLength(3, 5).sample(np.random.default_rng(0), 3000)
    assert set(samples.tolist()) == {3, 4, 5}


def test_lognormal_has_the_asked_mean_and_p99():
    samples = LognormalLength(512, 2048).sample(np.random.default_rng(0), 200_000)
    assert samples.mean() == pytest.approx(512, rel=0.02)
    assert np.percentile(samples, 99) == pytest.approx(2048, rel=0.03)
    assert samples.min() >= 1


def test_lognormal_with_p99_equal_to_mean_is_fixed():
    samples = LognormalLength(100, 100).sample(np.random.default_rng(0), 100)
    assert set(samples.tolist()) == {100}


def test_planned_requests_are_deterministic_and_independent_of_arrivals():
    lengths = (UniformLength(1, 1000), UniformLength(1, 1000))
    open_loop = list(planned_requests(*lengths, seed=4, arrivals_s=[0.5, 1.0, 2.0]))
    closed_loop = planned_requests(*lengths, seed=4)
    assert [request.arrival_s for request in open_loop] == [0.5, 1.0, 2.0]
    assert [(r.input_tokens, r.output_tokens) for r in open_loop] == \
        [(r.input_tokens, r.output_tokens) for r in (next(closed_loop) for _ in range(3))]
    many = list(planned_requests(*lengths, seed=4, arrivals_s=[0.0] * 3000))
    assert [request.index for request in many] == list(range(3000))
    assert len({request.input_tokens for request in many}) > 500  # chunks differ


def test_csv_trace_is_sorted_by_arrival():
    requests = parse_trace("arrival_s,input_tokens,output_tokens\n1.5,100,20\n0.25,50,10\n", jsonl=False)
    assert [(r.index, r.arrival_s, r.input_tokens, r.output_tokens) for r in requests] == \
        [(0, 0.25, 50, 10), (1, 1.5, 100, 20)]


def test_jsonl_trace():
    text = '{"arrival_s": 0, "input_tokens": 7, "output_tokens": 3}\n\n{"arrival_s": 2, "input_tokens": 9, ' \
           '"output_tokens": 4}\n'
    assert [(r.arrival_s, r.input_tokens) for r in parse_trace(text, jsonl=True)] == [(0, 7), (2, 9)]


@pytest.mark.parametrize("text, jsonl, message", [
    ("arrival,input_tokens,output_tokens\n1,2,3\n", False, "missing \\['arrival_s'\\]"),
    ("arrival_s,input_tokens,output_tokens\n1,x,3\n", False, "line 2: input_tokens 'x' is not a number"),
    ("arrival_s,input_tokens,output_tokens\n1,0,3\n", False, "line 2: .*token counts >= 1"),
    ('{"arrival_s": 1}\n', True, "line 1: no input_tokens"),
    ("[1, 2]\n", True, "expected an object"),
    ("arrival_s,input_tokens,output_tokens\n", False, "no requests"),
])
def test_bad_traces_name_the_line(text, jsonl, message):
    with pytest.raises(TraceError, match=message):
        parse_trace(text, jsonl=jsonl)


def test_prompts_have_the_asked_word_count_and_are_deterministic():
    prompts = PromptFactory(seed=1)
    assert len(prompts.prompt(0, 300).split()) == 300
    assert prompts.prompt(5, 40) == PromptFactory(seed=1).prompt(5, 40)
    assert prompts.prompt(5, 40) != prompts.prompt(6, 40)
    assert prompts.prompt(5, 40) != PromptFactory(seed=2).prompt(5, 40)


def test_shared_prefix_is_common_to_every_prompt():
    prompts = PromptFactory(seed=1, shared_prefix_fraction=0.5)
    short, long = prompts.prompt(0, 100).split(), prompts.prompt(1, 5000).split()
    assert short[:50] == long[:50]
    assert long[:2500] == PromptFactory(seed=1, shared_prefix_fraction=0.5).prompt(9, 5000).split()[:2500]
    assert short[50:] != long[50:100]
