"""Query windows derived from the scrape interval (llmfleet.metrics.cadence)."""

from __future__ import annotations

import pytest

from llmfleet.metrics.cadence import (
    ASSUMED_INTERVAL_SECONDS,
    CadenceSource,
    QueryWindow,
    ScrapeCadence,
    choose_cadence,
    metrics_windows,
    observed_interval,
    rate_window,
)


def observed(seconds: float) -> ScrapeCadence:
    return ScrapeCadence(seconds, CadenceSource.OBSERVED)


@pytest.mark.parametrize("interval_s, window_s", [(5, 30), (15, 60), (30, 120), (60, 240)])
def test_the_default_rate_window_holds_four_scrapes_and_at_least_30_s(interval_s, window_s):
    window = rate_window(observed(interval_s))
    assert window == QueryWindow(window_s)
    assert window.seconds >= 4 * interval_s
    assert window.widening("the p99 window", observed(interval_s)) is None


@pytest.mark.parametrize("interval_s, requested_s, expected", [
    (5, 30, QueryWindow(30)), (15, 30, QueryWindow(60, widened_from=30)),
    (30, 30, QueryWindow(120, widened_from=30)), (60, 300, QueryWindow(300))])
def test_a_requested_window_too_short_for_the_interval_is_widened_and_says_so(interval_s, requested_s, expected):
    cadence = observed(interval_s)
    window = rate_window(cadence, requested_s)
    assert window == expected
    sentence = window.widening("--window-s", cadence)
    if expected.widened_from is None:
        assert sentence is None
    else:
        assert sentence == (f"--window-s of {requested_s} s holds fewer than 4 scrapes at the scrape interval "
                            f"{interval_s} s (observed): widened to {expected.seconds} s")


def test_every_window_of_a_pass_follows_the_cadence():
    windows = metrics_windows(observed(60), observation_requested_seconds=120)
    assert windows.rate == QueryWindow(240)
    assert windows.observation == QueryWindow(240, widened_from=120)
    # An analysis covers the step since it began, never less than a rate window.
    assert windows.analysis_seconds(10) == 240
    assert windows.analysis_seconds(600) == 600
    assert metrics_windows(observed(5), 300).observation == QueryWindow(300)


def test_the_interval_is_the_median_spacing_of_samples_over_all_series():
    # One series scraped every 15 s with jitter, one that missed a scrape (a 30 s gap).
    series = [[0.0, 15.002, 29.998, 45.0], [1.0, 16.0, 46.0]]
    assert observed_interval(series) == 15.0
    assert observed_interval([[5.0], []]) is None  # no series with two samples
    assert observed_interval([]) is None
    assert observed_interval([[3.0, 3.0]]) is None  # a repeated timestamp is no spacing


def test_a_configured_interval_wins_then_the_observed_then_an_assumed_one():
    assert choose_cadence(15, 5.0) == ScrapeCadence(15, CadenceSource.CONFIGURED)
    assert choose_cadence(None, 5.0) == ScrapeCadence(5.0, CadenceSource.OBSERVED)
    assumed = choose_cadence(None, None)
    assert assumed == ScrapeCadence(ASSUMED_INTERVAL_SECONDS, CadenceSource.ASSUMED)
    assert assumed.describe() == "scrape interval 30 s (assumed)"
