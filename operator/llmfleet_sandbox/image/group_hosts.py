"""What the sandbox's `mpirun` checks of a rank group's hosts before rank 0 starts (its stand-in
for launching the remote ranks, which needs a `kubectl exec` the sandbox cannot serve).

OpenMPI launches a daemon on every host but its own through the rsh agent; for upstream's
LeaderWorkerSet recipe that is `kubectl exec` into each pod of the group. Here: the agent must
be an executable file (OpenMPI refuses an agent it cannot find); the first host must be this pod
(rank 0 runs where mpirun runs); each other host must be a pod of this namespace that this pod's
ServiceAccount may read (the `get pods` the recipe's kubectl does), Running, and reachable from
this pod's network at `<hostname>.<subdomain>.<namespace>` through the cluster's DNS: a TCP
connection to it is answered, accepted or refused, within a timeout (the remote daemon would
connect back over the same network).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# OpenMPI's out-of-band TCP channel needs some port; nothing listens on an idle worker, and a
# refusal is an answer as good as an accept: the pod's network stack is there.
PROBE_PORT = 1024
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Host:
    """One `--host` entry: a pod of the group and its ranks' slots (its GPUs)."""

    name: str
    slots: int


class GroupLaunchError(Exception):
    """A remote rank could not be started; the message says which host and why."""


def check_group(hosts: list[Host], rsh_agent: str | None) -> None:
    if not rsh_agent:
        raise GroupLaunchError("--host names other pods but no -mca plm_rsh_agent starts their ranks")
    if not (os.path.isfile(rsh_agent) and os.access(rsh_agent, os.X_OK)):
        raise GroupLaunchError(f"the rsh agent {rsh_agent} (-mca plm_rsh_agent) is not an executable file")
    own = socket.gethostname()
    if hosts[0].name != own:
        raise GroupLaunchError(f"the first host {hosts[0].name} is not this pod ({own}): rank 0 runs where "
                               "mpirun runs")
    core = _core_api()
    namespace = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
    for host in hosts[1:]:
        check_host(core, namespace, host.name)


def _core_api():
    from kubernetes import client, config

    config.load_incluster_config()
    return client.CoreV1Api()


def check_host(core, namespace: str, name: str) -> str:
    """The host's stable address, once the pod is Running and answers there."""
    from kubernetes.client.exceptions import ApiException

    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as error:
        raise GroupLaunchError(f"host {name}: cannot read pod {namespace}/{name}: {error.status} {error.reason}") from None
    if pod.status.phase != "Running":
        raise GroupLaunchError(f"host {name}: pod {namespace}/{name} is {pod.status.phase}, not Running")
    if not pod.spec.subdomain:
        raise GroupLaunchError(f"host {name}: pod {namespace}/{name} has no subdomain, so no stable address")
    address = f"{pod.spec.hostname or name}.{pod.spec.subdomain}.{namespace}"
    try:
        resolved = socket.gethostbyname(address)
    except OSError as error:
        raise GroupLaunchError(f"host {name}: {address} does not resolve: {error}") from None
    if resolved != pod.status.pod_ip:
        raise GroupLaunchError(f"host {name}: {address} resolves to {resolved}, the pod's IP is {pod.status.pod_ip}")
    try:
        with socket.create_connection((resolved, PROBE_PORT), timeout=PROBE_TIMEOUT_S):
            pass
    except ConnectionRefusedError:
        pass
    except OSError as error:
        raise GroupLaunchError(f"host {name}: {address} ({resolved}) is not reachable: {error}") from None
    return address
