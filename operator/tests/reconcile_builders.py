"""One pure pass for the reconcile tests: `decide` on a context and observations built from a
body, its children and keyword observations."""

from __future__ import annotations

from datetime import datetime

from llmfleet.reconcile import Context, Fleet, Observations, OperatorSettings, Outcome, decide


def decide_pass(body: dict, children, settings: OperatorSettings, now: datetime, snapshot=None, *,
                cluster_gpus=None, fleet_speeds=None, observed=None, **observations) -> Outcome:
    """`observed` is the settled revision's traffic (Observations.workload); `cluster_gpus` and
    `fleet_speeds` what the operator's indexes would give."""
    return decide(Context.of(body, children, settings, now),
                  Observations(snapshot=snapshot, workload=observed, fleet=Fleet(cluster_gpus, fleet_speeds),
                               **observations))
