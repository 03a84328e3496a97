"""The sandbox's NetworkPolicy engine, the part of a CNI policy plugin (Calico's Felix, Cilium's
agent, kube-router's policy controller) that enforces the policies on a node.

It watches NetworkPolicies, Pods and Namespaces on the apiserver and keeps, in the network
namespace of every pod of this sandbox, an nftables ruleset (`networkpolicy.TABLE`) on the
pod's input path: none for a pod no Ingress policy selects, else what its policies admit
(`networkpolicy.ingress_allows`). A pass runs after each change (batched for
`SETTLE_SECONDS`) and every `RESYNC_SECONDS` regardless, which also covers a pod whose network
namespace appears (or is made anew) after its last event; only rulesets that changed are
written, and an isolated pod's again every `REWRITE_SECONDS`: a namespace made anew under the
same name (its pod sandbox remade) is told apart by its inode, which the kernel may reuse.
Egress is not enforced (docs/sandbox.md says why).
Run as `python -m llmfleet_sandbox.policyengine --settings FILE`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

from kubernetes import client, config as kube_config

from llmfleet_sandbox import network, networkpolicy
from llmfleet_sandbox.config import SandboxConfig
from llmfleet_sandbox.informer import watch_forever

SETTLE_SECONDS = 0.2
RESYNC_SECONDS = 2.0
REWRITE_SECONDS = 30.0
NFT_TIMEOUT_SECONDS = 10


def log(message: str) -> None:
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')} {message}", flush=True)


def isolated(script: str) -> bool:
    return "chain ingress" in script


class PolicyEngine:
    def __init__(self, config: SandboxConfig, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.network = config.network
        # Every sandbox node is this machine, at the bridge's gateway (each Node's InternalIP).
        self.node_ips = [config.network.gateway_ip]
        self.lock = threading.Lock()
        self.objects: dict[str, dict[tuple[str, str], dict]] = {"pods": {}, "policies": {}, "namespaces": {}}
        self.changed = threading.Event()
        self.stopping = threading.Event()
        # Per pod network namespace: (its inode, the script last written there, when).
        self.written: dict[str, tuple[int, str, float]] = {}

    def on_event(self, kind: str):
        def apply(event_type: str, items: list[dict]) -> None:
            with self.lock:
                table = self.objects[kind]
                if event_type == "RESET":
                    table.clear()
                for item in items:
                    key = (item["metadata"].get("namespace", ""), item["metadata"]["name"])
                    if event_type == "DELETED":
                        table.pop(key, None)
                    else:
                        table[key] = item
            self.changed.set()
        return apply

    def desired_scripts(self) -> dict[str, str]:
        """The ruleset each of this sandbox's pods should have, by network namespace name."""
        with self.lock:
            pods = list(self.objects["pods"].values())
            policies = list(self.objects["policies"].values())
            namespaces = list(self.objects["namespaces"].values())
        scripts = {}
        for pod in pods:
            if not pod["spec"].get("nodeName") or pod["spec"].get("hostNetwork"):
                continue
            allows = networkpolicy.ingress_allows(pod, policies, pods, namespaces)
            netns = network.pod_namespace_name(self.network, pod["metadata"]["uid"])
            scripts[netns] = networkpolicy.nft_script(allows, self.node_ips)
        return scripts

    def sync(self) -> None:
        for netns, script in self.desired_scripts().items():
            try:
                inode = (network.NETNS_DIR / netns).stat().st_ino
            except FileNotFoundError:
                continue  # not started yet (or gone): the pass after it appears writes it
            last_inode, last_script, written_at = self.written.get(netns, (None, None, 0.0))
            if (last_inode, last_script) == (inode, script) and (
                    not isolated(script) or self.clock() - written_at < REWRITE_SECONDS):
                continue
            result = subprocess.run([*network.exec_prefix(netns), "nft", "-f", "-"], input=script, text=True,
                                    capture_output=True, timeout=NFT_TIMEOUT_SECONDS)
            if result.returncode != 0:
                log(f"writing the ruleset of {netns} failed, retrying: {result.stderr.strip()}\n{script}")
                continue
            if last_script != script:
                log(f"{netns}: " + ("isolated for ingress" if isolated(script) else "not isolated"))
            self.written[netns] = (inode, script, self.clock())
        present = set(network.list_pod_namespaces(self.network))
        for netns in set(self.written) - present:
            del self.written[netns]

    def run(self) -> None:
        core, networking = client.CoreV1Api(), client.NetworkingV1Api()
        for kind, list_call in (("pods", core.list_pod_for_all_namespaces),
                                ("policies", networking.list_network_policy_for_all_namespaces),
                                ("namespaces", core.list_namespace)):
            threading.Thread(target=watch_forever, args=(list_call, self.on_event(kind), self.stopping),
                             kwargs={"what": kind, "log": log},
                             daemon=True).start()
        while not self.stopping.is_set():
            self.changed.wait(RESYNC_SECONDS)
            if self.stopping.wait(SETTLE_SECONDS):
                break
            self.changed.clear()
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - the next pass tries again
                log(f"policy pass failed: {error!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", required=True, help="sandbox.json written by `sandbox up`")
    args = parser.parse_args(argv)
    config = SandboxConfig.from_dict(json.loads(open(args.settings).read())["config"])
    kube_config.load_kube_config(str(config.admin_kubeconfig))
    engine = PolicyEngine(config)
    signal.signal(signal.SIGTERM, lambda signum, frame: engine.stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: engine.stopping.set())
    engine.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
