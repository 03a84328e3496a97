"""benchmarks/data/planner_load_accuracy.yaml (issue 30's public latency-under-load rows) is well
formed: an engine the catalog can build, every row sourced, positive and in the fit or the check set,
both sets present. The estimates are benchmarks/bench_planner_load_accuracy.py's report, not asserted
here (the light-load fit row is, in test_planner_latency.py: the step constants are fitted to it)."""

from pathlib import Path

import yaml

from llmfleet.catalog import load_catalog

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "planner_load_accuracy.yaml"
DOCUMENT = yaml.safe_load(DATA.read_text())
NUMBERS = ("input_tokens", "output_tokens", "concurrency", "ttft_mean_ms", "itl_mean_ms", "output_tokens_per_sec")


def test_the_engine_is_named_in_the_catalog():
    catalog = load_catalog()
    engine = DOCUMENT["engine"]
    catalog.model(engine["model"])
    catalog.gpu(engine["gpu"])
    catalog.quantization(engine["quantization"])
    catalog.kv_cache_dtype(engine["kv_cache_dtype"])
    assert engine["tensor_parallel_size"] >= 1


def test_every_row_is_sourced_positive_and_in_one_set():
    rows = DOCUMENT["rows"]
    for row in rows:
        assert row["source"], row
        assert all(row[name] > 0 for name in NUMBERS), row
    assert {row["set"] for row in rows} == {"fit", "check"}
