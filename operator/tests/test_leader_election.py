"""Who may hold the operator's Lease: pure rules, at injected times (the API side is e2e)."""

from datetime import datetime, timedelta, timezone

import pytest

from llmfleet.k8s.leader import LeaseRecord, default_identity, may_take

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("holder, renewed_seconds_ago, may", [
    (None, 1, True),           # released on a clean stop
    ("", 1, True),
    ("me", 1, True),           # renewing its own
    ("other", 1, False),       # a live leader
    ("other", 14.9, False),
    ("other", 15, True),       # expired: the leader went a whole lease without renewing
    ("other", None, True),     # never renewed
])
def test_may_take(holder, renewed_seconds_ago, may):
    renewed = None if renewed_seconds_ago is None else T0 - timedelta(seconds=renewed_seconds_ago)
    assert may_take(LeaseRecord(holder, renewed, 15), "me", T0) is may


def test_identities_differ_per_process_on_one_host():
    assert default_identity() != default_identity()
