"""The sandbox's fault knobs: recorded per (namespace, deployment, revision), handed to a matching pod's
containers in their environment, and applied by the engine stand-in to its step costs."""

from __future__ import annotations

from dataclasses import replace

from llmfleet_sandbox import faults
from llmfleet.simulation.profile import EngineProfile
from llmfleet_sandbox.emulator.profile import with_faults

PROFILE = EngineProfile(gpu_type="H100-SXM-80GB", tensor_parallel_size=1, quantization="FP8", kv_cache_dtype="FP8",
                        prefill_ms_per_token=0.05, prefill_fixed_ms=4.0, decode_step_base_ms=7.0,
                        decode_step_ms_per_sequence=0.1, decode_step_ms_per_kv_token=0.001, kv_block_tokens=32,
                        kv_blocks_total=1000, max_batch_size=16, max_num_tokens=2048)


POD_LABELS = {"llmfleet.io/deployment": "slow", "llmfleet.io/revision": "abc"}


def test_a_fault_reaches_only_the_pods_of_its_deployments_revision(tmp_path):
    faults.set_fault(tmp_path, faults.Fault("rollout", "slow", "abc", 3.0))
    assert faults.injected(faults.environment(tmp_path, "rollout", POD_LABELS)) == \
        faults.Fault("", "", "", 3.0)
    assert faults.environment(tmp_path, "rollout", {**POD_LABELS, "llmfleet.io/revision": "other"}) == {}
    assert faults.environment(tmp_path, "elsewhere", POD_LABELS) == {}
    # Another deployment of the same model and plan has the same revision hash: not its fault.
    assert faults.environment(tmp_path, "rollout", {**POD_LABELS, "llmfleet.io/deployment": "good"}) == {}
    faults.set_fault(tmp_path, faults.Fault("rollout", "slow", "abc", 1.0))
    assert faults.load(tmp_path) == []


def test_a_slowdown_multiplies_every_step_cost_and_nothing_else():
    slow = with_faults(PROFILE, {faults.SLOWDOWN_VARIABLE: "2"})
    assert slow == replace(PROFILE, prefill_ms_per_token=0.1, prefill_fixed_ms=8.0, decode_step_base_ms=14.0,
                           decode_step_ms_per_sequence=0.2, decode_step_ms_per_kv_token=0.002)
    assert with_faults(PROFILE, {}) is PROFILE


def test_drift_and_errors_reach_the_container_with_the_slowdown(tmp_path):
    faults.set_fault(tmp_path, faults.Fault("rollout", "slow", "abc", drift=0.05, error_percent=20))
    environment = faults.environment(tmp_path, "rollout", POD_LABELS)
    assert faults.injected(environment) == faults.Fault("", "", "", 1.0, 0.05, 20.0)
    assert with_faults(PROFILE, environment) is PROFILE


def test_out_of_range_faults_name_their_flag():
    assert faults.Fault("ns", "slow", "abc", slowdown=0, drift=2, error_percent=-1).problems() == [
        "--slowdown must be greater than 0, got 0", "--drift is a per-token probability within [0, 1], got 2",
        "--error-percent must be within [0, 100], got -1"]


def test_a_load_failure_reaches_the_container_and_alone_is_a_fault(tmp_path):
    unloadable = faults.Fault("rollout", "slow", "abc", fail_load=True)
    assert not unloadable.harmless and unloadable.describe() == "failing to load"
    faults.set_fault(tmp_path, unloadable)
    environment = faults.environment(tmp_path, "rollout", POD_LABELS)
    assert faults.injected(environment).fail_load
    faults.set_fault(tmp_path, faults.Fault("rollout", "slow", "abc", 3.0))
    assert not faults.injected(faults.environment(tmp_path, "rollout", POD_LABELS)).fail_load
