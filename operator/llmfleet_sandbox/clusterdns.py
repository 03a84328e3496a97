"""The cluster's DNS: Service and pod names, as a cluster's CoreDNS (its `kubernetes` plugin)
answers them.

It serves the zone `cluster.local` from watches of Services and EndpointSlices, following the
Kubernetes DNS specification (github.com/kubernetes/dns, docs/specification.md):

- `<service>.<ns>.svc.cluster.local`: A, the ClusterIP; for a headless Service, the addresses of
  its ready endpoints (all of them when the Service publishes not-ready addresses, which the
  EndpointSlice controller then marks ready); CNAME for an ExternalName Service;
- `<hostname>.<service>.<ns>.svc.cluster.local`: A, the endpoint of a headless Service with that
  hostname (a pod with `hostname` and `subdomain: <service>`, as a StatefulSet's pods are),
  or whose address written with dashes is `<hostname>`;
- `_<port>._<proto>.<service>.<ns>.svc.cluster.local`: SRV, the named port, pointing at the
  Service's name (or, headless, at each endpoint's);
- `<a-b-c-d>.<ns>.pod.cluster.local`: A, a.b.c.d (CoreDNS's `pods insecure`, kubeadm's default).

Other names in the zone are NXDOMAIN, so a resolver walks its search list; names outside it are
forwarded to the host's nameservers (CoreDNS's `forward . /etc/resolv.conf`). UDP answers larger
than 512 bytes are truncated (TC) and the client asks again over TCP. Every pod's
/etc/resolv.conf names this server (`poddns`), as the kubelet's `--cluster-dns` does.
It listens on the pod bridge's gateway, port 53, where pods and the host reach it.

Run as `python -m llmfleet_sandbox.clusterdns --kubeconfig FILE --address IP [--port 53]`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from llmfleet_sandbox.config import CLUSTER_DOMAIN
from llmfleet_sandbox.informer import watch_forever
from llmfleet_sandbox.serviceproxy import SERVICE_NAME_LABEL

DNS_PORT = 53
TTL_SECONDS = 5  # CoreDNS's kubernetes plugin's default
UDP_LIMIT = 512
TYPE_A, TYPE_NS, TYPE_CNAME, TYPE_SOA, TYPE_AAAA, TYPE_SRV, TYPE_ANY = 1, 2, 5, 6, 28, 33, 255
CLASS_IN = 1
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP = 0, 1, 2, 3, 4
FORWARD_TIMEOUT_SECONDS = 2.0
HOST_RESOLV_CONF = Path("/etc/resolv.conf")


@dataclass(frozen=True)
class Record:
    type: int
    value: str | tuple  # an IPv4 address; a name (CNAME); (priority, weight, port, target) for SRV


class ClusterRecords:
    """What the zone holds, from the latest Services and EndpointSlices."""

    def __init__(self, zone: str = CLUSTER_DOMAIN):
        self.zone = zone
        self.lock = threading.Lock()
        self.services: dict[tuple[str, str], dict] = {}
        self.slices: dict[tuple[str, str], dict] = {}

    def in_zone(self, name: str) -> bool:
        name = name.lower().rstrip(".")
        return name == self.zone or name.endswith("." + self.zone)

    def apply(self, kind: str, event_type: str, items: list[dict]) -> None:
        table = self.services if kind == "services" else self.slices
        with self.lock:
            if event_type == "RESET":
                table.clear()
            for item in items:
                key = (item["metadata"]["namespace"], item["metadata"]["name"])
                if event_type == "DELETED":
                    table.pop(key, None)
                else:
                    table[key] = item

    def lookup(self, name: str, qtype: int) -> tuple[int, list[Record]]:
        """(rcode, records) for a name in the zone: NXDOMAIN when the name does not exist,
        NOERROR with no record when it exists but has none of that type."""
        labels = name.lower().rstrip(".")[:-len(self.zone)].rstrip(".").split(".")
        with self.lock:
            records = self._records(labels)
        if records is None:
            return NXDOMAIN, []
        cnames = [record for record in records if record.type == TYPE_CNAME]
        if cnames:
            return NOERROR, cnames
        return NOERROR, [record for record in records if qtype in (record.type, TYPE_ANY)]

    def _records(self, labels: list[str]) -> list[Record] | None:
        if labels == [""]:
            return []  # the zone's apex
        if labels[-1] == "pod" and len(labels) == 3:
            address = labels[0].replace("-", ".")
            return [Record(TYPE_A, address)] if _is_ipv4(address) else None
        if labels[-1] != "svc":
            return None
        if len(labels) == 5 and labels[0].startswith("_") and labels[1].startswith("_"):
            return self._srv(labels[0][1:], labels[1][1:], labels[3], labels[2])
        if len(labels) == 3:
            return self._service(labels[1], labels[0])
        if len(labels) == 4:
            return self._endpoint(labels[2], labels[1], labels[0])
        if len(labels) in (1, 2):
            return [] if any(ns == labels[0] for ns, _ in self.services) or len(labels) == 1 else None
        return None

    def _service(self, namespace: str, name: str) -> list[Record] | None:
        service = self.services.get((namespace, name))
        if service is None:
            return None
        spec = service.get("spec") or {}
        if spec.get("type") == "ExternalName":
            return [Record(TYPE_CNAME, spec.get("externalName", ""))]
        if _headless(service):
            return [Record(TYPE_A, address)
                    for address in dict.fromkeys(address for _, address in self._endpoints(namespace, name))]
        return [Record(TYPE_A, ip) for ip in spec.get("clusterIPs") or [spec.get("clusterIP")] if _is_ipv4(ip)]

    def _endpoint(self, namespace: str, service_name: str, hostname: str) -> list[Record] | None:
        service = self.services.get((namespace, service_name))
        if service is None or not _headless(service):
            return None
        addresses = [address for endpoint_hostname, address in self._endpoints(namespace, service_name)
                     if hostname in (endpoint_hostname, address.replace(".", "-"))]
        return [Record(TYPE_A, address) for address in addresses] or None

    def _srv(self, port_name: str, protocol: str, namespace: str, service_name: str) -> list[Record] | None:
        service = self.services.get((namespace, service_name))
        if service is None:
            return None
        ports = [port for port in (service.get("spec") or {}).get("ports") or []
                 if (port.get("name") or "") == port_name and port.get("protocol", "TCP").lower() == protocol]
        if not ports:
            return None
        service_fqdn = f"{service_name}.{namespace}.svc.{self.zone}"
        if not _headless(service):
            return [Record(TYPE_SRV, (0, 100, ports[0]["port"], service_fqdn))]
        records = []
        for endpoint_slice in self._slices(namespace, service_name):
            port = next((p["port"] for p in endpoint_slice.get("ports") or []
                         if (p.get("name") or "") == port_name), None)
            if port is None:
                continue
            for endpoint in _ready(endpoint_slice):
                for address in endpoint["addresses"]:
                    host = endpoint.get("hostname") or address.replace(".", "-")
                    records.append(Record(TYPE_SRV, (0, 100, port, f"{host}.{service_fqdn}")))
        return records

    def _slices(self, namespace: str, service_name: str) -> list[dict]:
        return [endpoint_slice for (ns, _), endpoint_slice in sorted(self.slices.items())
                if ns == namespace and endpoint_slice.get("addressType", "IPv4") == "IPv4"
                and (endpoint_slice["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == service_name]

    def _endpoints(self, namespace: str, service_name: str) -> list[tuple[str, str]]:
        """(hostname or "", address) of the Service's ready endpoints."""
        return sorted({(endpoint.get("hostname") or "", address)
                       for endpoint_slice in self._slices(namespace, service_name)
                       for endpoint in _ready(endpoint_slice) for address in endpoint["addresses"]})


def _ready(endpoint_slice: dict) -> list[dict]:
    # An unset condition means ready (the EndpointSlice API's rule).
    return [endpoint for endpoint in endpoint_slice.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready") is not False]


def _headless(service: dict) -> bool:
    return (service.get("spec") or {}).get("clusterIP") == "None"


def _is_ipv4(text: str | None) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text or ""), ipaddress.IPv4Address)
    except ValueError:
        return False


# -- the wire format (RFC 1035) -----------------------------------------------------------------

class MalformedQuery(ValueError):
    pass


@dataclass(frozen=True)
class Query:
    id: int
    flags: int
    name: str
    qtype: int
    qclass: int
    question: bytes  # the question section as sent, echoed back in the answer


def parse_query(message: bytes) -> Query:
    if len(message) < 12:
        raise MalformedQuery("shorter than a header")
    query_id, flags, qdcount = struct.unpack("!HHH", message[:6])
    if qdcount != 1:
        raise MalformedQuery(f"{qdcount} questions")
    offset, labels = 12, []
    while True:
        if offset >= len(message):
            raise MalformedQuery("name runs past the message")
        length = message[offset]
        if length & 0xC0:
            raise MalformedQuery("compressed question name")
        offset += 1
        if length == 0:
            break
        labels.append(message[offset:offset + length].decode("ascii", errors="replace"))
        offset += length
    if offset + 4 > len(message):
        raise MalformedQuery("question without type and class")
    qtype, qclass = struct.unpack("!HH", message[offset:offset + 4])
    return Query(query_id, flags, ".".join(labels), qtype, qclass, message[12:offset + 4])


def encode_name(name: str) -> bytes:
    encoded = b""
    for label in name.rstrip(".").split("."):
        if label:
            encoded += bytes([len(label)]) + label.encode("ascii")
    return encoded + b"\x00"


def _rdata(record: Record) -> bytes:
    if record.type == TYPE_A:
        return socket.inet_aton(record.value)
    if record.type == TYPE_CNAME:
        return encode_name(record.value)
    priority, weight, port, target = record.value
    return struct.pack("!HHH", priority, weight, port) + encode_name(target)


def build_response(query: Query, rcode: int, records: list[Record], limit: int | None = None) -> bytes:
    """The answer to `query`, authoritative; over `limit` bytes it is cut to the header and the
    question with TC set, so that the client retries over TCP."""
    flags = 0x8000 | (query.flags & 0x7800) | 0x0400 | (query.flags & 0x0100) | 0x0080 | rcode
    answers = b"".join(struct.pack("!HHHIH", 0xC00C, record.type, CLASS_IN, TTL_SECONDS, len(rdata)) + rdata
                       for record in records for rdata in [_rdata(record)])
    response = struct.pack("!HHHHHH", query.id, flags, 1, len(records), 0, 0) + query.question + answers
    if limit is not None and len(response) > limit:
        response = struct.pack("!HHHHHH", query.id, flags | 0x0200, 1, 0, 0, 0) + query.question
    return response


def error_response(message: bytes, rcode: int) -> bytes | None:
    if len(message) < 12:
        return None
    query_id, flags = struct.unpack("!HH", message[:4])
    return struct.pack("!HHHHHH", query_id, 0x8000 | (flags & 0x7900) | 0x0080 | rcode, 0, 0, 0, 0)


def host_nameservers(resolv_conf: Path = HOST_RESOLV_CONF, exclude: tuple[str, ...] = ()) -> list[str]:
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    servers = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return [server for server in servers if server not in exclude]


def forward(message: bytes, nameservers: list[str]) -> bytes | None:
    """The host's nameservers' answer to a query outside the zone, or None."""
    for server in nameservers:
        family = socket.AF_INET6 if ":" in server else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as upstream:
            upstream.settimeout(FORWARD_TIMEOUT_SECONDS)
            try:
                upstream.sendto(message, (server, DNS_PORT))
                answer, _ = upstream.recvfrom(65535)
            except OSError:
                continue
            if answer[:2] == message[:2]:
                return answer
    return None


class Resolver:
    def __init__(self, records: ClusterRecords, nameservers: list[str]):
        self.records = records
        self.nameservers = nameservers

    async def answer(self, message: bytes, limit: int | None) -> bytes | None:
        try:
            query = parse_query(message)
        except MalformedQuery:
            return error_response(message, FORMERR)
        if (query.flags >> 11) & 0xF:
            return error_response(message, NOTIMP)
        if not self.records.in_zone(query.name):
            answer = await asyncio.get_running_loop().run_in_executor(None, forward, message, self.nameservers)
            return answer if answer is not None else build_response(query, SERVFAIL, [])
        if query.qclass != CLASS_IN:
            return build_response(query, NOERROR, [], limit)
        rcode, records = self.records.lookup(query.name, query.qtype)
        return build_response(query, rcode, records, limit)


class _UdpServer(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver):
        self.resolver = resolver
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, address) -> None:
        asyncio.ensure_future(self._reply(data, address))

    async def _reply(self, data: bytes, address) -> None:
        response = await self.resolver.answer(data, UDP_LIMIT)
        if response is not None:
            self.transport.sendto(response, address)


async def _serve_tcp(resolver: Resolver, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            length = struct.unpack("!H", await reader.readexactly(2))[0]
            response = await resolver.answer(await reader.readexactly(length), None)
            if response is None:
                break
            writer.write(struct.pack("!H", len(response)) + response)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def query(server: str, name: str, qtype: int = TYPE_A, port: int = DNS_PORT,
          timeout: float = 2.0) -> tuple[int, list[str]]:
    """Ask `server` over UDP; (rcode, the A answers as addresses). For health checks and tests."""
    message = struct.pack("!HHHHHH", 0x4C57, 0x0100, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(message, (server, port))
        response, _ = sock.recvfrom(65535)
    flags, _, ancount = struct.unpack("!HHH", response[2:8])
    offset = 12 + len(encode_name(name)) + 4
    addresses = []
    for _ in range(ancount):
        rtype, _, _, length = struct.unpack("!HHIH", response[offset + 2:offset + 12])
        if rtype == TYPE_A:
            addresses.append(socket.inet_ntoa(response[offset + 12:offset + 12 + length]))
        offset += 12 + length
    return flags & 0xF, addresses


def wait_until_serving(server: str, name: str, expected: str, timeout_seconds: float) -> None:
    """Until `name` resolves to `expected` at `server` (the watches have synced)."""
    deadline = time.monotonic() + timeout_seconds
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            rcode, addresses = query(server, name, timeout=1.0)
            if expected in addresses:
                return
            last = f"rcode {rcode}, answers {addresses}"
        except OSError as error:
            last = str(error)
        time.sleep(0.2)
    raise TimeoutError(f"cluster DNS at {server} did not resolve {name} to {expected} "
                       f"after {timeout_seconds:.0f} s: {last}")


async def serve(kubeconfig: str, address: str, port: int) -> None:
    from kubernetes import client, config as kube_config

    kube_config.load_kube_config(kubeconfig)
    records = ClusterRecords()
    nameservers = host_nameservers(exclude=(address,))
    resolver = Resolver(records, nameservers)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    stopping = threading.Event()
    for kind, list_call in (("services", client.CoreV1Api().list_service_for_all_namespaces),
                            ("endpointslices", client.DiscoveryV1Api().list_endpoint_slice_for_all_namespaces)):
        threading.Thread(target=watch_forever, args=(list_call, lambda event_type, objects, kind=kind:
                                                      records.apply(kind, event_type, objects), stopping),
                         kwargs={"what": kind}, daemon=True).start()
    transport, _ = await loop.create_datagram_endpoint(lambda: _UdpServer(resolver), local_addr=(address, port))
    server = await asyncio.start_server(lambda r, w: _serve_tcp(resolver, r, w), address, port, reuse_address=True)
    print(f"serving {records.zone} on {address}:{port} (UDP and TCP); other names go to "
          f"{', '.join(nameservers) or 'no nameserver (SERVFAIL)'}", flush=True)
    await stop.wait()
    stopping.set()
    transport.close()
    server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=DNS_PORT)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.kubeconfig, args.address, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
