"""The sandbox's cluster DNS and each pod's resolv.conf and hosts, without a cluster: the records
of the Kubernetes DNS specification, the wire format through a real socket, and what the kubelet
writes for each dnsPolicy."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

import pytest

from llmfleet_sandbox import clusterdns, poddns
from llmfleet_sandbox.clusterdns import NOERROR, NXDOMAIN, TYPE_A, TYPE_AAAA, TYPE_SRV, ClusterRecords, Record

ZONE = "cluster.local"


def _service(name, namespace="ns", cluster_ip="10.96.0.20", ports=(("http", 8080),), **spec):
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip] if cluster_ip != "None" else ["None"],
                     "ports": [{"name": port_name, "port": port, "protocol": "TCP"} for port_name, port in ports],
                     **spec}}


def _slice(name, service, endpoints, namespace="ns", port=("http", 8080)):
    return {"metadata": {"name": name, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": port[0], "port": port[1]}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": ready},
                           **({"hostname": hostname} if hostname else {})}
                          for address, hostname, ready in endpoints]}


@pytest.fixture
def records():
    table = ClusterRecords(ZONE)
    table.apply("services", "RESET", [
        _service("web"),
        _service("lws", cluster_ip="None"),
        _service("db", namespace="other", cluster_ip="10.96.0.30"),
        {"metadata": {"name": "ext", "namespace": "ns"},
         "spec": {"type": "ExternalName", "externalName": "example.org"}}])
    table.apply("endpointslices", "RESET", [
        _slice("lws-abc", "lws", [("10.244.1.5", "lws-0", True), ("10.244.2.7", "", True),
                                  ("10.244.2.8", "lws-1", False)]),
        _slice("web-abc", "web", [("10.244.1.9", "", True)])])
    return table


def _addresses(result):
    rcode, found = result
    return rcode, sorted(record.value for record in found)


def test_a_cluster_ip_service_resolves_to_its_cluster_ip_not_its_endpoints(records):
    assert _addresses(records.lookup("web.ns.svc.cluster.local", TYPE_A)) == (NOERROR, ["10.96.0.20"])
    assert _addresses(records.lookup("DB.other.svc.cluster.local.", TYPE_A)) == (NOERROR, ["10.96.0.30"])


def test_a_headless_service_resolves_to_its_ready_endpoints_and_each_hostname_to_its_pod(records):
    assert _addresses(records.lookup("lws.ns.svc.cluster.local", TYPE_A)) == (NOERROR, ["10.244.1.5", "10.244.2.7"])
    assert _addresses(records.lookup("lws-0.lws.ns.svc.cluster.local", TYPE_A)) == (NOERROR, ["10.244.1.5"])
    # An endpoint without a hostname answers by its address written with dashes.
    assert _addresses(records.lookup("10-244-2-7.lws.ns.svc.cluster.local", TYPE_A)) == (NOERROR, ["10.244.2.7"])
    # Not ready: not published (a Service that publishes not-ready addresses has them marked ready).
    assert records.lookup("lws-1.lws.ns.svc.cluster.local", TYPE_A) == (NXDOMAIN, [])
    # Hostnames only under headless Services.
    assert records.lookup("x.web.ns.svc.cluster.local", TYPE_A) == (NXDOMAIN, [])


def test_a_search_list_walks_past_names_that_do_not_exist(records):
    # LWS_LEADER_ADDRESS is lws-0.lws.ns; with ndots:5 the resolver tries the pod's namespace first.
    assert records.lookup("lws-0.lws.ns.ns.svc.cluster.local", TYPE_A) == (NXDOMAIN, [])
    assert records.lookup("lws-0.lws.ns.svc.cluster.local", TYPE_A)[0] == NOERROR
    assert records.lookup("missing.ns.svc.cluster.local", TYPE_A) == (NXDOMAIN, [])


def test_a_name_with_no_record_of_the_type_is_nodata_not_nxdomain(records):
    assert records.lookup("web.ns.svc.cluster.local", TYPE_AAAA) == (NOERROR, [])


def test_external_name_pod_and_srv_records(records):
    assert records.lookup("ext.ns.svc.cluster.local", TYPE_A) == (NOERROR, [Record(5, "example.org")])
    assert _addresses(records.lookup("10-244-3-4.ns.pod.cluster.local", TYPE_A)) == (NOERROR, ["10.244.3.4"])
    assert records.lookup("_http._tcp.web.ns.svc.cluster.local", TYPE_SRV) == (
        NOERROR, [Record(TYPE_SRV, (0, 100, 8080, "web.ns.svc.cluster.local"))])
    assert sorted(r.value for r in records.lookup("_http._tcp.lws.ns.svc.cluster.local", TYPE_SRV)[1]) == [
        (0, 100, 8080, "10-244-2-7.lws.ns.svc.cluster.local"), (0, 100, 8080, "lws-0.lws.ns.svc.cluster.local")]


def test_watch_events_update_the_records(records):
    records.apply("endpointslices", "MODIFIED", [_slice("lws-abc", "lws", [("10.244.1.6", "lws-0", True)])])
    assert _addresses(records.lookup("lws-0.lws.ns.svc.cluster.local", TYPE_A)) == (NOERROR, ["10.244.1.6"])
    records.apply("services", "DELETED", [_service("lws", cluster_ip="None")])
    assert records.lookup("lws-0.lws.ns.svc.cluster.local", TYPE_A) == (NXDOMAIN, [])


@pytest.fixture
def server(records):
    """The resolver on a loopback UDP and TCP port, forwarding other names to nowhere."""
    loop = asyncio.new_event_loop()
    resolver = clusterdns.Resolver(records, nameservers=[])
    started = threading.Event()
    serving = {}

    async def start():
        serving["udp"], _ = await loop.create_datagram_endpoint(lambda: clusterdns._UdpServer(resolver),
                                                                local_addr=("127.0.0.1", 0))
        port = serving["udp"].get_extra_info("sockname")[1]
        serving["tcp"] = await asyncio.start_server(lambda r, w: clusterdns._serve_tcp(resolver, r, w),
                                                    "127.0.0.1", port)
        serving["port"] = port
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    started.wait(5)
    yield serving["port"]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    # Ended as asyncio.run ends a loop: a TCP connection's handler still waiting for its next
    # query is cancelled while the loop can still close its transport (else it is collected after
    # the loop closed, and pytest reports the "Event loop is closed" it raises then).
    async def end():
        serving["udp"].close()
        serving["tcp"].close()
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    loop.run_until_complete(end())
    loop.close()


def test_the_server_answers_over_udp_and_marks_a_miss_nxdomain(server):
    assert clusterdns.query("127.0.0.1", "lws-0.lws.ns.svc.cluster.local", port=server) == (NOERROR, ["10.244.1.5"])
    assert clusterdns.query("127.0.0.1", "nope.ns.svc.cluster.local", port=server) == (NXDOMAIN, [])
    # Names outside the zone go to the host's nameservers; with none, SERVFAIL.
    assert clusterdns.query("127.0.0.1", "example.org", port=server) == (clusterdns.SERVFAIL, [])


def test_an_answer_too_large_for_udp_is_truncated_and_whole_over_tcp(records, server):
    many = [(f"10.244.1.{index}", "", True) for index in range(100, 159)]
    records.apply("endpointslices", "ADDED", [_slice("lws-many", "lws", many)])
    question = clusterdns.encode_name("lws.ns.svc.cluster.local") + struct.pack("!HH", TYPE_A, 1)
    message = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + question
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(2)
        udp.sendto(message, ("127.0.0.1", server))
        truncated, _ = udp.recvfrom(65535)
    assert struct.unpack("!H", truncated[2:4])[0] & 0x0200 and len(truncated) <= clusterdns.UDP_LIMIT
    with socket.create_connection(("127.0.0.1", server), timeout=2) as tcp:
        tcp.sendall(struct.pack("!H", len(message)) + message)
        length = struct.unpack("!H", tcp.recv(2))[0]
        whole = b""
        while len(whole) < length:
            whole += tcp.recv(length - len(whole))
    assert struct.unpack("!H", whole[6:8])[0] == 59 + 2  # the 59 added and the two ready before


def test_garbage_gets_formerr_when_it_has_a_header():
    assert clusterdns.error_response(b"\x12\x34" + b"\x00" * 4, clusterdns.FORMERR) is None
    response = clusterdns.error_response(b"\x12\x34\x01\x00" + b"\x00" * 8, clusterdns.FORMERR)
    assert response[:2] == b"\x12\x34" and response[3] & 0xF == clusterdns.FORMERR


HOST_RESOLV_CONF = "nameserver 10.255.255.53\nsearch corp.example\noptions timeout:2\n"


def _pod(**spec):
    return {"metadata": {"name": "lws-0", "namespace": "team"}, "spec": {"containers": [], **spec}}


def test_cluster_first_names_the_cluster_dns_and_searches_the_namespace_first():
    assert poddns.resolv_conf(_pod(), "10.244.0.1", HOST_RESOLV_CONF) == (
        "nameserver 10.244.0.1\n"
        "search team.svc.cluster.local svc.cluster.local cluster.local corp.example\n"
        "options ndots:5\n")


def test_default_is_the_hosts_file_and_none_takes_only_dns_config():
    assert poddns.resolv_conf(_pod(dnsPolicy="Default"), "10.244.0.1", HOST_RESOLV_CONF) is None
    assert poddns.resolv_conf(_pod(dnsPolicy="None", dnsConfig={
        "nameservers": ["1.1.1.1"], "searches": ["a.example"], "options": [{"name": "ndots", "value": "2"},
                                                                          {"name": "edns0"}]}),
        "10.244.0.1", HOST_RESOLV_CONF) == "nameserver 1.1.1.1\nsearch a.example\noptions ndots:2 edns0\n"
    merged = poddns.resolv_conf(_pod(dnsConfig={"options": [{"name": "ndots", "value": "1"}]}),
                                "10.244.0.1", HOST_RESOLV_CONF)
    assert merged.endswith("options ndots:1\n")


def test_the_hosts_file_names_the_pod_by_its_hostname_and_subdomain():
    hosts = poddns.hosts_file(_pod(hostname="lws-0", subdomain="lws"), "10.244.1.5")
    assert "127.0.0.1\tlocalhost\n" in hosts
    assert "10.244.1.5\tlws-0.lws.team.svc.cluster.local\tlws-0\n" in hosts
    plain = poddns.hosts_file(_pod(hostAliases=[{"ip": "10.0.0.1", "hostnames": ["a", "b"]}]), "10.244.1.6")
    assert "10.244.1.6\tlws-0\n" in plain and plain.endswith("10.0.0.1\ta\tb\n")
