"""LLMDeployment models: validation with field paths, round trips, conditions, purity."""

import ast
import copy
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from llmfleet.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    EngineSpec,
    InvalidSpecError,
    LLMDeployment,
    LLMDeploymentSpec,
    Quantization,
    find_condition,
    set_condition,
)

from llmfleet.api.conditions import derived_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
INVALID_EXAMPLES = sorted((EXAMPLES / "invalid").glob("*.yaml"))
API_PACKAGE = REPO_ROOT / "operator" / "llmfleet" / "api"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def expectations(path: Path) -> dict[str, str]:
    """The `# key: value` header of an invalid example (field, message, python-message...)."""
    header = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line.lstrip("# ").partition(": ")
        header[key] = value
    return header


def valid_manifest() -> dict:
    return load(EXAMPLES / "llama-8b.yaml")


def problems_of(manifest: dict) -> list[tuple[str, str]]:
    with pytest.raises(InvalidSpecError) as raised:
        LLMDeployment.from_manifest(manifest)
    return raised.value.problems


def test_example_loads_with_defaults_filled_in():
    deployment = LLMDeployment.from_manifest(valid_manifest())
    spec = deployment.spec
    assert spec.model.name.value == "llama-3.1-8b"
    assert spec.slo.ttft_p99_ms == 500 and spec.slo.tpot_p99_ms == 50
    assert spec.workload.input_tokens_mean == 1024 and spec.workload.output_tokens_mean == 256
    assert spec.workload.peak_requests_per_second == 4
    assert spec.engine.image is None and spec.engine.runtime.value == "llmapi"
    assert spec.engine.max_num_tokens == 8192  # not in the manifest: defaulted
    assert spec.autoscaling.scale_down_stabilization_seconds == 60


def test_round_trip_keeps_exactly_what_the_user_wrote():
    manifest = valid_manifest()
    deployment = LLMDeployment.from_manifest(manifest)
    assert deployment.to_manifest(include_defaults=False) == manifest


def test_round_trip_with_defaults_is_stable():
    deployment = LLMDeployment.from_manifest(valid_manifest())
    full = deployment.to_manifest()
    assert full["spec"]["engine"]["maxBatchSize"] == 256
    assert "status" not in full  # no nulls on the wire
    assert LLMDeployment.from_manifest(full) == deployment
    assert LLMDeployment.from_manifest(full).to_manifest() == full


def test_models_accept_snake_case_names_in_python():
    spec = LLMDeploymentSpec(
        model={"name": "mistral-7b"},
        slo={"ttft_p99_ms": 300, "tpot_p99_ms": 40},
        workload={
            "input_tokens_mean": 512,
            "input_tokens_p99": 1024,
            "output_tokens_mean": 128,
            "output_tokens_p99": 256,
            "peak_requests_per_second": 2.5,
        },
    )
    wire = spec.model_dump(mode="json", exclude_none=True)
    assert wire["slo"] == {"ttftP99Ms": 300, "tpotP99Ms": 40}
    assert wire["workload"]["peakRequestsPerSecond"] == 2.5


@pytest.mark.parametrize("path", INVALID_EXAMPLES, ids=lambda p: p.stem)
def test_invalid_example_is_rejected_naming_the_field(path):
    expected = expectations(path)
    problems = problems_of(load(path))
    message = expected.get("python-message", expected.get("message"))
    assert any(field == expected["field"] and message in msg for field, msg in problems), problems


def test_every_invalid_example_names_its_expectations():
    assert INVALID_EXAMPLES
    for path in INVALID_EXAMPLES:
        expected = expectations(path)
        assert "field" in expected, path
        assert "message" in expected or {"apiserver-message", "python-message"} <= set(expected)


def _mutated(mutate) -> dict:
    manifest = valid_manifest()
    mutate(manifest)
    return manifest


@pytest.mark.parametrize(
    ("mutate", "field", "message_part"),
    [
        (lambda m: m["spec"]["slo"].pop("ttftP99Ms"), "spec.slo.ttftP99Ms", "Field required"),
        (lambda m: m["spec"].pop("workload"), "spec.workload", "Field required"),
        (
            lambda m: m["spec"]["workload"].update(peakRequestsPerSecond=0),
            "spec.workload.peakRequestsPerSecond",
            "greater than 0",
        ),
        (
            lambda m: m["spec"]["workload"].update(prefixSharingFraction=1.5),
            "spec.workload.prefixSharingFraction",
            "less than or equal to 1",
        ),
        (
            lambda m: m["spec"]["resources"].update(allowedTensorParallelSizes=[2, 2]),
            "spec.resources.allowedTensorParallelSizes",
            "duplicates",
        ),
        (
            lambda m: m["spec"]["resources"].update(allowedTensorParallelSizes=[]),
            "spec.resources.allowedTensorParallelSizes",
            "at least 1 item",
        ),
        (lambda m: m["spec"]["slo"].update(ttftP99Msec=5), "spec.slo.ttftP99Msec", "Extra inputs"),
        (lambda m: m.update(apiVersion="llmfleet.io/v1"), "apiVersion", "llmfleet.io/v1alpha1"),
        (lambda m: m["spec"]["model"].update(name="gpt-5"), "spec.model.name", "llama-3.1-8b"),
        (
            lambda m: m["spec"]["model"]["secretRef"].update(name="Not_A_Name"),
            "spec.model.secretRef.name",
            "should match pattern",
        ),
        (
            lambda m: m["spec"]["engine"].update(maxInputLen=8192, maxSeqLen=8192),
            "spec.engine.maxSeqLen",
            "greater than maxInputLen",
        ),
        (
            lambda m: m["spec"]["autoscaling"].update(targetTtftP99Ms=900),
            "spec.autoscaling.targetTtftP99Ms",
            "must not exceed spec.slo.ttftP99Ms",
        ),
        (
            lambda m: m["spec"].update(plan={"kvCacheDtype": "FP8"})
            or m["spec"]["resources"].update(allowedKvCacheDtypes=["FP16"]),
            "spec.plan.kvCacheDtype",
            "allowedKvCacheDtypes",
        ),
        (
            lambda m: m["spec"]["model"].update(apiKey="x", hfToken="y"),
            "spec.model",
            "(found: apiKey, hfToken)",
        ),
        (
            lambda m: m["spec"]["model"].update(source="s3://key:secret@bucket/m"),
            "spec.model.source",
            "must not embed credentials",
        ),
    ],
    ids=[
        "missing-slo",
        "missing-workload",
        "zero-rate",
        "prefix-fraction-above-one",
        "duplicate-tp",
        "empty-allowed-list",
        "unknown-field",
        "wrong-api-version",
        "unknown-model-name",
        "bad-secret-name",
        "seq-len-not-above-input-len",
        "autoscaling-target-above-slo",
        "kv-dtype-override-not-allowed",
        "several-inline-credentials",
        "credentials-in-source-uri",
    ],
)
def test_bad_input_names_the_field(mutate, field, message_part):
    problems = problems_of(_mutated(mutate))
    assert any(f == field and message_part in msg for f, msg in problems), problems


def test_error_text_lists_every_problem_with_its_path():
    manifest = valid_manifest()
    manifest["spec"]["slo"]["ttftP99Ms"] = 0
    manifest["spec"]["autoscaling"].update(minReplicas=9, maxReplicas=3)
    with pytest.raises(InvalidSpecError) as raised:
        LLMDeployment.from_manifest(manifest)
    text = str(raised.value)
    assert "spec.slo.ttftP99Ms: Input should be greater than or equal to 1" in text
    assert "spec.autoscaling.minReplicas: spec.autoscaling.minReplicas must be" in text


def _architecture(**overrides) -> dict:
    architecture = {
        "numLayers": 32,
        "hiddenSize": 4096,
        "numAttentionHeads": 32,
        "numKvHeads": 8,
        "headDim": 128,
        "vocabSize": 32000,
        "intermediateSize": 14336,
        "parameterCountBillions": 46.7,
    }
    return {**architecture, **overrides}


def test_inline_mixture_of_experts_architecture():
    manifest = valid_manifest()
    manifest["spec"]["model"] = {
        "architecture": _architecture(numExperts=8, expertsPerToken=2),
        "source": "pvc://models/mixtral",
    }
    deployment = LLMDeployment.from_manifest(manifest)
    assert deployment.spec.model.name is None
    assert deployment.spec.model.architecture.num_experts == 8


@pytest.mark.parametrize(
    ("overrides", "field", "message_part"),
    [
        ({"numKvHeads": 5}, "spec.model.architecture.numKvHeads", "must divide"),
        ({"numExperts": 8}, "spec.model.architecture", "set both numExperts"),
        (
            {"numExperts": 2, "expertsPerToken": 4},
            "spec.model.architecture.expertsPerToken",
            "must not exceed numExperts",
        ),
    ],
)
def test_inconsistent_architecture_is_rejected(overrides, field, message_part):
    manifest = valid_manifest()
    manifest["spec"]["model"] = {"architecture": _architecture(**overrides)}
    problems = problems_of(manifest)
    assert any(f == field and message_part in msg for f, msg in problems), problems


def test_defaults_in_python_match_documented_engine_defaults():
    engine = EngineSpec()
    assert (engine.max_batch_size, engine.max_input_len, engine.max_seq_len) == (256, 4096, 8192)
    assert engine.revision == "1"


# --- conditions ---------------------------------------------------------------------------

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def test_set_condition_appends_a_new_type():
    conditions = set_condition(
        [], ConditionType.PLANNED, ConditionStatus.TRUE, "PlanFound", "H100x1 FP8", T0, 3
    )
    assert [
        (c.type, c.status, c.last_transition_time, c.observed_generation) for c in conditions
    ] == [("Planned", ConditionStatus.TRUE, T0, 3)]


def test_set_condition_keeps_transition_time_when_status_is_unchanged():
    first = set_condition([], ConditionType.READY, ConditionStatus.FALSE, "Building", "m", T0)
    later = T0 + timedelta(minutes=5)
    second = set_condition(
        first, ConditionType.READY, ConditionStatus.FALSE, "Starting", "m2", later, 2
    )
    assert second[0].last_transition_time == T0
    assert (second[0].reason, second[0].message, second[0].observed_generation) == (
        "Starting",
        "m2",
        2,
    )
    third = set_condition(second, ConditionType.READY, ConditionStatus.TRUE, "Serving", "ok", later)
    assert third[0].last_transition_time == later


def test_set_condition_does_not_modify_its_input_and_keeps_order():
    conditions = set_condition([], ConditionType.READY, ConditionStatus.FALSE, "A", "", T0)
    conditions = set_condition(conditions, ConditionType.PLANNED, ConditionStatus.TRUE, "B", "", T0)
    snapshot = copy.deepcopy(conditions)
    updated = set_condition(conditions, ConditionType.READY, ConditionStatus.TRUE, "C", "", T0)
    assert conditions == snapshot
    assert [c.type for c in updated] == ["Ready", "Planned"]
    assert find_condition(updated, ConditionType.READY).reason == "C"
    assert find_condition(updated, "Degraded") is None


def test_condition_times_are_utc_seconds_on_the_wire():
    local = datetime(2026, 1, 2, 5, 4, 5, 999, tzinfo=timezone(timedelta(hours=2)))
    (condition,) = set_condition([], "Ready", ConditionStatus.TRUE, "Serving", "", local)
    assert condition.model_dump(mode="json")["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    with pytest.raises(ValueError, match="timezone"):
        set_condition([], "Ready", ConditionStatus.TRUE, "Serving", "", datetime(2026, 1, 1))


def test_condition_reason_must_be_camel_case_identifier():
    with pytest.raises(ValueError):
        Condition(type="Ready", status="True", reason="not ok", message="", last_transition_time=T0)


def _conditions(*entries: tuple[str, str, str]) -> list[Condition]:
    return [Condition(type=kind, status=status, reason=reason, message=f"{kind} says {reason}",
                      last_transition_time=datetime(2026, 1, 1, tzinfo=timezone.utc))
            for kind, status, reason in entries]


@pytest.mark.parametrize("planned, available, expected", [
    (("True", "PlanFound"), ("True", "ReplicasReady"), ("True", "Serving", "WorkloadAvailable says ReplicasReady")),
    (("False", "CapacityShortfall"), ("True", "ReplicasReady"),
     ("True", "Serving", "WorkloadAvailable says ReplicasReady (Planned False: CapacityShortfall)")),
    (("False", "InvalidSpec"), ("True", "ReplicasReady"), ("False", "InvalidSpec", "Planned says InvalidSpec")),
    (("True", "PlanFound"), ("False", "Building"), ("False", "Building", "WorkloadAvailable says Building")),
    (("False", "CapacityShortfall"), ("False", "ReplicasNotReady"),
     ("False", "ReplicasNotReady", "WorkloadAvailable says ReplicasNotReady")),
])
def test_ready_is_derived_from_the_conditions_it_depends_on(planned, available, expected):
    conditions = _conditions(("Planned", *planned), ("WorkloadAvailable", *available))
    status, reason, message = derived_ready(conditions)
    assert (status.value, reason, message) == expected


def test_ready_is_not_derived_from_a_condition_not_yet_set():
    with pytest.raises(ValueError, match="WorkloadAvailable"):
        derived_ready(_conditions(("Planned", "True", "PlanFound")))


def test_condition_catalog_has_the_documented_types():
    assert {t.value for t in ConditionType} == {
        "Ready", "Planned", "WorkloadAvailable", "Progressing", "Degraded",
        "AutoscalingActive", "MetricsAvailable", "RequestsBalanced", "EngineBuilt",
    }  # fmt: skip


def test_status_round_trip_and_duplicate_condition_types_rejected():
    manifest = valid_manifest()
    conditions = set_condition([], ConditionType.READY, ConditionStatus.TRUE, "Serving", "", T0)
    manifest["status"] = {
        "observedGeneration": 1,
        "conditions": [c.model_dump(mode="json", exclude_none=True) for c in conditions],
        "plan": {
            "gpuType": "H100-SXM-80GB",
            "tensorParallelSize": 1,
            "pipelineParallelSize": 1,
            "quantization": "FP8",
            "kvCacheDtype": "FP8",
            "replicas": 2,
            "gpusTotal": 2,
            "summary": "H100x1 FP8",
            "predicted": {"ttftP99Ms": 310.5, "kvBytesPerToken": 65536},
            "rationale": ["fewest GPUs that meet TTFT and TPOT"],
            "rejected": [{"option": "L40Sx1 FP8", "reason": "TPOT 61 ms > 50 ms"}],
        },
        "replicas": 2,
        "readyReplicas": 2,
        "selector": "llmfleet.io/deployment=llama-8b",
        "ttftP99Ms": 287.0,
    }
    deployment = LLMDeployment.from_manifest(manifest)
    assert deployment.status.plan.quantization is Quantization.FP8
    assert deployment.to_manifest(include_defaults=False) == manifest
    manifest["status"]["conditions"] *= 2
    assert any("only once" in msg for _, msg in problems_of(manifest))


# --- layering -----------------------------------------------------------------------------

ALLOWED_THIRD_PARTY = {"pydantic", "pydantic_core"}
GENERATOR_ONLY = {"yaml"}  # crdgen writes YAML files; it is a build tool, not runtime API


def test_api_package_is_pure():
    for path in sorted(API_PACKAGE.rglob("*.py")):
        allowed = ALLOWED_THIRD_PARTY | (GENERATOR_ONLY if path.name == "crdgen.py" else set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert (
                    root in sys.stdlib_module_names or root in allowed or root == "llmfleet"
                ), f"{path.name} imports {root}"
                if root == "llmfleet":
                    module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    assert module.startswith("llmfleet.api"), f"{path.name} imports {module}"
