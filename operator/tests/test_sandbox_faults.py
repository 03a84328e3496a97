"""The sandbox's fault knobs: recorded per (namespace, deployment, revision), handed to a matching pod's
containers in their environment and in the live-fault file a running container reads again (the
engine stand-in applies them: tests/test_emulator_engine.py)."""

from __future__ import annotations

from llmfleet_sandbox import faults


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


def test_drift_and_errors_reach_the_container_with_the_slowdown(tmp_path):
    faults.set_fault(tmp_path, faults.Fault("rollout", "slow", "abc", drift=0.05, error_percent=20))
    environment = faults.environment(tmp_path, "rollout", POD_LABELS)
    assert faults.injected(environment) == faults.Fault("", "", "", 1.0, 0.05, 20.0)


def test_a_running_containers_fault_follows_its_live_file_read_at_most_once_a_poll(tmp_path):
    """As a GPU throttled or a noisy neighbour slows pods that already run: the node agent
    rewrites the pod's live fault, and the running engine reads it again."""
    faults.set_fault(tmp_path, faults.Fault("rollout", "slow", "abc", 3.0))
    live = tmp_path / "pod-fault"
    live.mkdir()
    now_s = [0.0]
    fault = faults.LiveFault({**faults.environment(tmp_path, "rollout", POD_LABELS),
                              faults.LIVE_FAULT_VARIABLE: str(live / faults.LIVE_FILE)}, clock=lambda: now_s[0])
    assert fault().slowdown == 3.0, "no live file yet: the fault it was started with"
    faults.write_live(live, faults.Fault("rollout", "slow", "abc", 8.0, error_percent=5))
    now_s[0] += faults.LIVE_POLL_SECONDS / 2
    assert fault().slowdown == 3.0, "read again only once a poll"
    now_s[0] += faults.LIVE_POLL_SECONDS / 2
    assert (fault().slowdown, fault().error_percent) == (8.0, 5.0)
    faults.write_live(live, None)  # the fault removed
    now_s[0] += faults.LIVE_POLL_SECONDS
    assert fault().harmless
    (live / faults.LIVE_FILE).unlink()
    now_s[0] += faults.LIVE_POLL_SECONDS
    assert fault().harmless, "an unreadable file leaves the last fault read"
    # Outside the sandbox's node agent (no live file named) the start's fault stands.
    assert faults.LiveFault(faults.environment(tmp_path, "rollout", POD_LABELS))().slowdown == 3.0


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
