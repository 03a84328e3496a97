"""Rate schedules and the Poisson arrivals they produce."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmfleet.loadgen.schedule import (RateSchedule, ScheduleError, parse_schedule, poisson_arrivals,
                                       schedule_from_csv)


def test_constant_forms_are_the_same_schedule():
    assert parse_schedule("5") == parse_schedule("constant:5") == RateSchedule(((0.0, 5.0),), linear=False)


def test_steps_hold_each_rate_until_the_next_point_and_the_last_one_forever():
    schedule = parse_schedule("steps:0:2,60:8,120:2")
    assert [schedule.rate_per_second(t) for t in (0, 59.9, 60, 119, 120, 1000)] == [2, 2, 8, 8, 2, 2]
    assert schedule.expected_requests(180) == 2 * 60 + 8 * 60 + 2 * 60


def test_ramp_is_linear_between_points():
    schedule = parse_schedule("ramp:0:1,60:10,120:1")
    assert schedule.rate_per_second(30) == pytest.approx(5.5)
    assert schedule.rate_per_second(90) == pytest.approx(5.5)
    assert schedule.rate_per_second(500) == 1
    assert schedule.expected_requests(120) == pytest.approx((1 + 10) / 2 * 120)
    assert schedule.expected_requests(30) == pytest.approx((1 + 5.5) / 2 * 30)


def test_csv_schedule_reads_a_header_and_interpolates():
    schedule = schedule_from_csv("time_s,rate\n0,1\n3600,4\n7200,1\n")
    assert schedule.linear
    assert schedule.rate_per_second(1800) == pytest.approx(2.5)


@pytest.mark.parametrize("spec, message", [
    ("steps:10:2", "first point must be at time 0"),
    ("steps:0:2,60:8,30:1", "increase strictly"),
    ("steps:0:2,60", "must be TIME_S:RATE"),
    ("ramp:0:-1,10:2", ">= 0"),
    ("constant:0", "every rate is 0"),
    ("poisson:3", "unknown schedule kind 'poisson'"),
    ("fast", "rate 'fast' is not a number"),
])
def test_bad_schedules_say_what_is_wrong(spec, message):
    with pytest.raises(ScheduleError, match=message):
        parse_schedule(spec)


def test_csv_without_rows_is_refused():
    with pytest.raises(ScheduleError, match="no time_s,rate rows"):
        schedule_from_csv("time_s,rate\n")


@pytest.mark.parametrize("spec, duration_s", [("constant:20", 100), ("steps:0:5,50:40", 100),
                                              ("ramp:0:0,100:40", 100)])
def test_arrival_counts_match_the_integrated_rate(spec, duration_s):
    schedule = parse_schedule(spec)
    expected = schedule.expected_requests(duration_s)
    arrivals = poisson_arrivals(schedule, duration_s, np.random.default_rng(1))
    # A Poisson count has standard deviation sqrt(mean): four of them is far outside chance.
    assert abs(len(arrivals) - expected) < 4 * math.sqrt(expected)
    assert arrivals == sorted(arrivals) and 0 < arrivals[0] and arrivals[-1] < duration_s


def test_arrivals_follow_the_shape_of_the_schedule():
    schedule = parse_schedule("steps:0:5,50:40")
    arrivals = np.array(poisson_arrivals(schedule, 100, np.random.default_rng(2)))
    first, second = np.sum(arrivals < 50), np.sum(arrivals >= 50)
    assert abs(first - 250) < 4 * math.sqrt(250) and abs(second - 2000) < 4 * math.sqrt(2000)


def test_gaps_are_exponential_at_a_constant_rate():
    arrivals = poisson_arrivals(parse_schedule("50"), 200, np.random.default_rng(3))
    gaps = np.diff(arrivals)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() == pytest.approx(1 / 50, rel=0.05)  # exponential: sd equals the mean


def test_same_seed_same_arrivals():
    schedule = parse_schedule("ramp:0:1,10:30")
    assert poisson_arrivals(schedule, 10, np.random.default_rng(7)) == \
        poisson_arrivals(schedule, 10, np.random.default_rng(7))
