"""The sandbox's NetworkPolicy translation: what a pod admits under Kubernetes' semantics,
and the nftables ruleset written into its network namespace."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess

import pytest

from llmfleet_sandbox.networkpolicy import TABLE, Allow, PolicyError, ingress_allows, nft_script

NODE_IP = "10.244.0.1"


def namespace(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def pod(ns: str, name: str, ip: str | None, labels: dict, phase: str = "Running", ports: list | None = None) -> dict:
    return {"metadata": {"namespace": ns, "name": name, "uid": name, "labels": labels},
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "main", "ports": ports or []}]},
            "status": {"phase": phase, **({"podIP": ip} if ip else {})}}


SERVER = pod("serving", "server", "10.244.1.10", {"app": "server"},
             ports=[{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 8002},
                    {"name": "dns", "containerPort": 5353, "protocol": "UDP"}])
NAMESPACES = [namespace("serving", team="llm"), namespace("gateways", role="edge"), namespace("monitoring"),
              namespace("other")]
PODS = [SERVER,
        pod("serving", "gateway", "10.244.1.11", {"app": "gateway"}),
        pod("serving", "client", "10.244.1.12", {"app": "client"}),
        pod("gateways", "edge", "10.244.2.11", {"app": "gateway"}),
        pod("monitoring", "prometheus", "10.244.2.20", {"app": "prometheus"}),
        pod("other", "gateway", "10.244.2.12", {"app": "gateway"}),
        pod("serving", "finished", "10.244.1.13", {"app": "gateway"}, phase="Succeeded"),
        pod("serving", "pending", None, {"app": "gateway"})]
GATEWAY, CLIENT, EDGE, PROMETHEUS, OTHER_GATEWAY, FINISHED = (
    "10.244.1.11", "10.244.1.12", "10.244.2.11", "10.244.2.20", "10.244.2.12", "10.244.1.13")


def policy(ingress: list | None = None, selector: dict | None = None, types: list | None = None,
           ns: str = "serving", **spec) -> dict:
    return {"metadata": {"namespace": ns, "name": "p"},
            "spec": {"podSelector": {"matchLabels": {"app": "server"}} if selector is None else selector,
                     **({"ingress": ingress} if ingress is not None else {}),
                     **({"policyTypes": types} if types is not None else {}), **spec}}


def tcp(*ports) -> list[dict]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def admits(allows: tuple[Allow, ...] | None, source: str, protocol: str, port: int) -> bool:
    """What the rules mean for one connection (the nftables chain says the same, per rule)."""
    if allows is None:
        return True
    address = ipaddress.ip_address(source)
    for allow in allows:
        if allow.sources is not None and not any(
                address in ipaddress.ip_network(s.cidr)
                and not any(address in ipaddress.ip_network(e) for e in s.excepts) for s in allow.sources):
            continue
        if allow.ports is not None and not any(p.protocol == protocol and p.first <= port <= p.last
                                               for p in allow.ports):
            continue
        return True
    return False


def pod_selector(**labels: str) -> dict:
    return {"podSelector": {"matchLabels": labels}}


def namespace_selector(**labels: str) -> dict:
    return {"namespaceSelector": {"matchLabels": labels}}


# (case, policies, [(source, protocol, port, admitted)])
CASES = [
    ("no policy: not isolated", [], [(CLIENT, "tcp", 8000, True), (OTHER_GATEWAY, "udp", 9, True)]),
    ("a policy selecting other pods leaves it open",
     [policy([], selector={"matchLabels": {"app": "other"}})], [(CLIENT, "tcp", 8000, True)]),
    ("a policy of another namespace does not select it",
     [policy([], ns="other")], [(CLIENT, "tcp", 8000, True)]),
    ("an Egress-only policy does not isolate ingress",
     [policy([], types=["Egress"], egress=[])], [(CLIENT, "tcp", 8000, True)]),
    ("no ingress rules: isolated, nothing admitted", [policy([], types=["Ingress"])],
     [(GATEWAY, "tcp", 8000, False), (CLIENT, "tcp", 22, False)]),
    ("no policyTypes means Ingress even with egress rules alone", [policy(egress=[{}])],
     [(GATEWAY, "tcp", 8000, False)]),
    ("the empty selector selects every pod of the namespace", [policy([], selector={})],
     [(GATEWAY, "tcp", 8000, False)]),
    ("an empty from admits every source on its ports", [policy([{"ports": tcp(8000)}])],
     [(OTHER_GATEWAY, "tcp", 8000, True), ("192.0.2.7", "tcp", 8000, True), (GATEWAY, "tcp", 8001, False)]),
    ("an empty rule admits everything", [policy([{}])],
     [(OTHER_GATEWAY, "udp", 53, True), ("192.0.2.7", "tcp", 1, True)]),
    ("podSelector alone: pods of the policy's namespace",
     [policy([{"from": [pod_selector(app="gateway")], "ports": tcp(8000)}])],
     [(GATEWAY, "tcp", 8000, True), (EDGE, "tcp", 8000, False), (OTHER_GATEWAY, "tcp", 8000, False),
      (CLIENT, "tcp", 8000, False)]),
    ("namespaceSelector alone: every pod of the matching namespaces",
     [policy([{"from": [namespace_selector(role="edge")]}])],
     [(EDGE, "tcp", 8000, True), (EDGE, "udp", 5353, True), (GATEWAY, "tcp", 8000, False)]),
    ("both in one peer: matching pods of matching namespaces",
     [policy([{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "gateway"}}}]}])],
     [(GATEWAY, "tcp", 8000, True), (EDGE, "tcp", 8000, True), (OTHER_GATEWAY, "tcp", 8000, True),
      (CLIENT, "tcp", 8000, False), (PROMETHEUS, "tcp", 8000, False)]),
    ("both as two peers: either",
     [policy([{"from": [namespace_selector(role="edge"), pod_selector(app="client")]}])],
     [(EDGE, "tcp", 8000, True), (CLIENT, "tcp", 8000, True), (GATEWAY, "tcp", 8000, False)]),
    ("matchExpressions In, NotIn, Exists, DoesNotExist",
     [policy([{"from": [{"namespaceSelector": {"matchExpressions": [
         {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["serving"]},
         {"key": "role", "operator": "DoesNotExist"}]},
         "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["gateway", "prometheus"]},
                                              {"key": "app", "operator": "Exists"}]}}]}])],
     [(PROMETHEUS, "tcp", 8002, True), (OTHER_GATEWAY, "tcp", 8000, True), (EDGE, "tcp", 8000, False),
      (GATEWAY, "tcp", 8000, False)]),
    ("ipBlock with except",
     [policy([{"from": [{"ipBlock": {"cidr": "10.244.2.0/24", "except": ["10.244.2.16/28"]}}]}])],
     [(EDGE, "tcp", 8000, True), (PROMETHEUS, "tcp", 8000, False), (GATEWAY, "tcp", 8000, False)]),
    ("ports: protocol, range and named ports resolved on the selected pod",
     [policy([{"ports": [{"port": "metrics"}, {"protocol": "UDP", "port": "dns"}, {"protocol": "UDP", "port": "http"},
                         {"protocol": "TCP", "port": 9000, "endPort": 9010}, {"protocol": "SCTP", "port": 7000}]}])],
     [(CLIENT, "tcp", 8002, True), (CLIENT, "udp", 5353, True), (CLIENT, "tcp", 5353, False),
      (CLIENT, "udp", 8000, False), (CLIENT, "tcp", 8000, False), (CLIENT, "tcp", 9005, True),
      (CLIENT, "tcp", 9011, False), (CLIENT, "sctp", 7000, True), (CLIENT, "tcp", 7000, False)]),
    ("a port entry without a port admits every port of its protocol",
     [policy([{"ports": [{"protocol": "UDP"}]}])], [(CLIENT, "udp", 1, True), (CLIENT, "tcp", 1, False)]),
    ("policies and rules add up",
     [policy([{"from": [pod_selector(app="gateway")], "ports": tcp(8000)},
              {"from": [namespace_selector(**{"kubernetes.io/metadata.name": "monitoring"})], "ports": tcp(8002)}]),
      policy([{"from": [pod_selector(app="client")], "ports": tcp(8001)}], selector={})],
     [(GATEWAY, "tcp", 8000, True), (GATEWAY, "tcp", 8002, False), (PROMETHEUS, "tcp", 8002, True),
      (PROMETHEUS, "tcp", 8000, False), (CLIENT, "tcp", 8001, True), (CLIENT, "tcp", 8000, False)]),
    ("a finished pod's IP is not a peer's any more",
     [policy([{"from": [pod_selector(app="gateway")]}])], [(GATEWAY, "tcp", 8000, True), (FINISHED, "tcp", 8000, False)]),
]


@pytest.mark.parametrize("policies,connections", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_pod_admits_what_the_policies_selecting_it_allow(policies, connections):
    allows = ingress_allows(SERVER, policies, PODS, NAMESPACES)
    got = [(source, protocol, port, admits(allows, source, protocol, port)) for source, protocol, port, _ in connections]
    assert got == connections


def test_peers_without_an_ip_add_no_source():
    (allow,) = ingress_allows(SERVER, [policy([{"from": [pod_selector(app="gateway")]}])], PODS, NAMESPACES)
    assert sorted(source.cidr for source in allow.sources) == [f"{GATEWAY}/32"]


def test_an_unknown_selector_operator_names_the_field():
    bad = policy([{"from": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}]}])
    with pytest.raises(PolicyError, match="matchExpressions operator must be In, NotIn, Exists or DoesNotExist"):
        ingress_allows(SERVER, [bad], PODS, NAMESPACES)


def test_a_pod_not_isolated_gets_no_table():
    assert nft_script(None, [NODE_IP]) == f"table inet {TABLE}\ndelete table inet {TABLE}\n"


def test_an_isolated_pod_drops_all_but_itself_replies_its_node_and_its_rules():
    allows = ingress_allows(SERVER, [policy([{"from": [pod_selector(app="gateway"), pod_selector(app="client")],
                                              "ports": tcp(8000, 8001)},
                                             {"from": [{"ipBlock": {"cidr": "192.0.2.0/24",
                                                                    "except": ["192.0.2.0/28"]}}]}])],
                            PODS, NAMESPACES)
    chain = nft_script(allows, [NODE_IP]).split("chain ingress {\n")[1].splitlines()
    assert [line.strip() for line in chain] == [
        "type filter hook input priority filter; policy drop;",
        "iif lo accept",
        "ct state established,related accept",
        f"ip saddr {NODE_IP} accept",
        f"ip saddr {{ {GATEWAY}/32, {CLIENT}/32 }} meta l4proto tcp th dport {{ 8000, 8001 }} accept",
        "ip saddr 192.0.2.0/24 ip saddr != { 192.0.2.0/28 } accept",
        "}", "}"]


def test_a_rule_whose_peers_match_no_pod_admits_nothing():
    allows = ingress_allows(SERVER, [policy([{"from": [pod_selector(app="nobody")]}])], PODS, NAMESPACES)
    assert allows == (Allow((), None),)
    assert "saddr" not in nft_script(allows, []).split("established,related accept")[1]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("unshare") is None,
                    reason="loading a ruleset needs root, nft and unshare")
def test_nft_loads_every_case_in_a_network_namespace():
    for name, policies, _ in CASES:
        script = nft_script(ingress_allows(SERVER, policies, PODS, NAMESPACES), [NODE_IP])
        loaded = subprocess.run(["unshare", "--net", "--", "sh", "-c", f"nft -f - && nft list table inet {TABLE}"],
                                input=script, capture_output=True, text=True)
        isolated = "chain ingress" in script
        assert loaded.returncode == (0 if isolated else 1), f"{name}:\n{script}\n{loaded.stderr}"


def test_up_without_nft_refuses_naming_the_package(monkeypatch, tmp_path, capsys):
    from llmfleet.cli import main
    from llmfleet_sandbox import manager, network

    def went_on(*args):
        raise AssertionError("up went on without nft")
    monkeypatch.setattr(manager, "running_components", went_on)
    monkeypatch.setattr(network.os, "geteuid", lambda: 0)
    monkeypatch.setattr(network.shutil, "which", lambda name: None if name == "nft" else shutil.which(name))
    with pytest.raises(SystemExit) as refused:
        main(["sandbox", "--state-dir", str(tmp_path), "up"])
    assert "`nft` is not installed; install the Debian package nftables" in str(refused.value)
    assert not list(tmp_path.iterdir())  # refused before anything was made


class RecordedNft:
    """Stands in for `nsenter ... nft -f -`: the scripts written, by network namespace."""

    def __init__(self):
        self.written: list[tuple[str, str]] = []
        self.failing = False

    def __call__(self, argv, input, **kwargs):
        self.written.append((argv[1].rsplit("/", 1)[1], input))
        return subprocess.CompletedProcess(argv, 1 if self.failing else 0, "", "nft: error" if self.failing else "")


def test_the_engine_writes_a_ruleset_when_it_changes_and_again_into_a_new_network_namespace(monkeypatch, tmp_path):
    from llmfleet_sandbox import network, policyengine
    from llmfleet_sandbox.config import SandboxConfig

    monkeypatch.setattr(network, "NETNS_DIR", tmp_path)
    nft = RecordedNft()
    monkeypatch.setattr(policyengine.subprocess, "run", nft)
    now = [0.0]
    engine = policyengine.PolicyEngine(SandboxConfig(state_dir=tmp_path / "state"), clock=lambda: now[0])
    netns = network.pod_namespace_name(engine.network, SERVER["metadata"]["uid"])
    engine.on_event("namespaces")("RESET", NAMESPACES)
    engine.on_event("pods")("RESET", PODS)
    engine.on_event("policies")("RESET", [policy([{"from": [pod_selector(app="gateway")]}])])

    def passes() -> list[str]:
        """The scripts the next pass writes into the server pod's namespace."""
        nft.written.clear()
        engine.sync()
        return [script for name, script in nft.written if name == netns]

    assert passes() == []  # its network namespace does not exist yet
    (tmp_path / netns).touch()
    (first,) = passes()
    assert f"ip saddr {GATEWAY}/32 accept" in first
    assert passes() == []  # unchanged: nothing written
    newcomer = pod("serving", "newcomer", "10.244.1.30", {"app": "gateway"})
    engine.on_event("pods")("ADDED", [newcomer])
    (second,) = passes()
    assert f"ip saddr {{ {GATEWAY}/32, 10.244.1.30/32 }} accept" in second
    engine.on_event("pods")("DELETED", [newcomer])
    assert passes() == [first]  # a deleted pod's IP leaves the set
    remade = tmp_path / "remade"
    remade.touch()
    remade.replace(tmp_path / netns)  # the pod's sandbox made anew: another namespace, empty
    assert passes() == [first]
    assert passes() == []
    now[0] += policyengine.REWRITE_SECONDS  # in case the kernel gave the new one the old inode
    assert passes() == [first]
    nft.failing = True
    engine.on_event("policies")("DELETED", [policy()])
    assert passes() == [nft_script(None, [NODE_IP])]
    nft.failing = False
    assert passes() == [nft_script(None, [NODE_IP])]  # a failed write is tried again
    now[0] += policyengine.REWRITE_SECONDS
    assert passes() == []  # a pod that is not isolated has nothing to lose
