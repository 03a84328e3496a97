"""Arrival-rate schedules and the Poisson arrivals they produce (pure).

Syntax of `--schedule` (times in seconds from the start, rates in requests per second):

    5  or  constant:5            5 requests/s throughout
    steps:0:2,60:8,120:2         2/s from 0 s, 8/s from 60 s, 2/s from 120 s on
    ramp:0:1,60:10,120:1         linear from 1/s at 0 s to 10/s at 60 s, back to 1/s at 120 s
    csv:PATH                     a diurnal curve: rows `time_s,rate` (header optional), linear
                                 between rows

The first point must be at 0 s; times must increase; after the last point its rate holds.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
from dataclasses import dataclass

import numpy as np


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class RateSchedule:
    """A request rate over time: points (time_s, rate_per_second), held or linear in between."""

    points: tuple[tuple[float, float], ...]
    linear: bool

    def __post_init__(self):
        if not self.points or self.points[0][0] != 0:
            raise ScheduleError("the first point must be at time 0 s")
        times = [time_s for time_s, _ in self.points]
        if any(later <= earlier for earlier, later in zip(times, times[1:])):
            raise ScheduleError(f"point times must increase strictly, got {times}")
        for time_s, rate in self.points:
            if not (math.isfinite(rate) and rate >= 0):
                raise ScheduleError(f"rate at {time_s:g} s must be a finite number >= 0, got {rate}")
        if max(rate for _, rate in self.points) == 0:
            raise ScheduleError("every rate is 0: no request would ever be sent")

    def rate_per_second(self, time_s: float) -> float:
        times = [point_time for point_time, _ in self.points]
        index = bisect.bisect_right(times, time_s) - 1
        time_before, rate_before = self.points[index]
        if not self.linear or index == len(self.points) - 1:
            return rate_before
        time_after, rate_after = self.points[index + 1]
        return rate_before + (rate_after - rate_before) * (time_s - time_before) / (time_after - time_before)

    def expected_requests(self, duration_s: float) -> float:
        """The integral of the rate over [0, duration_s]: the mean number of arrivals."""
        knots = sorted({time_s for time_s, _ in self.points if time_s < duration_s} | {duration_s})
        total = 0.0
        for start_s, end_s in zip(knots, knots[1:]):
            if self.linear:  # trapezoid is exact on a linear piece
                total += (self.rate_per_second(start_s) + self.rate_per_second(end_s)) / 2 * (end_s - start_s)
            else:
                total += self.rate_per_second(start_s) * (end_s - start_s)
        return total

    def peak_rate_per_second(self, duration_s: float) -> float:
        # Linear pieces peak at their ends, so the points and the end of the run cover the maximum.
        return max([rate for time_s, rate in self.points if time_s < duration_s]
                   + [self.rate_per_second(duration_s)])


def poisson_arrivals(schedule: RateSchedule, duration_s: float, rng: np.random.Generator) -> list[float]:
    """Arrival offsets (s) of a Poisson process whose rate follows the schedule.

    Thinning (Lewis and Shedler): candidates at the peak rate, each kept with probability
    rate(t) / peak; exact for any rate shape.
    """
    peak = schedule.peak_rate_per_second(duration_s)
    if peak <= 0:
        return []
    arrivals = []
    time_s = 0.0
    while True:
        time_s += rng.exponential(1.0 / peak)
        if time_s >= duration_s:
            return arrivals
        if rng.random() * peak < schedule.rate_per_second(time_s):
            arrivals.append(time_s)


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ScheduleError(f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ScheduleError(f"{what} must be finite, got {text!r}")
    return value


def _points(text: str) -> tuple[tuple[float, float], ...]:
    points = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 2:
            raise ScheduleError(f"point {item.strip()!r} must be TIME_S:RATE, e.g. 60:8")
        points.append((_number(parts[0], "time"), _number(parts[1], "rate")))
    return tuple(points)


def parse_schedule(spec: str) -> RateSchedule:
    """A `constant`, `steps` or `ramp` schedule from its text (`csv:` is read by `schedule_from_csv`)."""
    kind, _, body = spec.strip().partition(":")
    if not body:
        return RateSchedule(((0.0, _number(kind, "rate")),), linear=False)
    if kind == "constant":
        return RateSchedule(((0.0, _number(body, "rate")),), linear=False)
    if kind == "steps":
        return RateSchedule(_points(body), linear=False)
    if kind == "ramp":
        return RateSchedule(_points(body), linear=True)
    raise ScheduleError(f"unknown schedule kind {kind!r}; use RATE, constant:RATE, steps:T:R,T:R,..., "
                        "ramp:T:R,T:R,... or csv:PATH")


def schedule_from_csv(text: str) -> RateSchedule:
    """A diurnal schedule: CSV rows `time_s,rate`, an optional header, linear in between."""
    rows = [row for row in csv.reader(io.StringIO(text)) if row and any(cell.strip() for cell in row)]
    if rows and not _is_number(rows[0][0]):
        rows = rows[1:]
    points = []
    for line_number, row in enumerate(rows, start=1):
        if len(row) < 2:
            raise ScheduleError(f"row {line_number} {row!r} must be time_s,rate")
        points.append((_number(row[0], f"row {line_number} time"), _number(row[1], f"row {line_number} rate")))
    if not points:
        raise ScheduleError("the CSV has no time_s,rate rows")
    return RateSchedule(tuple(points), linear=True)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
