"""benchmarks/data/planner_accuracy_moe.yaml (issue 28's first accuracy set on the MoE models, spent
as a check on 2026-12-07) and planner_accuracy_moe_check2.yaml (the check since) are well formed:
every row sourced, positive, on catalog names and a layout the planner can write down, or skipped
with a reason; and none of their models is one the calibration is fitted or checked on.
The estimates themselves are benchmarks/bench_planner_accuracy_moe.py's report, not asserted here:
the check is run once per model change and reported whatever it says."""

from pathlib import Path

import pytest

from llmfleet.catalog import load_catalog
from llmfleet_dev import moe_accuracy as ma

DATA_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
SETS = ("planner_accuracy_moe.yaml", "planner_accuracy_moe_check2.yaml")
CATALOG = load_catalog()
ROWS, SKIPPED = ma.load(DATA_DIR / SETS[0])


@pytest.mark.parametrize("name", SETS)
def test_every_row_is_sourced_positive_and_known_to_the_catalog(name):
    rows, skipped = ma.load(DATA_DIR / name)
    assert rows and skipped
    assert ma.problems(rows, skipped, CATALOG) == []


@pytest.mark.parametrize("name", SETS)
def test_the_rows_are_of_models_with_experts_that_no_calibration_row_names(name):
    rows, _ = ma.load(DATA_DIR / name)
    calibrated = {row.model for row in (*CATALOG.calibration_measurements, *CATALOG.calibration_holdout)}
    assert all(CATALOG.model(row.model).num_experts > 1 for row in rows)
    assert not {row.model for row in rows} & calibrated


def test_no_check_row_repeats_a_spent_row():
    spent = {(row.model, row.gpu, row.output_tokens_per_sec) for row in ROWS}
    check, _ = ma.load(DATA_DIR / SETS[1])
    assert not {(row.model, row.gpu, row.output_tokens_per_sec) for row in check} & spent


def test_problems_names_what_is_wrong():
    row = ROWS[0]
    bad = [ma.AccuracyRow(**{**row.__dict__, "source": " "}),
           ma.AccuracyRow(**{**row.__dict__, "output_tokens_per_sec": 0}),
           ma.AccuracyRow(**{**row.__dict__, "gpu": "GB200"}),
           ma.AccuracyRow(**{**row.__dict__, "output_tokens_per_sec_per_gpu": row.output_tokens_per_sec + 1}),
           ma.AccuracyRow(**{**row.__dict__, "tensor_parallel_size": 4, "expert_parallel_size": 3})]
    skipped = [ma.SkippedColumn("gpt-oss-20b", "GPT-OSS 20B", "B200 TP1 (FP4)", 0, "", "page")]
    found = ma.problems(bad, skipped, CATALOG)
    for expected in ("no source", "not positive", "GPU GB200 is not in the catalog", "per GPU",
                     "EP3 must divide TP4", "no source or no reason", "cells must be at least 1"):
        assert any(expected in problem for problem in found), expected


@pytest.mark.parametrize("stated, expected", [
    ({"tensor_parallel_size": 8, "expert_parallel_size": None, "attention_data_parallel": None}, (8, 1, False)),
    ({"tensor_parallel_size": 4, "expert_parallel_size": 4, "attention_data_parallel": True}, (4, 4, True)),
])
def test_an_unstated_layout_reads_as_its_label(stated, expected):
    row = ma.AccuracyRow(**{**ROWS[0].__dict__, **stated})
    layout = ma.layout(row)
    assert (layout.tensor_parallel_size, layout.expert_parallel_size, layout.attention_data_parallel) == expected
    if row.attention_data_parallel is None:
        other = ma.layout(row, unstated_adp=True)
        assert (other.expert_parallel_size, other.attention_data_parallel) == (8, True)


def test_per_rank_engine_limits_become_the_replicas_under_attention_data_parallelism():
    row = ma.AccuracyRow(**{**ROWS[0].__dict__, "tensor_parallel_size": 8, "expert_parallel_size": 8,
                            "attention_data_parallel": True, "max_batch_size": 128, "max_num_tokens": 1151,
                            "concurrency": 1000})
    assert ma.engine_limits(row, ma.layout(row)) == (1000, 8 * 1151)
    plain = ma.AccuracyRow(**{**ROWS[0].__dict__, "max_batch_size": None, "max_num_tokens": None, "concurrency": None})
    assert ma.engine_limits(plain, ma.layout(plain)) == (ma.DEFAULT_MAX_BATCH_SIZE, ma.DEFAULT_MAX_NUM_TOKENS)
