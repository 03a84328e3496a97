"""What the control plane's network and the operator's own death do to it, injected as they
happen on a real cluster. Each scenario states its expected outcome before it runs:

- kube-apiserver unreachable for 90 s under load (SIGKILLed, started again 90 s later): the
  serving replicas answer every request through the Service throughout; the leader, unable to
  renew its Lease, exits 10 s after its last renewal (docs/operator.md) and comes back as a
  standby that waits for the apiserver instead of failing again; a change made right after the
  apiserver returns is carried out within 90 s; the status (revision, Ready) is kept.
- a watch of LLMDeployments held open and silent by a proxy (no event, no close): a change made
  meanwhile is carried out within the operator's watch inactivity timeout (45 s) plus a pass,
  through a new watch.
- a watch of LLMDeployments that resumes after its history is gone, answered 410 Gone in the
  stream as the apiserver answers it: the operator lists again and carries out a change it
  missed.
- the operator SIGKILLed while its first status write of a new LLMDeployment, made after the
  pass created the children, is held in the proxy (and then dropped): the restarted operator
  duplicates no child (each the same object, same uid), writes the status and reaches Ready,
  logging no failure.

The proxy is `llmfleet_sandbox.apiproxy`, between the operator and the sandbox's apiserver.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from conftest import OPERATOR_FAILURE, service_target, small_batch_70b, stop_load, temporary_namespace, wait_for, wait_until_ready
from llmfleet.handlers import WATCH_INACTIVITY_TIMEOUT_S
from llmfleet.render.identity import kubectl_kinds
from llmfleet_sandbox import certs
from llmfleet_sandbox.apiproxy import Control

pytestmark = pytest.mark.long_running
NAMESPACE = "control-plane-faults"
RESOURCE = "llmdeployments"
APISERVER_DOWN_S = 90
# The leader exits once it has not renewed for 10 s; it renews every 2 s (docs/operator.md).
LEASE_EXIT_EARLIEST_S, LEASE_EXIT_LATEST_S = 6, 30
# A change reaches the Deployment within one watch inactivity timeout and a pass.
SILENT_WATCH_BOUND_S = WATCH_INACTIVITY_TIMEOUT_S + 30
# After a 410 the relist is immediate: a pass and the apiserver's latency on a shared machine.
AFTER_GONE_BOUND_S = 30
CHANGE_BOUND_S = 90


@pytest.fixture(scope="module")
def namespace(sandbox, operator):
    with temporary_namespace(sandbox, NAMESPACE):
        yield NAMESPACE


def _deployment_replicas(sandbox, name: str) -> list[int]:
    deployments = sandbox.kubectl_json("get", "deployments", "-n", NAMESPACE, "-l",
                                       f"llmfleet.io/deployment={name}")["items"]
    return [d["spec"]["replicas"] for d in deployments]


def _scale(sandbox, name: str, replicas: int) -> float:
    sandbox.kubectl("scale", "llmdeployment", name, "-n", NAMESPACE, f"--replicas={replicas}")
    return time.monotonic()


def _carried_out_within(sandbox, name: str, replicas: int, since_s: float, bound_s: float, what: str) -> float:
    """Seconds from `since_s` until the operator scaled the serving Deployment to `replicas`."""
    wait_for(lambda: replicas in _deployment_replicas(sandbox, name), bound_s - (time.monotonic() - since_s),
             f"the operator to scale {name} to {replicas} {what}", interval=0.5)
    took_s = time.monotonic() - since_s
    print(f"{what}: carried out {took_s:.1f} s after the change")
    return took_s


def _children(sandbox, name: str) -> dict[tuple[str, str], str]:
    items = sandbox.kubectl_json("get", kubectl_kinds(), "-n", NAMESPACE, "-l",
                                 f"llmfleet.io/deployment={name}")["items"]
    return {(child["kind"], child["metadata"]["name"]): child["metadata"]["uid"] for child in items}


def _load(sandbox, name: str, output: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "llmfleet", "load", "--target", service_target(sandbox, name, NAMESPACE),
         "--schedule", "constant:1", "--duration-s", "900", "--input-tokens", "fixed:64",
         "--output-tokens", "fixed:8", "--output-dir", str(output), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# Runs first, on the operator's direct connection: an apiserver that is not there refuses it.
@pytest.mark.disrupts_operator
def test_an_apiserver_gone_90_s_loses_no_request_status_or_change_and_the_leader_exits_on_its_lease(
        sandbox, operator, namespace, tmp_path):
    sandbox.apply([small_batch_70b("enduring", NAMESPACE, 1000, plan={"replicas": 1})], namespace=NAMESPACE)
    before = wait_until_ready(sandbox, "enduring", NAMESPACE)["status"]
    load = _load(sandbox, "enduring", tmp_path)
    restarts, offset = operator.restarts, operator.log_size()
    try:
        time.sleep(5)  # requests flowing before the outage
        sandbox.stop_component("kube-apiserver", signal.SIGKILL)
        stopped_s = time.monotonic()
        try:
            exited_after_s = wait_for(lambda: operator.restarts > restarts and time.monotonic() - stopped_s,
                                      LEASE_EXIT_LATEST_S, "the leader to exit on its unrenewed Lease", interval=0.2)
            remaining_s = APISERVER_DOWN_S - (time.monotonic() - stopped_s)
            time.sleep(max(0.0, remaining_s))
        finally:
            sandbox.llmfleet("up")  # starts only what stopped; every later test needs it
        print(f"the leader exited {exited_after_s:.1f} s after the apiserver went")
        logged = operator.log_since(offset)
        assert "lost the lease (not renewed for 10 s); exiting" in logged, operator.log_tail()
        assert LEASE_EXIT_EARLIEST_S <= exited_after_s <= LEASE_EXIT_LATEST_S
        # Restarted, it waited for the apiserver as a standby: no crash loop while it was gone.
        assert operator.restarts == restarts + 1, operator.log_tail()

        changed_s = _scale(sandbox, "enduring", 2)
        _carried_out_within(sandbox, "enduring", 2, changed_s, CHANGE_BOUND_S, "after a 90 s apiserver outage")
        after = sandbox.kubectl_json("get", "llmdeployment", "enduring", "-n", NAMESPACE)["status"]
        assert after["currentRevision"] == before["currentRevision"]
        wait_until_ready(sandbox, "enduring", NAMESPACE)
    finally:
        stdout, stderr = stop_load(load)
    assert load.returncode == 0, stderr + stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["truncated"] == 0, summary
    print(f"{summary.get('requests', summary)} requests through the outage")
    sandbox.kubectl("delete", "llmdeployment", "enduring", "-n", NAMESPACE)


@pytest.fixture(scope="module")
def proxy(sandbox, tmp_path_factory):
    """The fault proxy in front of the sandbox's apiserver, TLS from the sandbox's CA."""
    directory = tmp_path_factory.mktemp("apiproxy")
    pki = sandbox.state_dir / "pki"
    certificate, key = certs.issue_serving_certificate(pki, directory / "serving", "apiserver-fault-proxy",
                                                       ["127.0.0.1"], [])
    admin = yaml.safe_load(Path(sandbox.env["KUBECONFIG"]).read_text())
    ready = directory / "ready.json"
    log = open(directory / "apiproxy.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "llmfleet_sandbox.apiproxy", "--upstream", admin["clusters"][0]["cluster"]["server"],
         "--ca-file", str(pki / "ca.crt"), "--tls-cert-file", str(certificate), "--tls-private-key-file", str(key),
         "--ready-file", str(ready)], env=sandbox.env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        wait_for(ready.exists, 30, f"the fault proxy to listen\n{(directory / 'apiproxy.log').read_text()}")
        yield Control.of(ready)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def proxied_operator(operator, proxy, namespace):
    """The session's operator restarted with its connection through the proxy (its log, its
    supervisor, its identity: it takes its Lease back at once); direct again afterwards."""
    direct = operator.kubeconfig
    through = direct.with_name("kubeconfig-through-proxy")
    config = yaml.safe_load(direct.read_text())
    config["clusters"][0]["cluster"]["server"] = proxy.server
    through.write_text(yaml.safe_dump(config))
    operator.stop()
    operator.kubeconfig = through
    operator.start()
    try:
        yield operator
    finally:
        proxy.clear()
        operator.stop()
        operator.kubeconfig = direct
        operator.start()


@pytest.fixture(scope="module")
def steady(sandbox, proxied_operator) -> str:
    """One replica serving; the watch scenarios scale it to a count only a change can ask for."""
    sandbox.apply([small_batch_70b("steady", NAMESPACE, 1000, plan={"replicas": 1})], namespace=NAMESPACE)
    wait_until_ready(sandbox, "steady", NAMESPACE, timeout=240)
    yield "steady"
    sandbox.kubectl("delete", "llmdeployment", "steady", "-n", NAMESPACE)


def _settled_count(sandbox, name: str) -> int:
    """The serving Deployment's replicas once the deployment is Ready and its watch streams open."""
    wait_until_ready(sandbox, name, NAMESPACE)
    (replicas,) = _deployment_replicas(sandbox, name)
    return replicas


def test_a_change_made_while_the_watch_is_silent_is_carried_out_within_the_inactivity_timeout(
        sandbox, proxied_operator, proxy, steady):
    wanted = 2 if _settled_count(sandbox, steady) == 1 else 1
    watches_before = proxy.state()["counts"].get(f"watches {RESOURCE}", 0)

    assert proxy.silence(RESOURCE) >= 1, proxy.state()  # the streams that delivered its create
    changed_s = _scale(sandbox, steady, wanted)
    _carried_out_within(sandbox, steady, wanted, changed_s, SILENT_WATCH_BOUND_S, "through a silent watch")
    state = proxy.state()
    assert state["counts"][f"watches {RESOURCE}"] > watches_before, f"carried out with no new watch: {state}"


def test_a_watch_answered_410_gone_is_followed_by_a_list_and_the_missed_change_is_carried_out(
        sandbox, proxied_operator, proxy, steady):
    wanted = 2 if _settled_count(sandbox, steady) == 1 else 1
    lists_before = proxy.state()["counts"].get(f"lists {RESOURCE}", 0)

    # The stream breaks with the change undelivered, and its history is gone when it resumes.
    assert proxy.silence(RESOURCE) >= 1, proxy.state()
    changed_s = _scale(sandbox, steady, wanted)
    assert proxy.expire(RESOURCE) >= 1
    _carried_out_within(sandbox, steady, wanted, changed_s, AFTER_GONE_BOUND_S, "after 410 Gone")
    counts = proxy.state()["counts"]
    assert counts.get(f"expired {RESOURCE}", 0) >= 1, counts  # a resumed watch was answered 410
    assert counts.get(f"lists {RESOURCE}", 0) > lists_before, counts  # and the operator listed again


@pytest.mark.disrupts_operator
def test_an_operator_killed_between_creating_children_and_writing_status_duplicates_nothing(
        sandbox, proxied_operator, proxy):
    proxy.hold("PATCH", RESOURCE, "interrupted", "status")
    sandbox.apply([small_batch_70b("interrupted", NAMESPACE, 1000, plan={"replicas": 1})], namespace=NAMESPACE)
    wait_for(lambda: proxy.state()["held_now"] == 1, 120,
             f"the first status write to be held\n{proxied_operator.log_tail()}", interval=0.2)
    created = _children(sandbox, "interrupted")
    unwritten = sandbox.kubectl_json("get", "llmdeployment", "interrupted", "-n", NAMESPACE).get("status")
    assert created and not unwritten, (created, unwritten)

    proxied_operator.stop(signal.SIGKILL)
    proxy.drop()  # the killed client's request dies in the proxy, never reaching the apiserver
    wait_for(lambda: proxy.state()["held_now"] == 0, 10, "the held status write to be dropped")
    offset = proxied_operator.log_size()
    proxied_operator.start()

    status = wait_until_ready(sandbox, "interrupted", NAMESPACE, timeout=240)["status"]
    assert status.get("currentRevision"), status
    now = _children(sandbox, "interrupted")
    assert {key: now.get(key) for key in created} == created, "a child created before the kill was replaced"
    kinds_before, kinds_now = Counter(kind for kind, _ in created), Counter(kind for kind, _ in now)
    assert all(kinds_now[kind] == count for kind, count in kinds_before.items()), (kinds_before, kinds_now)
    failures = [line for line in proxied_operator.log_since(offset).splitlines() if OPERATOR_FAILURE.search(line)]
    assert not failures, "\n".join(failures[:20])
    sandbox.kubectl("delete", "llmdeployment", "interrupted", "-n", NAMESPACE)
