"""A userspace service proxy: every ClusterIP Service answers at its ClusterIP.

Like kube-proxy's original userspace mode: for each TCP port of each ClusterIP
Service it listens on clusterIP:port (the service range is routed to the host's
loopback) and splices each connection to a ready endpoint from the Service's
EndpointSlices. Connections, not requests, are balanced, as by kube-proxy: at random (its
default iptables mode, and its nftables mode: llmfleet.simulation.routing cites them), in
turn (IPVS mode's `rr`), or to the endpoint with the fewest open connections (IPVS `lc`),
ties in turn. With no ready endpoint, connections are refused.
The scheduler is the proxy's (`--scheduler`); a Service's annotation
`sandbox.llmfleet.io/service-proxy-scheduler` chooses another for that Service alone, as
some service proxies take a per-Service load-balancing algorithm, so that tests can compare
both in one sandbox.
Run as `python -m llmfleet_sandbox.serviceproxy --kubeconfig FILE [--scheduler NAME]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import signal
import sys
import threading
from collections import Counter

from kubernetes import client, config as kube_config

from llmfleet.simulation.routing import DEFAULT_ROUTING, LEAST_CONNECTIONS, RANDOM, ROUTINGS
from llmfleet_sandbox.informer import watch_forever

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
BUFFER_BYTES = 64 * 1024
SCHEDULER_ANNOTATION = "sandbox.llmfleet.io/service-proxy-scheduler"


class EndpointTable:
    """Ready endpoints per (namespace, service, port name), fed by the watches, and the
    connections open to each."""

    def __init__(self, scheduler: str = DEFAULT_ROUTING, random_source: random.Random | None = None):
        if scheduler not in ROUTINGS:
            raise ValueError(f"scheduler must be one of {', '.join(ROUTINGS)}, got {scheduler!r}")
        self.scheduler = scheduler
        self.lock = threading.Lock()
        self.slices: dict[tuple[str, str], dict] = {}
        self.counters: dict[tuple, itertools.count] = {}
        self.open_connections: Counter[tuple[str, int]] = Counter()
        self.random = random_source or random.Random()

    def set_slice(self, namespace: str, name: str, endpoint_slice: dict | None) -> None:
        with self.lock:
            if endpoint_slice is None:
                self.slices.pop((namespace, name), None)
            else:
                self.slices[(namespace, name)] = endpoint_slice

    def ready_backends(self, namespace: str, service: str, port_name: str) -> list[tuple[str, int]]:
        backends = []
        with self.lock:
            slices = list(self.slices.values())
        for endpoint_slice in slices:
            labels = endpoint_slice["metadata"].get("labels") or {}
            if endpoint_slice["metadata"]["namespace"] != namespace or labels.get(SERVICE_NAME_LABEL) != service:
                continue
            port = next((p["port"] for p in endpoint_slice.get("ports") or []
                         if (p.get("name") or "") == port_name), None)
            if port is None:
                continue
            for endpoint in endpoint_slice.get("endpoints") or []:
                conditions = endpoint.get("conditions") or {}
                if conditions.get("ready", True) and not conditions.get("terminating", False):
                    backends.extend((address, port) for address in endpoint["addresses"])
        return sorted(backends)

    def pick(self, namespace: str, service: str, port_name: str,
             scheduler: str | None = None) -> tuple[str, int] | None:
        """The endpoint for a new connection, counted open until `closed`; `scheduler`
        overrides the table's for this Service."""
        backends = self.ready_backends(namespace, service, port_name)
        if not backends:
            return None
        key = (namespace, service, port_name)
        with self.lock:
            scheduler = scheduler or self.scheduler
            if scheduler == RANDOM:
                chosen = self.random.choice(backends)
            else:
                if scheduler == LEAST_CONNECTIONS:
                    fewest = min(self.open_connections[backend] for backend in backends)
                    backends = [backend for backend in backends if self.open_connections[backend] == fewest]
                counter = self.counters.setdefault(key, itertools.count())
                chosen = backends[next(counter) % len(backends)]
            self.open_connections[chosen] += 1
            return chosen

    def closed(self, backend: tuple[str, int]) -> None:
        with self.lock:
            self.open_connections[backend] -= 1
            if self.open_connections[backend] <= 0:
                del self.open_connections[backend]


class ServiceProxy:
    def __init__(self, loop: asyncio.AbstractEventLoop, scheduler: str = DEFAULT_ROUTING):
        self.loop = loop
        self.endpoints = EndpointTable(scheduler)
        self.services: dict[tuple[str, str], dict] = {}
        # (cluster IP, port) -> (server, namespace, service, port name, scheduler or None)
        self.listeners: dict[tuple[str, int], tuple[asyncio.AbstractServer, str, str, str]] = {}
        self.stopping = threading.Event()
        self.sync_lock = asyncio.Lock()

    def wanted_listeners(self) -> dict[tuple[str, int], tuple[str, str, str, str | None]]:
        wanted = {}
        for (namespace, name), service in self.services.items():
            spec = service.get("spec") or {}
            cluster_ip = spec.get("clusterIP")
            if not cluster_ip or cluster_ip == "None":
                continue
            scheduler = service_scheduler(service)
            for port in spec.get("ports") or []:
                if port.get("protocol", "TCP") == "TCP":
                    wanted[(cluster_ip, port["port"])] = (namespace, name, port.get("name") or "", scheduler)
        return wanted

    async def sync_listeners(self) -> None:
        wanted = self.wanted_listeners()
        for address, (server, *target) in list(self.listeners.items()):
            if wanted.get(address) != tuple(target):
                server.close()
                del self.listeners[address]
        for address, target in wanted.items():
            if address in self.listeners:
                continue
            try:
                server = await asyncio.start_server(
                    lambda r, w, t=target: self.forward(r, w, *t), address[0], address[1],
                    reuse_address=True)
            except OSError as error:
                print(f"cannot listen on {address[0]}:{address[1]} for {target[0]}/{target[1]}: {error}",
                      flush=True)
                continue
            self.listeners[address] = (server, *target)
            print(f"service {target[0]}/{target[1]} port {target[2] or address[1]} "
                  f"listening on {address[0]}:{address[1]}"
                  + (f", scheduler {target[3]}" if target[3] else ""), flush=True)

    async def forward(self, reader, writer, namespace: str, service: str, port_name: str,
                      scheduler: str | None) -> None:
        backend = self.endpoints.pick(namespace, service, port_name, scheduler)
        if backend is None:
            writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*backend)
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except OSError:
            writer.close()
        finally:
            self.endpoints.closed(backend)

    def on_services(self, event_type: str, items: list[dict]) -> None:
        """Called from the watch thread; the service table belongs to the event loop."""
        asyncio.run_coroutine_threadsafe(self.apply_services(event_type, items), self.loop)

    async def apply_services(self, event_type: str, items: list[dict]) -> None:
        if event_type == "RESET":
            self.services = {}
        for service in items:
            key = (service["metadata"]["namespace"], service["metadata"]["name"])
            if event_type == "DELETED":
                self.services.pop(key, None)
            else:
                self.services[key] = service
        async with self.sync_lock:
            await self.sync_listeners()

    def on_slices(self, event_type: str, items: list[dict]) -> None:
        if event_type == "RESET":
            with self.endpoints.lock:
                self.endpoints.slices.clear()
        for endpoint_slice in items:
            metadata = endpoint_slice["metadata"]
            self.endpoints.set_slice(metadata["namespace"], metadata["name"],
                                     None if event_type == "DELETED" else endpoint_slice)


def service_scheduler(service: dict) -> str | None:
    """The Service's own scheduler from its annotation; an unknown one is reported and
    ignored (the proxy's scheduler serves it), as a proxy does not refuse a Service."""
    metadata = service["metadata"]
    scheduler = (metadata.get("annotations") or {}).get(SCHEDULER_ANNOTATION)
    if scheduler is None or scheduler in ROUTINGS:
        return scheduler
    print(f"service {metadata['namespace']}/{metadata['name']}: {SCHEDULER_ANNOTATION} must be one of "
          f"{', '.join(ROUTINGS)}, got {scheduler!r}; using the proxy's scheduler", flush=True)
    return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(BUFFER_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except RuntimeError:
            pass


async def serve(kubeconfig: str, scheduler: str) -> None:
    kube_config.load_kube_config(kubeconfig)
    loop = asyncio.get_running_loop()
    proxy = ServiceProxy(loop, scheduler)
    core = client.CoreV1Api()
    discovery = client.DiscoveryV1Api()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    for list_call, handler in ((core.list_service_for_all_namespaces, proxy.on_services),
                               (discovery.list_endpoint_slice_for_all_namespaces, proxy.on_slices)):
        threading.Thread(target=watch_forever, args=(list_call, handler, proxy.stopping), kwargs={"what": "service proxy"},
                         daemon=True).start()
    await stop.wait()
    proxy.stopping.set()
    for server, *_ in proxy.listeners.values():
        server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--scheduler", choices=ROUTINGS, default=DEFAULT_ROUTING,
                        help=f"how connections are spread over endpoints (default {DEFAULT_ROUTING})")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.kubeconfig, args.scheduler))
    return 0


if __name__ == "__main__":
    sys.exit(main())
