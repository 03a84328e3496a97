"""What the sandbox's `mpirun` checks of a rank group's hosts before rank 0 starts (its stand-in
for launching the remote ranks, which needs a `kubectl exec` the sandbox cannot serve), and how it
watches them while rank 0 runs (its stand-in for the remote daemons' connections).

OpenMPI launches a daemon on every host but its own through the rsh agent; for upstream's
LeaderWorkerSet recipe that is `kubectl exec` into each pod of the group. Here: the agent must
be an executable file (OpenMPI refuses an agent it cannot find); the first host must be this pod
(rank 0 runs where mpirun runs); each other host must be a pod of this namespace that this pod's
ServiceAccount may read (the `get pods` the recipe's kubectl does), Running, and reachable from
this pod's network at `<hostname>.<subdomain>.<namespace>` through the cluster's DNS: a TCP
connection to it is answered, accepted or refused, within a timeout (the remote daemon would
connect back over the same network).

Once launched, a remote rank lives in its pod's container, started there by the rsh agent: when
that container ends or restarts, or the pod goes, the rank and its daemon go with it, and OpenMPI
aborts the whole job ("lost communication with a remote daemon"). `GroupWatch` says when.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any
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


def check_group(hosts: list[Host], rsh_agent: str | None) -> "GroupWatch":
    """The watch over the other hosts' containers, once every check holds."""
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
    return GroupWatch(core, namespace, {host.name: host_identity(core.read_namespaced_pod(host.name, namespace))
                                        for host in hosts[1:]})


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


@dataclass(frozen=True)
class HostIdentity:
    """What a remote rank's life is tied to: its pod and each container's restart count."""

    uid: str
    restarts: tuple[tuple[str, int], ...]


def host_identity(pod: Any) -> HostIdentity:
    return HostIdentity(pod.metadata.uid, tuple(sorted((status.name, status.restart_count or 0)
                                                       for status in pod.status.container_statuses or ())))


def lost_reason(pod: Any | None, launched: HostIdentity) -> str | None:
    """Why the ranks launched into this pod are gone (None: they may still run): the pod is gone or
    replaced, no longer Running, or a container of it ended or restarted."""
    if pod is None:
        return "its pod is gone"
    if pod.metadata.uid != launched.uid:
        return "its pod was replaced"
    if pod.status.phase != "Running":
        return f"its pod is {pod.status.phase}"
    restarts = dict(launched.restarts)
    for status in pod.status.container_statuses or ():
        if status.state is not None and status.state.terminated is not None:
            return f"its container {status.name} ended"
        if (status.restart_count or 0) > restarts.get(status.name, 0):
            return f"its container {status.name} restarted"
    return None


@dataclass
class GroupWatch:
    """The remote hosts as launched; `lost()` reads them again."""

    core: Any
    namespace: str
    launched: dict[str, HostIdentity]

    def lost(self) -> str | None:
        """The first host whose ranks are gone, and why; a failed read is not a loss (the apiserver
        may be slow or restarting while the ranks run on)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        for name, identity in self.launched.items():
            try:
                pod = self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as error:
                if error.status != 404:
                    continue
                pod = None
            except (HTTPError, OSError):
                continue
            reason = lost_reason(pod, identity)
            if reason:
                return f"host {name}: {reason}"
        return None
