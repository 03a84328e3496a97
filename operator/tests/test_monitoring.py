"""The chart's Prometheus rules and Grafana dashboard, and the operator's own gauges they read:
checked and evaluated by Prometheus' own promtool (its rule engine on synthetic series), every
series name traced to the operator's exporter or the serving releases' records."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llmfleet.api import crdgen
from llmfleet.catalog.release_record import RUNTIME_RELEASES, load_release_record
from llmfleet.render import monitoring
from llmfleet.state_metrics import GAUGES, exposition
from llmfleet_dev.release_checks import check_metric

REPO_ROOT = Path(__file__).resolve().parents[2]
RULES = REPO_ROOT / monitoring.RULES_PATH
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian's prometheus package)")

BODY = {
    "metadata": {"namespace": "team-a", "name": "chat"},
    "spec": {"engine": {"runtime": "engine"}, "slo": {"ttftP99Ms": 550, "tpotP99Ms": 50}},
    "status": {"replicas": 3, "readyReplicas": 2, "currentRevision": "abc123",
               "plan": {"gpuType": "H100-SXM-80GB", "tensorParallelSize": 2, "quantization": "FP8"},
               "autoscaler": {"desiredReplicas": 3, "lastDecision": "ScaleUp", "inputs": {"targetTtftP99Ms": 330}},
               "canary": {"phase": "Progressing", "weightPercent": 34},
               "conditions": [{"type": "Ready", "status": "True"}]},
}


def _series(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_the_operator_exports_each_deployments_plan_slo_autoscaler_and_canary():
    series = _series(exposition([BODY, {"metadata": {"namespace": "team-b", "name": "idle"}}]))
    key = 'namespace="team-a",llmfleet_io_deployment="chat"'
    assert series[f'llmfleet_deployment_info{{{key},revision="abc123",gpu_type="H100-SXM-80GB",quantization="FP8",'
                  f'tensor_parallel_size="2",runtime="engine"}}'] == 1
    assert series[f"llmfleet_deployment_replicas{{{key}}}"] == 3
    assert series[f"llmfleet_deployment_ready_replicas{{{key}}}"] == 2
    assert series[f"llmfleet_deployment_slo_ttft_p99_ms{{{key}}}"] == 550
    # The SLO is a bound of the deployment's histogram (render.ttft_buckets): its bucket is le="550".
    assert series[f'llmfleet_deployment_slo_ttft_bucket{{{key},le="550"}}'] == 1
    assert series[f"llmfleet_deployment_autoscaler_target_ttft_p99_ms{{{key}}}"] == 330
    assert [decision for decision in ("ScaleUp", "ScaleDown", "Hold")
            if series[f'llmfleet_deployment_autoscaler_decision{{{key},decision="{decision}"}}'] == 1] == ["ScaleUp"]
    assert series[f"llmfleet_deployment_canary_weight_percent{{{key}}}"] == 34
    assert series[f'llmfleet_deployment_canary_phase{{{key},phase="Progressing"}}'] == 1
    assert series[f"llmfleet_deployment_ready{{{key}}}"] == 1
    # A deployment not yet passed has no plan, SLO or replicas to show: only its Ready and canary gauges.
    idle = {name for name in series if 'llmfleet_io_deployment="idle"' in name}
    assert idle == {'llmfleet_deployment_canary_weight_percent{namespace="team-b",llmfleet_io_deployment="idle"}',
                    'llmfleet_deployment_ready{namespace="team-b",llmfleet_io_deployment="idle"}'}


def test_label_values_are_escaped_and_every_gauge_is_declared_once():
    body = {**BODY, "status": {**BODY["status"], "currentRevision": 'a"b\\c'}}
    assert 'revision="a\\"b\\\\c"' in exposition([body])
    text = exposition([])
    assert [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")] == [g.name for g in GAUGES]
    assert len({g.name for g in GAUGES}) == len(GAUGES)


def _names(expr: str) -> set[str]:
    """Metric names an expression selects (not functions, keywords or label names)."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "", without_strings)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_matchers)
    text = re.sub(r"\b(by|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_ranges)
    words = [match.group() for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text)
             if not text[match.end():].lstrip().startswith("(")]  # a function call
    return {word for word in words if word not in {"and", "or", "unless", "bool"}}


def test_every_series_the_rules_and_dashboard_read_is_exported_by_the_operator_or_the_engine_release():
    engine = load_release_record(RUNTIME_RELEASES["engine"])
    recorded = {rule["record"] for group in monitoring.prometheus_rules()["groups"] for rule in group["rules"]
                if "record" in rule}
    operator = {gauge.name for gauge in GAUGES}
    read = {name: where for where, expr in monitoring.expressions().items() for name in _names(expr)}
    assert read, "no series found: the name extraction is broken"
    unknown = {name: where for name, where in read.items()
               if name not in recorded | operator and check_metric(engine, name)}
    assert unknown == {}
    # The rules read the serving pods and the operator's SLO bucket; the dashboard its other gauges.
    assert {"nv_inference_first_response_histogram_ms_bucket", "llmfleet_deployment_slo_ttft_bucket"} <= set(read)


def test_the_generated_files_are_current_and_a_stale_one_is_found(tmp_path, capsys):
    stale = crdgen.stale_files(REPO_ROOT, monitoring.generated_files())
    assert not stale, f"run `{monitoring.REGENERATE_COMMAND}`:\n" + "".join(stale.values())
    assert monitoring.main(["--root", str(tmp_path)]) == 0
    (tmp_path / monitoring.RULES_PATH).write_text("groups: []\n")
    assert monitoring.main(["--check", "--root", str(tmp_path)]) == 1
    assert monitoring.REGENERATE_COMMAND in capsys.readouterr().err


def test_the_generated_dashboard_is_grafana_json_whose_panels_all_query():
    dashboard = json.loads((REPO_ROOT / monitoring.DASHBOARD_PATH).read_text())
    assert dashboard == monitoring.grafana_dashboard()
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "namespace", "deployment"]
    assert all(panel["targets"] and all(t["expr"] for t in panel["targets"]) for panel in dashboard["panels"])


@needs_promtool
def test_promtool_accepts_the_generated_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert yaml.safe_load(RULES.read_text()) == monitoring.prometheus_rules()


def _series_line(name: str, labels: dict[str, str], values: str) -> dict:
    return {"series": name + "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}",
            "values": values}


def _deployment_input(name: str, good_per_minute: int, all_per_minute: int, minutes: int) -> list[dict]:
    """A deployment's TTFT histogram at its SLO bucket (written 500.0, as an exporter may), its
    count, and the operator's gauges: Ready, and the SLO bucket at 500."""
    pod = {"namespace": "team-a", "llmfleet_io_deployment": name, "model": "tensorrt_llm", "pod": f"{name}-1"}
    key = {"namespace": "team-a", "llmfleet_io_deployment": name}
    return [
        _series_line("nv_inference_first_response_histogram_ms_bucket", {**pod, "le": "500.0"},
                     f"0+{good_per_minute}x{minutes}"),
        _series_line("nv_inference_first_response_histogram_ms_count", pod, f"0+{all_per_minute}x{minutes}"),
        _series_line("llmfleet_deployment_slo_ttft_bucket", {**key, "le": "500"}, f"1x{minutes}"),
        _series_line("llmfleet_deployment_ready", key, f"{int(good_per_minute == all_per_minute)}x{minutes}"),
    ]


def _alert(name: str, deployment: str, value: str = "") -> dict:
    """The alert as it should fire, its annotations expanded as Prometheus' templates do."""
    rule = next(rule for group in monitoring.prometheus_rules()["groups"] for rule in group["rules"]
                if rule.get("alert") == name)
    labels = {"namespace": "team-a", "llmfleet_io_deployment": deployment}

    def expanded(text: str) -> str:
        text = text.replace("{{ $value | humanizePercentage }}", value)
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda match: labels[match.group(1)], text)
    return {"exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": {key: expanded(text) for key, text in rule["annotations"].items()}}


@needs_promtool
def test_promtool_fires_the_burn_alerts_for_a_breaching_deployment_only(tmp_path):
    """Prometheus' rule engine on synthetic series: "breaching" misses the target with half its
    first tokens, "healthy" with none. The fast burn fires after its 2 minutes; the slow burn
    after its 15; neither for the healthy one, whose le written 500.0 still matched 500."""
    minutes = 60
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [*_deployment_input("breaching", 60, 120, minutes),
                             *_deployment_input("healthy", 120, 120, minutes)],
            "promql_expr_test": [{
                "expr": 'llmfleet_deployment:ttft_slo_errors:ratio_rate5m',
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": 'llmfleet_deployment:ttft_slo_errors:ratio_rate5m{llmfleet_io_deployment="breaching",'
                               'namespace="team-a"}', "value": 0.5},
                    {"labels": 'llmfleet_deployment:ttft_slo_errors:ratio_rate5m{llmfleet_io_deployment="healthy",'
                               'namespace="team-a"}', "value": 0}]}],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "LLMFleetTtftSloFastBurn", "exp_alerts": []},
                {"eval_time": "10m", "alertname": "LLMFleetTtftSloFastBurn",
                 "exp_alerts": [_alert("LLMFleetTtftSloFastBurn", "breaching", "50%")]},
                {"eval_time": "10m", "alertname": "LLMFleetTtftSloSlowBurn", "exp_alerts": []},
                {"eval_time": "40m", "alertname": "LLMFleetTtftSloSlowBurn",
                 "exp_alerts": [_alert("LLMFleetTtftSloSlowBurn", "breaching", "50%")]},
                {"eval_time": "40m", "alertname": "LLMFleetDeploymentNotReady",
                 "exp_alerts": [_alert("LLMFleetDeploymentNotReady", "breaching")]},
            ],
        }],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
