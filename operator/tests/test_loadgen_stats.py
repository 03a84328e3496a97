"""Per-request metrics, summaries and the Pareto frontier, checked by hand."""

from __future__ import annotations

import math

import pytest

from llmfleet.loadgen.stats import ClientStats, RequestRecord, Slo, csv_row, distribution, pareto_frontier, \
    percentile, summarize


def _record(index, arrival_s, token_times_s, end_s=None, final=True, error=None, output_tokens_requested=None):
    return RequestRecord(index, "e:8001", input_tokens=10,
                         output_tokens_requested=output_tokens_requested or len(token_times_s),
                         arrival_s=arrival_s, send_s=arrival_s + 0.001, token_times_s=token_times_s,
                         end_s=token_times_s[-1] if end_s is None else end_s, final=final, error=error)


def test_request_metrics():
    record = _record(0, 1.0, [1.1, 1.12, 1.16, 1.22])
    assert record.ttft_ms == pytest.approx(100)
    assert record.tpot_ms == pytest.approx((1.22 - 1.1) / 3 * 1000)
    assert record.token_gaps_ms() == pytest.approx([20, 40, 60])
    assert record.e2e_ms == pytest.approx(220)
    assert record.send_lag_ms == pytest.approx(1)
    assert record.status == "ok"


def test_status():
    assert _record(0, 0, [0.1], final=False).status == "truncated"
    assert _record(0, 0, [0.1], final=False, error="boom").status == "error"
    early_stop = _record(0, 0, [0.1, 0.2], output_tokens_requested=50)
    assert early_stop.status == "ok"  # the engine may stop early (end of sequence) and say so
    one_token = _record(0, 0, [0.1])
    assert math.isnan(one_token.tpot_ms)


def test_percentiles_interpolate_between_closest_ranks():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # rank (n - 1) q = 9 x 0.5 = 4.5 -> between 5 and 6; 9 x 0.99 = 8.91 -> 9 + 0.91 x (10 - 9)
    assert percentile(values, 50) == 5.5
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile(values, 95) == pytest.approx(9.55)
    assert percentile([math.nan, 3.0], 50) == 3.0
    assert percentile([], 50) is None
    assert distribution([4, 1, 3, 2]) == {"count": 4, "mean": 2.5, "p50": 2.5, "p95": 3.85, "p99": 3.97, "max": 4}
    assert distribution([])["p99"] is None


def test_slo_needs_completion_and_both_objectives():
    slo = Slo(ttft_ms=150, tpot_ms=30)
    assert slo.met_by(_record(0, 0, [0.1, 0.12]))
    assert not slo.met_by(_record(0, 0, [0.2, 0.22]))  # TTFT 200 ms
    assert not slo.met_by(_record(0, 0, [0.1, 0.15]))  # TPOT 50 ms
    assert slo.met_by(_record(0, 0, [0.1]))  # one token: no TPOT to miss
    assert not slo.met_by(_record(0, 0, [0.1], final=False))


def test_summary_by_hand():
    records = [
        _record(0, 0.0, [0.1, 0.12, 0.14]),  # TTFT 100, TPOT 20
        _record(1, 1.0, [1.3, 1.34]),  # TTFT 300, TPOT 40
        _record(2, 6.0, [6.2, 6.21, 6.22, 6.23]),  # TTFT 200, TPOT 10
        _record(3, 7.0, [], end_s=7.5, final=False, error="KV blocks"),
    ]
    summary = summarize(records, duration_s=10.0, slo=Slo(ttft_ms=250), window_s=5,
                        client=ClientStats(max_in_flight=2, in_flight_cap=100, in_flight_cap_hits=0,
                                           callback_us=[5.0, 7.0]))
    assert (summary["requests"], summary["completed"], summary["errors"], summary["truncated"]) == (4, 3, 1, 0)
    assert summary["achieved_rate_per_second"] == 0.3
    assert summary["output_tokens"] == 9 and summary["output_tokens_per_second"] == 0.9
    assert summary["ttft_ms"]["p50"] == 200 and summary["ttft_ms"]["max"] == 300
    assert summary["tpot_ms"]["mean"] == pytest.approx(70 / 3, abs=1e-3)
    assert summary["itl_ms"]["count"] == 6 and summary["itl_ms"]["max"] == 40
    assert summary["e2e_ms"]["p50"] == 230
    assert summary["goodput"] == {"slo_ttft_ms": 250, "slo_tpot_ms": None, "requests_per_second": 0.2,
                                  "share": 0.5}
    assert summary["first_error"] == "KV blocks"
    assert summary["client"]["callback_us"]["mean"] == 6
    assert summary["client"]["send_lag_ms"]["p50"] == pytest.approx(1)
    first, second = summary["windows"]
    assert (first["start_s"], first["arrivals"], first["arrival_rate_per_second"], first["completed"]) == (0, 2, 0.4, 2)
    assert first["ttft_p50_ms"] == 200 and first["output_tokens_per_second"] == 1.0
    assert (second["arrivals"], second["completed"], second["errors"], second["ttft_p99_ms"]) == (2, 1, 1, 200)


def test_no_slo_no_goodput():
    assert summarize([_record(0, 0, [0.1])], 1.0, Slo(), 1.0)["goodput"] is None


def test_csv_row_leaves_missing_values_empty():
    row = csv_row(_record(3, 0, [], end_s=1.0, final=False, error="stream closed"))
    assert row["ttft_ms"] == "" and row["tpot_ms"] == "" and row["status"] == "error"
    assert row["error"] == "stream closed" and row["e2e_ms"] == 1000


def _point(concurrency, tokens_per_second, ttft_p99_ms, tpot_p99_ms):
    return {"concurrency": concurrency, "output_tokens_per_second": tokens_per_second,
            "ttft_p99_ms": ttft_p99_ms, "tpot_p99_ms": tpot_p99_ms}


def test_pareto_frontier_drops_dominated_points():
    points = [
        _point(1, 100, 50, 10),
        _point(2, 180, 80, 12),
        _point(4, 170, 90, 13),  # worse than c=2 on all three
        _point(8, 300, 200, 20),
        _point(16, 300, 600, 25),  # same throughput as c=8, slower: dominated
        _point(32, 290, 150, 30),  # lower throughput than c=8 but better TTFT: on the frontier
        _point(64, None, None, None),  # nothing completed
    ]
    assert [point["concurrency"] for point in pareto_frontier(points)] == [1, 2, 32, 8]


def test_identical_points_both_stay_on_the_frontier():
    assert len(pareto_frontier([_point(1, 10, 1, 1), _point(2, 10, 1, 1)])) == 2


def test_windows_end_with_the_run():
    windows = summarize([_record(0, 0.5, [0.6])], duration_s=12.5, slo=Slo(), window_s=5)["windows"]
    assert [window["start_s"] for window in windows] == [0, 5, 10]
    assert windows[0]["arrival_rate_per_second"] == 0.2
    assert len(summarize([_record(0, 0.5, [0.6])], duration_s=10, slo=Slo(), window_s=10)["windows"]) == 1
