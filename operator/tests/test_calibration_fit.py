"""The calibration fit (llmfleet_dev.calibration_fit) on the rows declared in calibration.yaml, and
its error on the held-out rows of calibration_holdout.yaml."""

import dataclasses
import statistics
from importlib import resources

import pytest
import yaml

from llmfleet.catalog import load_catalog
from llmfleet_dev import calibration_fit as cf
from llmfleet.planner import estimate

CATALOG = load_catalog()
ROWS = CATALOG.calibration_measurements
A100, B200, H100, H200, L40S = "A100-SXM-80GB", "B200-180GB", "H100-SXM-80GB", "H200-SXM-141GB", "L40S-48GB"
DENSE = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b")
MODELS = (*DENSE, "mixtral-8x7b")
AMPERE, ADA, BLACKWELL = (cf.GENERATION_FACTORS[generation] for generation in ("ampere", "ada", "blackwell"))
ADA_LINK = cf.INTERCONNECT_FACTORS["ada"]
TP2, TP4, TP8 = (cf.TENSOR_PARALLEL_FACTORS[tp] for tp in (2, 4, 8))

# Held-out rows (TensorRT-LLM v0.20 perf overview, never fitted): the targets are a median
# |estimate/measured - 1| of 12 % and a p90 of 30 %, with no group's median estimate/measured above
# 1.10. The written factors meet them (8 %, 19 %, 1.07; docs/benchmarks/calibration-log.md has every
# check, including the ones that missed).


@pytest.fixture(scope="module")
def folds():
    return {(fold.kind, fold.name): fold for fold in cf.leave_one_group_out(ROWS, CATALOG)}


def test_the_fit_reproduces_the_factors_in_calibration_yaml():
    fitted = cf.fit(ROWS, CATALOG)
    assert cf.factor_values(fitted) == pytest.approx(cf.factor_values(CATALOG.calibration), abs=1e-9)
    values = cf.factor_values(fitted)
    # The own factors the data moves away from 1.
    assert values[BLACKWELL] < 1.0 and values[cf.MOE_FACTOR] < 1.0 and values[ADA_LINK] < 1.0
    # A rank reaches less of its peak as TP grows (never more than at a smaller TP).
    assert 1.0 >= values[TP2] >= values[TP4] >= values[TP8] and values[TP8] < 1.0


def test_the_fit_does_not_start_from_the_values_it_reproduces():
    edited = cf.with_factors(CATALOG.calibration, {BLACKWELL: 1.3, AMPERE: 0.5, cf.MOE_FACTOR: 1.4,
                                                   ADA_LINK: 0.4, TP4: 1.5, "step_overhead_ms": 9.0,
                                                   "memory_bandwidth_efficiency": 0.95})
    other = dataclasses.replace(CATALOG, calibration=edited)
    assert cf.factor_values(cf.fit(ROWS, other)) == cf.factor_values(cf.fit(ROWS, CATALOG))
    assert cf.factor_values(cf.fit(ROWS, other, cf.FREE)) == cf.factor_values(cf.fit(ROWS, CATALOG, cf.FREE))


def test_the_fit_never_reads_the_held_out_rows():
    without = dataclasses.replace(CATALOG, calibration_holdout=())
    assert cf.factor_values(cf.fit(ROWS, without)) == cf.factor_values(CATALOG.calibration)
    fitted = {(m.model, m.gpu, m.tensor_parallel_size, m.quantization, m.input_tokens, m.output_tokens,
               m.output_tokens_per_sec) for m in ROWS}
    assert not any((m.model, m.gpu, m.tensor_parallel_size, m.quantization, m.input_tokens, m.output_tokens,
                    m.output_tokens_per_sec) in fitted for m in CATALOG.calibration_holdout)


def test_no_group_is_estimated_optimistically_with_the_yaml_factors():
    """Conservative bound: per GPU, model and format, median estimate/measured <= 1.10."""
    groups: dict[str, list[float]] = {}
    for m in ROWS:
        got = estimate(m.model, m.gpu, m.tensor_parallel_size, m.quantization, m.kv_cache_dtype, m.input_tokens,
                       m.output_tokens, kv_cache_free_gpu_mem_fraction=0.95).max_throughput_tokens_per_sec
        for group in (m.gpu, m.model, m.quantization):
            groups.setdefault(group, []).append(got / m.output_tokens_per_sec)
    assert set(groups) == {A100, B200, H100, H200, L40S, *MODELS, "FP16", "FP8", "NVFP4"}
    medians = {group: statistics.median(ratios) for group, ratios in groups.items()}
    assert max(medians.values()) <= 1.10, medians


def test_the_median_limit_bounds_the_fit(monkeypatch):
    # The written fit's highest group median is 70B's, just above 1.0: under a limit of 1.0 the fit
    # must move to another point, feasible under the tighter limit and worse in RMS.
    monkeypatch.setattr(cf, "MEDIAN_RATIO_LIMIT", 1.0)
    tighter = cf.fit(ROWS, CATALOG)
    score = cf.score(ROWS, cf.estimate_ratios(ROWS, tighter, CATALOG))
    written = cf.score(ROWS, cf.estimate_ratios(ROWS, CATALOG.calibration, CATALOG))
    assert written.worst_group_median > 1.0
    assert score.feasible and score.worst_group_median <= 1.0
    assert score.rms_log_error > written.rms_log_error


@pytest.mark.parametrize("factor", cf.OWN_FACTORS)
def test_an_own_factor_changes_only_the_estimates_it_applies_to(factor):
    halved = dataclasses.replace(CATALOG, calibration=cf.with_factors(
        CATALOG.calibration, {factor: cf.factor_values(CATALOG.calibration)[factor] / 2}))
    configurations = [("llama-3.1-8b", H100, 1, "FP8", "FP8"), ("llama-3.1-70b", H200, 4, "FP8", "FP8"),
                      ("llama-3.1-8b", A100, 1, "BF16", "FP16"), ("llama-3.1-70b", A100, 4, "FP16", "FP16"),
                      ("llama-3.1-8b", L40S, 1, "FP8", "FP8"), ("llama-3.1-70b", L40S, 4, "FP8", "FP8"),
                      ("llama-3.1-70b", B200, 1, "NVFP4", "FP8"), ("mixtral-8x7b", H100, 2, "FP8", "FP8"),
                      ("llama-3.1-405b", H100, 8, "FP8", "FP8")]
    changed = set()
    for model, gpu, tp, quantization, kv in configurations:
        args = (model, gpu, tp, quantization, kv, 1000, 200, 8)
        if estimate(*args, catalog=halved) != estimate(*args):
            assert estimate(*args, catalog=halved).tpot_ms > estimate(*args).tpot_ms
            changed.add((model, gpu, tp))
    assert changed == {
        AMPERE: {("llama-3.1-8b", A100, 1), ("llama-3.1-70b", A100, 4)},
        ADA: {("llama-3.1-8b", L40S, 1), ("llama-3.1-70b", L40S, 4)},
        BLACKWELL: {("llama-3.1-70b", B200, 1)},
        ADA_LINK: {("llama-3.1-70b", L40S, 4)},
        cf.MOE_FACTOR: {("mixtral-8x7b", H100, 2)},
        TP2: {("mixtral-8x7b", H100, 2)},
        TP4: {("llama-3.1-70b", H200, 4), ("llama-3.1-70b", A100, 4), ("llama-3.1-70b", L40S, 4)},
        TP8: {("llama-3.1-405b", H100, 8)},
    }[factor]


def test_leave_one_group_out_by_gpu_model_and_format(folds):
    assert set(folds) == ({("gpu", gpu) for gpu in (A100, B200, H100, H200, L40S)}
                          | {("model", model) for model in MODELS}
                          | {("quantization", name) for name in ("FP16", "FP8", "NVFP4")})
    assert {key: fold.error.rows for key, fold in folds.items()} == {
        ("gpu", A100): 165, ("gpu", B200): 20, ("gpu", H100): 278, ("gpu", H200): 197, ("gpu", L40S): 124,
        ("model", "llama-3.1-8b"): 83, ("model", "llama-3.1-70b"): 338, ("model", "llama-3.1-405b"): 39,
        ("model", "mistral-7b"): 81, ("model", "mixtral-8x7b"): 243, ("quantization", "FP16"): 259,
        ("quantization", "FP8"): 505, ("quantization", "NVFP4"): 20}
    # Without its rows nothing fits a group's own factor: the other factors alone are optimistic
    # on B200 NVFP4, on the L40S and on Mixtral (the reasons those factors exist).
    for key, factors, above in (((("gpu", B200), ("quantization", "NVFP4")), (BLACKWELL,), 1.1),
                                ((("gpu", L40S),), (ADA, ADA_LINK), 1.15),
                                ((("model", "mixtral-8x7b"),), (cf.MOE_FACTOR,), 1.05)):
        for fold_key in key:
            values = cf.factor_values(folds[fold_key].calibration)
            assert all(values[factor] == 1.0 for factor in factors), fold_key
            assert folds[fold_key].error.median_ratio > above, fold_key
    # A Hopper GPU, the A100 or a dense model left out: the refit predicts it within 20 % at the
    # median, 45 % at p90 (docs/benchmarks/calibration.md has the numbers; 70B's memory-bound rows
    # are the tail).
    for key in [("gpu", H100), ("gpu", H200), ("gpu", A100), *(("model", model) for model in DENSE)]:
        assert folds[key].error.median_abs_error < 0.20, key
        assert folds[key].error.p90_abs_error < 0.45, key
        assert cf.factor_values(folds[key].calibration)[BLACKWELL] < 1.0, key
    # A format left out (FP16 or FP8): the dense Hopper rows of the other (H100 FP16 or FP8) fit the
    # shared factors, and the refit predicts it within 10 % at the median.
    for fmt in ("FP16", "FP8"):
        assert abs(folds["quantization", fmt].error.median_ratio - 1) < 0.1, fmt


def test_the_held_out_error_is_within_the_bounds_achieved():
    errors = cf.holdout_errors(CATALOG)
    overall, groups = errors[0], errors[1:]
    assert overall.rows == len(CATALOG.calibration_holdout) == 167
    assert {(group.kind, group.name) for group in groups} == (
        {("gpu", gpu) for gpu in (B200, H100, H200)}
        | {("model", model) for model in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b")}
        | {("quantization", "FP8"), ("quantization", "NVFP4")})
    assert overall.median_abs_error <= cf.HOLDOUT_MEDIAN_TARGET
    assert overall.p90_abs_error <= cf.HOLDOUT_P90_TARGET
    assert max(group.median_ratio for group in groups) <= cf.MEDIAN_RATIO_LIMIT


def test_writing_the_yaml_changes_only_factor_values_and_the_fitted_line():
    text = resources.files("llmfleet.catalog").joinpath("calibration.yaml").read_text(encoding="utf-8")
    changed = cf.with_factors(CATALOG.calibration, {ADA: 0.55, "step_overhead_ms": 6.5})
    written = cf.update_calibration_yaml(text, changed, "a test")
    diff = [(old, new) for old, new in zip(text.splitlines(), written.splitlines()) if old != new]
    assert [new for _, new in diff] == ["# fitted: a test", "  step_overhead_ms: 6.5", "    ada: 0.55"]
    loaded = yaml.safe_load(written)["calibration"]
    assert (loaded["step_overhead_ms"], loaded["generation_efficiency_scales"]["ada"]) == (6.5, 0.55)
    assert loaded["generation_interconnect_scales"]["ada"] == CATALOG.calibration.generation_interconnect_scales["ada"]
    assert loaded["measurements"] == yaml.safe_load(text)["calibration"]["measurements"]
