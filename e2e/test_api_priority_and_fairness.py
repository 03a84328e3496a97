"""The sandbox's apiserver runs API Priority and Fairness, as every real one does: its priority
levels exist and it classifies and dispatches requests through them (the operator throttled by
it: test_operator_throttled.py)."""

from __future__ import annotations

import re


def test_apf_is_on_in_the_sandbox(sandbox):
    levels = sandbox.kubectl("get", "prioritylevelconfigurations", "-o", "name").split()
    assert {"prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/workload-low",
            "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/leader-election"} <= set(levels), levels
    assert re.search(r"^apiserver_flowcontrol_dispatched_requests_total\{", sandbox.kubectl("get", "--raw", "/metrics"),
                     flags=re.MULTILINE), "APF dispatched nothing: it is off"
