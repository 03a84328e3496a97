"""The chart's RBAC is what the operator uses, no more and no less, as the apiserver saw it.

Both operators of an e2e session (the host one, with the chart's ServiceAccount token, and the
Helm-installed one of test_operator_in_cluster.py) run under the chart's ClusterRole, and each
worker's sandbox apiserver audits every request of a ServiceAccount. Once every other e2e test has
run (on this worker, and every other worker finished), each verb the ClusterRole grants must have been used on its resource, and RBAC must have refused
nothing: a grant without use fails here, and so does a grant missing."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import DESELECTED, other_workers_apiserver_logs
from llmfleet.render import RenderSettings
from operator_fixtures import (
    IN_CLUSTER_RELEASE,
    IN_CLUSTER_RELEASE_NAMESPACE,
    OPERATOR_NAMESPACE,
    REPO_ROOT,
    SERVICE_ACCOUNT,
    chart_rbac_manifests,
)

pytestmark = pytest.mark.after_other_e2e
OPERATOR_USERS = {f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}",
                  f"system:serviceaccount:{IN_CLUSTER_RELEASE_NAMESPACE}:{IN_CLUSTER_RELEASE}-operator"}

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)
RBAC_GROUP = "rbac.authorization.k8s.io"


def granted(sandbox) -> set[Grant]:
    """What the chart's ClusterRole and Role (the Lease, in the release namespace) allow the
    operator (not the endpoint pickers' or the rank launchers' ClusterRole, which it only binds)."""
    bound_only = {RenderSettings.endpoint_picker_cluster_role, RenderSettings.rank_launcher_cluster_role}
    roles = [doc for doc in yaml.safe_load_all(chart_rbac_manifests(sandbox))
             if doc and doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] not in bound_only]
    assert len(roles) == 2, [role["kind"] for role in roles]
    return {(group, resource, verb) for role in roles for rule in role["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def operator_requests(audit_logs: list[Path]) -> list[dict]:
    """The audit events of the operators' requests on API resources (not discovery paths)."""
    events = []
    for path in audit_logs:
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["user"]["username"] in OPERATOR_USERS and event.get("objectRef", {}).get("resource"):
                events.append(event)
    return events


# The apiserver authorizes from RBAC informers that fill after it starts: until they have synced
# it refuses what RBAC allows (kubernetes/kubernetes#121635). The fault tests restart it.
UNSYNCED_AFTER_START_S = 30


def apiserver_starts(log: Path, year: int) -> list[datetime.datetime]:
    """When the apiserver began serving, from its klog lines (`I1203 15:21:40.123456 ... Serving
    securely on`; klog writes UTC here and no year)."""
    starts = []
    for line in log.read_text(errors="replace").splitlines():
        if "Serving securely on" in line:
            stamp = datetime.datetime.strptime(f"{year}{line[1:5]} {line[6:21]}", "%Y%m%d %H:%M:%S.%f")
            starts.append(stamp.replace(tzinfo=datetime.timezone.utc))
    return starts


def received(event: dict) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def grants_used(event: dict) -> list[Grant]:
    """The grants a request needed: its verb, and create for a server-side apply (a PATCH) that
    created the object (answered 201), which the apiserver authorises as a create too."""
    ref = event["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    verbs = [event["verb"]]
    created = (event.get("responseStatus") or {}).get("code") == 201
    if event["verb"] == "patch" and created:
        verbs.append("create")
    grants = [(ref.get("apiGroup", ""), resource, verb) for verb in verbs]
    # Binding a role one does not hold is authorised by `bind` on it, inside the create: the
    # operator's one RoleBinding references the endpoint pickers' ClusterRole.
    if resource == "rolebindings" and event["verb"] == "create" and created:
        grants.append((RBAC_GROUP, "clusterroles", "bind"))
    return grants


def operator_requests_and_refusals(logs: Path) -> tuple[list[dict], list[str]]:
    """One apiserver's audited requests of the operators, and those RBAC refused unexpectedly.
    `helm uninstall` deletes the release's Role before its pod gets SIGTERM, so the in-cluster
    operator's last Lease read on the way out is refused: that one is expected. So are refusals
    just after an apiserver (re)start, before its RBAC informers synced."""
    events = operator_requests(sorted(logs.glob("kube-apiserver-audit*.log")))
    if not events:
        return [], []
    starts = apiserver_starts(logs / "kube-apiserver.log", received(events[0]).year)
    refused = [f"{event['verb']} {event['requestURI']}" for event in events
               if event.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid"
               and not (event["user"]["username"].startswith(f"system:serviceaccount:{IN_CLUSTER_RELEASE_NAMESPACE}:")
                        and event["objectRef"]["resource"] == "leases")
               and not any(0 <= (received(event) - start).total_seconds() < UNSYNCED_AFTER_START_S
                           for start in starts)]
    return events, refused


def test_the_operator_uses_every_verb_the_chart_grants_and_is_refused_none(sandbox, request):
    every_module = {path.name for path in (REPO_ROOT / "e2e").glob("test_*.py")}
    ran = {item.path.name for item in request.session.items}
    if ran != every_module or request.config.stash.get(DESELECTED, 0):
        pytest.skip("needs the traffic of the whole e2e suite: run it without selecting tests")

    # The suite's modules ran on several workers, each with its own sandbox: every apiserver's traffic counts.
    events, refused = [], []
    for logs in [sandbox.state_dir / "logs", *other_workers_apiserver_logs(request.config)]:
        seen, forbidden = operator_requests_and_refusals(logs)
        events += seen
        refused += forbidden
    assert events, "no request of the operator's ServiceAccount in the audit log"
    used = Counter(grant for event in events for grant in grants_used(event))
    grants = granted(sandbox)
    example = {grant: event["requestURI"] for event in events for grant in grants_used(event)}
    print("\n".join(f"{verb:7} {group or 'core'}/{resource}: {used[(group, resource, verb)]} requests, "
                    f"e.g. {example.get((group, resource, verb), '-')}"
                    for group, resource, verb in sorted(grants, key=lambda g: (g[0], g[1], g[2]))))

    assert not refused, f"RBAC refused the operator (grant these in the chart): {sorted(set(refused))}"
    unused = sorted(grants - set(used))
    assert not unused, (
        "the chart grants verbs the operator never used in the e2e suite; remove them from "
        f"charts/llmfleet/templates/rbac.yaml, or test the path that needs them: {unused}")
