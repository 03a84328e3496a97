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


def merge_patched(stored: dict, patch: dict) -> dict:
    """`stored` after a JSON merge patch (RFC 7386), as the apiserver applies one: None removes,
    mappings merge, the rest replaces."""
    merged = dict(stored)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patched(merged[key], value)
        else:
            merged[key] = value
    return merged


def stored_after(stored: dict, outcome: Outcome) -> dict:
    """The status the apiserver keeps once the pass's patch is applied: the pass's own status."""
    kept = merge_patched(stored, outcome.status_patch)
    assert kept == outcome.status, "the patch does not turn the stored status into the decided one"
    return kept
