"""Two operator replicas: one acts while it holds the Lease, the other stands by and takes
over within 30 s of the leader's death (SIGKILL: no release), with no duplicate children and
no decision lost from the gap. A clean stop hands the Lease over at once."""

from __future__ import annotations

import signal
import time

import pytest

from conftest import small_batch_70b, wait_for
from llmfleet.render.identity import kubectl_kinds
from operator_fixtures import OperatorProcess

# It kills the session's leader and runs a second replica beside it.
pytestmark = pytest.mark.disrupts_operator
NAMESPACE = "leader-election"
TAKEOVER_LIMIT_S = 30


def _idle_deployment(name: str) -> dict:
    # No replicas: the children (and their build) are the evidence, no pod needs a CPU.
    return small_batch_70b(name, NAMESPACE, 500, plan={"replicas": 0})


def _planned_with_one_child_per_kind(sandbox, name: str):
    obj = sandbox.kubectl_json("get", "llmdeployment", name, "-n", NAMESPACE)
    planned = next((c for c in (obj.get("status") or {}).get("conditions") or []
                    if c["type"] == "Planned" and c["status"] == "True"), None)
    children = sandbox.kubectl_json("get", kubectl_kinds(), "-n", NAMESPACE, "-l",
                                    f"llmfleet.io/deployment={name}")["items"]
    return sorted(child["kind"] for child in children) if planned else None


def test_a_standby_takes_over_within_30_s_of_the_leaders_death(sandbox, operator, tmp_path):
    sandbox.kubectl("create", "namespace", NAMESPACE)
    standby = OperatorProcess(sandbox, operator.kubeconfig, tmp_path / "standby.log", identity="e2e-standby",
                              extra_args=operator.extra_args)
    standby.start()
    try:
        wait_for(lambda: f"standing by while {operator.identity} holds the lease" in standby.log_since(0),
                 30, "the second replica to stand by")
        sandbox.apply([_idle_deployment("before")], namespace=NAMESPACE)
        kinds = wait_for(lambda: _planned_with_one_child_per_kind(sandbox, "before"), 60,
                         f"the leader to reconcile\n{operator.log_tail()}")
        assert "Handler '" not in standby.log_since(0), "the standby ran a handler while not leading"

        operator.stop(signal.SIGKILL)
        killed_s = time.monotonic()
        # A decision made while nobody leads: the new leader must not lose it.
        sandbox.apply([_idle_deployment("after")], namespace=NAMESPACE)
        wait_for(lambda: "e2e-standby holds the lease" in standby.log_since(0), TAKEOVER_LIMIT_S + 5,
                 f"the standby to take the lease\n{standby.log_since(0)[-2000:]}")
        takeover_s = time.monotonic() - killed_s
        print(f"standby took over {takeover_s:.1f} s after the leader was killed")
        assert takeover_s < TAKEOVER_LIMIT_S
        assert wait_for(lambda: _planned_with_one_child_per_kind(sandbox, "after"), 60,
                        f"the new leader to reconcile\n{standby.log_since(0)[-2000:]}") == kinds
        assert _planned_with_one_child_per_kind(sandbox, "before") == kinds  # nothing duplicated

        # The old leader comes back as a standby; a clean stop of the new one hands over at once.
        offset = operator.log_size()
        operator.start()
        wait_for(lambda: "standing by while e2e-standby holds the lease" in operator.log_since(offset), 30,
                 "the restarted replica to stand by")
        stopped_s = time.monotonic()
        standby.stop()
        wait_for(lambda: f"{operator.identity} holds the lease" in operator.log_since(offset), 15,
                 "the lease to be handed over on a clean stop")
        assert "released the lease" in standby.log_since(0)
        print(f"handed over {time.monotonic() - stopped_s:.1f} s after a clean stop")
    finally:
        standby.stop(signal.SIGKILL)
        if operator.process is None or operator.process.poll() is not None:
            operator.start()
        sandbox.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
