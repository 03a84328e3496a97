"""The chart's monitoring files, generated (`make crds`, which runs `python -m llmfleet.render.monitoring`)
from the names the operator declares:
Prometheus rules (recording rules for what the operator and the dashboard read, and
multi-window burn-rate alerts on the TTFT SLO, as in the SRE workbook's "Alerting on SLOs") and
a Grafana dashboard.

Serving pods' series carry `namespace` and `llmfleet_io_deployment` (the pod label
`llmfleet.io/deployment`, labelmapped); the operator's own gauges (state_metrics.py) carry the
same two, so the rules join them as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmfleet.api import crdgen

from llmfleet.render.layout import KV_CACHE_GAUGE, REQUEST_GAUGE, TENSORRT_LLM_MODEL, TTFT_HISTOGRAM
from llmfleet.state_metrics import (
    AUTOSCALER_DECISION,
    AUTOSCALER_DESIRED,
    AUTOSCALER_TARGET,
    CANARY_PHASE,
    CANARY_WEIGHT,
    DEPLOYMENT_SERIES_LABEL,
    INFO,
    READY,
    READY_REPLICAS,
    REPLICAS,
    SLO_TPOT,
    SLO_TTFT,
    SLO_TTFT_BUCKET,
)

RULES_PATH = Path("charts/llmfleet/files/prometheus-rules.yaml")
DASHBOARD_PATH = Path("charts/llmfleet/files/grafana-dashboard.json")
REGENERATE_COMMAND = "python -m llmfleet.render.monitoring"
BY_DEPLOYMENT = f"namespace, {DEPLOYMENT_SERIES_LABEL}"
ENGINE = f'model="{TENSORRT_LLM_MODEL}"'  # the ensemble would count every request twice
# p99 TTFT within the target: 1 % of first tokens may miss it.
ERROR_BUDGET = 0.01
# Windows of five minutes and more hold four scrapes up to a 75 s interval.
RECORDING_WINDOW = "5m"


@dataclass(frozen=True)
class BurnAlert:
    """Page or ticket when the budget burns `factor` times too fast over both windows."""

    name: str
    long_window: str
    short_window: str
    factor: float
    for_: str
    severity: str
    budget_share: str  # in words: how much of a 30-day budget that burns in the long window


BURN_ALERTS = (
    BurnAlert("LLMFleetTtftSloFastBurn", "1h", "5m", 14.4, "2m", "critical", "2 % of a 30-day budget in an hour"),
    BurnAlert("LLMFleetTtftSloSlowBurn", "6h", "30m", 6.0, "15m", "warning", "5 % of a 30-day budget in six hours"),
)
NOT_READY_FOR = "15m"


def ttft_p99_ms(window: str, selector: str = ENGINE, by: str = BY_DEPLOYMENT) -> str:
    return f"histogram_quantile(0.99, sum by ({by}, le) (rate({TTFT_HISTOGRAM}_bucket{{{selector}}}[{window}])))"


def ttft_requests_per_second(window: str, selector: str = ENGINE, by: str = BY_DEPLOYMENT) -> str:
    return f"sum by ({by}) (rate({TTFT_HISTOGRAM}_count{{{selector}}}[{window}]))"


def ttft_slo_error_ratio(window: str) -> str:
    """The share of first tokens over the target in the window: 1 - good / all, where good are
    those in the bucket the operator names (SLO_TTFT_BUCKET; max by: one series even while two
    operator pods report). The exporter may write a bound as 500 or 500.0: label_replace writes
    it as the operator does."""
    good = (f"sum by ({BY_DEPLOYMENT}) (label_replace(rate({TTFT_HISTOGRAM}_bucket{{{ENGINE}}}[{window}]), "
            f'"le", "$1", "le", "([0-9]+)(\\\\.0+)?") * on ({BY_DEPLOYMENT}, le) group_left () '
            f"max by ({BY_DEPLOYMENT}, le) ({SLO_TTFT_BUCKET.name}))")
    return f"1 - ({good} / {ttft_requests_per_second(window)})"


def recorded_error_ratio(window: str) -> str:
    return f"llmfleet_deployment:ttft_slo_errors:ratio_rate{window}"


RECORDING_RULES = {
    f"llmfleet_deployment:ttft_requests:rate{RECORDING_WINDOW}": ttft_requests_per_second(RECORDING_WINDOW),
    f"llmfleet_deployment:ttft_p99_ms:{RECORDING_WINDOW}": ttft_p99_ms(RECORDING_WINDOW),
    "llmfleet_deployment:waiting_requests:sum":
        f'sum by ({BY_DEPLOYMENT}) ({REQUEST_GAUGE}{{{ENGINE}, request_type="waiting"}})',
    "llmfleet_deployment:kv_cache_utilization:ratio":
        (f'sum by ({BY_DEPLOYMENT}) ({KV_CACHE_GAUGE}{{{ENGINE}, kv_cache_block_type="used"}}) / '
         f'sum by ({BY_DEPLOYMENT}) ({KV_CACHE_GAUGE}{{{ENGINE}, kv_cache_block_type="max"}})'),
}
SLO_WINDOWS = sorted({window for alert in BURN_ALERTS for window in (alert.long_window, alert.short_window)},
                     key=lambda window: (window[-1] == "h", int(window[:-1])))


def _burn_condition(alert: BurnAlert) -> str:
    threshold = f"({alert.factor:g} * {ERROR_BUDGET:g})"
    return (f"{recorded_error_ratio(alert.long_window)} > {threshold} and "
            f"{recorded_error_ratio(alert.short_window)} > {threshold}")


def prometheus_rules() -> dict:
    """The rule groups, in Prometheus' rule-file format (also a PrometheusRule's spec)."""
    who = f"{{{{ $labels.namespace }}}}/{{{{ $labels.{DEPLOYMENT_SERIES_LABEL} }}}}"
    alerts = [{
        "alert": alert.name, "expr": _burn_condition(alert), "for": alert.for_, "labels": {"severity": alert.severity},
        "annotations": {
            "summary": f"{who} burns its TTFT error budget {alert.factor:g}x too fast ({alert.budget_share})",
            "description": (f"{{{{ $value | humanizePercentage }}}} of first tokens over {alert.long_window} missed "
                            f"the p99 TTFT target (budget {ERROR_BUDGET:.0%}). `kubectl get llmdeployment -n "
                            f"{{{{ $labels.namespace }}}} -o yaml` shows the autoscaler's reason."),
        }} for alert in BURN_ALERTS]
    alerts.append({
        "alert": "LLMFleetDeploymentNotReady", "expr": f"{READY.name} == 0", "for": NOT_READY_FOR,
        "labels": {"severity": "warning"},
        "annotations": {"summary": f"{who} has not been Ready for {NOT_READY_FOR}",
                        "description": "`kubectl describe llmdeployment -n {{ $labels.namespace }}` says why "
                                       "(conditions Ready, Degraded, Planned)."}})
    return {"groups": [
        {"name": "llmfleet.recording",
         "rules": [{"record": name, "expr": expr} for name, expr in RECORDING_RULES.items()]},
        {"name": "llmfleet.slo",
         "rules": [*({"record": recorded_error_ratio(window), "expr": ttft_slo_error_ratio(window)}
                     for window in SLO_WINDOWS), *alerts]},
    ]}


# The dashboard's variables, as Grafana substitutes them.
DEPLOYMENT_SELECTOR = f'namespace="$namespace", {DEPLOYMENT_SERIES_LABEL}="$deployment"'
ENGINE_SELECTOR = f"{DEPLOYMENT_SELECTOR}, {ENGINE}"


def _panel(title: str, description: str, targets: dict[str, str], unit: str, position: tuple[int, int, int, int],
           kind: str = "timeseries") -> dict:
    x, y, width, height = position
    return {"type": kind, "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": x, "y": y, "w": width, "h": height},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + index), "expr": expr, "legendFormat": legend}
                        for index, (legend, expr) in enumerate(targets.items())]}


def grafana_dashboard() -> dict:
    """One LLMDeployment at a time (variables namespace and deployment)."""
    rate = "$__rate_interval"
    panels = [
        _panel("Plan", "The plan served (status.plan): GPU type, tensor-parallel size, quantisation, runtime.",
               {"{{revision}}: {{gpu_type}} TP{{tensor_parallel_size}} {{quantization}} ({{runtime}})":
                f"{INFO.name}{{{DEPLOYMENT_SELECTOR}}}"}, "none", (0, 0, 24, 4), kind="table"),
        _panel("Replicas", "Wanted and ready replicas, and what the autoscaler wants.",
               {"replicas": f"{REPLICAS.name}{{{DEPLOYMENT_SELECTOR}}}",
                "ready": f"{READY_REPLICAS.name}{{{DEPLOYMENT_SELECTOR}}}",
                "autoscaler wants": f"{AUTOSCALER_DESIRED.name}{{{DEPLOYMENT_SELECTOR}}}"}, "none", (0, 4, 12, 8)),
        _panel("p99 time to first token", "Over all replicas and revisions, against the SLO and the autoscaler's "
               "target. The pinned releases export no time-per-output-token series; its SLO is shown alone below.",
               {"p99 TTFT": ttft_p99_ms(rate, ENGINE_SELECTOR, "namespace"),
                "SLO": f"{SLO_TTFT.name}{{{DEPLOYMENT_SELECTOR}}}",
                "autoscaler target": f"{AUTOSCALER_TARGET.name}{{{DEPLOYMENT_SELECTOR}}}"}, "ms", (12, 4, 12, 8)),
        _panel("Requests per second", "Requests that got a first token, per replica.",
               {"{{pod}}": ttft_requests_per_second(rate, ENGINE_SELECTOR, "pod")}, "reqps", (0, 12, 12, 8)),
        _panel("Queue and KV cache", "Waiting requests and KV-cache blocks in use, where the release exports "
               "them (the engine runtime; the llmapi runtime's model exports neither).",
               {"waiting": f'sum({REQUEST_GAUGE}{{{ENGINE_SELECTOR}, request_type="waiting"}})',
                "KV cache used": (f'sum({KV_CACHE_GAUGE}{{{ENGINE_SELECTOR}, kv_cache_block_type="used"}}) / '
                                  f'sum({KV_CACHE_GAUGE}{{{ENGINE_SELECTOR}, kv_cache_block_type="max"}})')},
               "short", (12, 12, 12, 8)),
        _panel("Canary", "The canary's share of the serving replicas, and its phase.",
               {"weight %": f"{CANARY_WEIGHT.name}{{{DEPLOYMENT_SELECTOR}}}",
                "{{phase}}": f"{CANARY_PHASE.name}{{{DEPLOYMENT_SELECTOR}}} == 1"}, "percent", (0, 20, 12, 8)),
        _panel("Autoscaler decisions", "The last decision, as it changed (status.autoscaler.lastDecision).",
               {"{{decision}}": f"{AUTOSCALER_DECISION.name}{{{DEPLOYMENT_SELECTOR}}} == 1"}, "none", (12, 20, 12, 8),
               kind="state-timeline"),
        _panel("TTFT SLO error budget burn", f"The share of first tokens over the target, over the alerts' windows, "
               f"as a multiple of the {ERROR_BUDGET:.0%} budget. TPOT SLO: the value below.",
               {**{f"burn over {window}": f"{recorded_error_ratio(window)}{{{DEPLOYMENT_SELECTOR}}} / {ERROR_BUDGET:g}"
                   for window in SLO_WINDOWS},
                "TPOT SLO (ms)": f"{SLO_TPOT.name}{{{DEPLOYMENT_SELECTOR}}}"}, "none", (0, 28, 24, 8)),
    ]
    variables = [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {"name": "namespace", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": f"label_values({INFO.name}, namespace)", "refresh": 2},
        {"name": "deployment", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "query": f'label_values({INFO.name}{{namespace="$namespace"}}, {DEPLOYMENT_SERIES_LABEL})', "refresh": 2},
    ]
    return {"title": "llmfleet: LLMDeployment", "uid": "llmfleet-deployment", "tags": ["llmfleet"],
            "schemaVersion": 39, "editable": True, "time": {"from": "now-3h", "to": "now"}, "refresh": "30s",
            "templating": {"list": variables}, "panels": panels}


def expressions() -> dict[str, str]:
    """Every PromQL expression in the rules and the dashboard, by where it is (for tests)."""
    found = {}
    for group in prometheus_rules()["groups"]:
        for rule in group["rules"]:
            found[f"rule {rule.get('record') or rule.get('alert')}"] = rule["expr"]
    for panel in grafana_dashboard()["panels"]:
        for target in panel["targets"]:
            found[f"panel {panel['title']} / {target['legendFormat']}"] = target["expr"]
    return found


def generated_files() -> dict[Path, str]:
    header = f"# Generated by `{REGENERATE_COMMAND}` from operator/llmfleet/render/monitoring.py. Do not edit.\n"
    return {RULES_PATH: header + yaml.safe_dump(prometheus_rules(), sort_keys=False, width=1000),
            DASHBOARD_PATH: json.dumps(grafana_dashboard(), indent=2) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=REGENERATE_COMMAND, description="Write the chart's Prometheus rules "
                                                                          "and Grafana dashboard.")
    parser.add_argument("--check", action="store_true", help="fail with a diff if a file is stale")
    parser.add_argument("--root", type=Path, default=crdgen.REPO_ROOT, help="repository root")
    args = parser.parse_args(argv)
    if args.check:
        stale = crdgen.stale_files(args.root, generated_files())
        sys.stdout.write("".join(stale.values()))
        if stale:
            print(f"stale generated files: {', '.join(map(str, stale))}; run `{REGENERATE_COMMAND}`", file=sys.stderr)
        return int(bool(stale))
    for path in crdgen.write_files(args.root, generated_files()):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
