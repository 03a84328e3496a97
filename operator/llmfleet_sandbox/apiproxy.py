"""A fault-injecting proxy in front of the sandbox's kube-apiserver: what a broken load balancer
or an apiserver that compacted its history does to a client, injected on request.

Clusters put load balancers and proxies between clients and the apiserver, and they fail in ways
an apiserver restart does not show: a connection that stays open but forwards nothing (no event,
no close) leaves a watch silent for as long as the client waits; a client that resumes a watch
from a resourceVersion the apiserver no longer keeps gets `410 Gone`. This proxy terminates TLS
with a serving certificate from the sandbox's CA, passes every request on to the apiserver
(verified against the same CA) with the client's own credentials, so RBAC and audit see the client,
and streams the answers back. A control endpoint on loopback (plain HTTP) injects:

- `POST /silence?resource=R`: every watch stream of resource R (its plural, e.g. `llmdeployments`)
  open now forwards nothing more and stays open until the client closes it, as a broken hop does
  (what the apiserver sends meanwhile is lost). Watches opened later are passed as usual.
- `POST /expire?resource=R`: R's history is gone: the watch streams of R open now end (as at the
  apiserver's timeout), and a watch of R that resumes from a resourceVersion is answered, as the
  apiserver answers one older than its watch cache, with a `200` whose only event is an `ERROR`
  carrying a `Status` of code 410, reason `Expired` (the apiserver's watch cache answers a
  too-old version in the stream, not with an HTTP 410: `k8s.io/apiserver@v0.36.3:
  pkg/storage/cacher/cacher.go`, `Watch`). This lasts until the client lists R again, which gives it
  a current resourceVersion.
- `POST /hold?method=M&resource=R&name=N&subresource=S`: the next such request (e.g. `PATCH` of
  one LLMDeployment's `status`) is held: never passed on, never answered, until `POST /drop`, which
  closes its connection (a request that dies with its client in a load balancer).
- `GET /state`: what the proxy did (watches opened, silenced, answered 410; lists; requests held
  so far and now), for a test to check that the fault it asked for happened.
- `POST /clear`: no fault is armed any more (silent streams stay silent: they are broken).

Run as `python -m llmfleet_sandbox.apiproxy --upstream URL --ca-file FILE --tls-cert-file FILE
--tls-private-key-file FILE --ready-file FILE`; it listens on free loopback ports and writes
them to the ready file as JSON (`server`: the https URL for a kubeconfig, `control`: the control
endpoint's URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import ssl
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode
from urllib.request import Request, urlopen

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

# What a proxy does not pass on (RFC 9110 7.6.1), and what the HTTP libraries set themselves.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade"}
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length"}
# What aiohttp would add to a request that lacks them.
AUTO_HEADERS = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")
LOOPBACK = "127.0.0.1"


def resource_of(path: str) -> tuple[str | None, str | None, str | None]:
    """(plural, name, subresource) of an API path: `/apis/G/V/namespaces/NS/R/NAME/SUB`,
    `/api/v1/R/NAME`; (None, None, None) for a path that names no resource (discovery)."""
    segments = [segment for segment in path.split("/") if segment]
    if segments[:1] == ["api"]:
        rest = segments[2:]
    elif segments[:1] == ["apis"]:
        rest = segments[3:]
    else:
        return None, None, None
    if rest[:1] == ["namespaces"] and len(rest) >= 3:  # a namespaced resource, not a Namespace
        rest = rest[2:]
    padded = rest + [None, None, None]
    return padded[0], padded[1], padded[2]


def expired_event(resource_version: str) -> bytes:
    """The event the apiserver sends on a watch from a version it no longer keeps."""
    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": f"too old resource version: {resource_version}", "reason": "Expired", "code": 410}
    return json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"


@dataclass(eq=False)  # each stream is itself: kept in sets by identity
class WatchStream:
    collection: str  # the path it watches: a resource in one namespace or in all
    silent: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Hold:
    method: str
    resource: str
    name: str | None
    subresource: str | None


@dataclass
class FaultProxy:
    upstream: str
    upstream_tls: ssl.SSLContext
    watches: dict[str, set[WatchStream]] = field(default_factory=dict)
    expired: set[str] = field(default_factory=set)  # collections whose history is gone
    holds: list[Hold] = field(default_factory=list)
    held: list[asyncio.Future] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    session: ClientSession | None = None

    # -- the proxied API --------------------------------------------------------------------

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        resource, name, subresource = resource_of(request.path)
        watching = request.query.get("watch") in ("true", "1")
        if resource is not None and request.method == "GET" and name is None:
            self.counts[f"{'watches' if watching else 'lists'} {resource}"] += 1
            if not watching:
                self.expired.discard(request.path)  # the list's resourceVersion is current
        if watching and request.path in self.expired and request.query.get("resourceVersion", "0") not in ("", "0"):
            return await self._answer_expired(request, resource)
        hold = next((h for h in self.holds if h == Hold(request.method, resource, name, subresource)), None)
        if hold is not None:
            self.holds.remove(hold)
            return await self._hold(request, resource)
        headers = {key: value for key, value in request.headers.items() if key.lower() not in NOT_FORWARDED}
        body = await request.read()
        # Only what the client sent: the Python kubernetes client sends a PUT's JSON with no
        # Content-Type, which the apiserver takes, and refuses (415) aiohttp's octet-stream default.
        async with self.session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                        data=body or None, ssl=self.upstream_tls,
                                        skip_auto_headers=AUTO_HEADERS) as answer:
            reply_headers = {key: value for key, value in answer.headers.items()
                             if key.lower() not in NOT_FORWARDED}
            if not watching:
                return web.Response(status=answer.status, headers=reply_headers, body=await answer.read())
            response = web.StreamResponse(status=answer.status, headers=reply_headers)
            await response.prepare(request)
            await self._stream(answer, response, resource, request.path)
            return response

    async def _stream(self, answer, response: web.StreamResponse, resource: str, collection: str) -> None:
        stream = WatchStream(collection)
        self.watches.setdefault(resource, set()).add(stream)

        async def pump() -> None:
            async for chunk in answer.content.iter_any():
                if not stream.silent:  # a silent hop reads on and forwards nothing
                    await response.write(chunk)
            if not stream.silent:
                stream.ended.set()
        pumping = asyncio.create_task(pump())
        try:
            await stream.ended.wait()  # the apiserver ended it, or /expire did; a silent one waits on
        finally:
            pumping.cancel()
            self.watches[resource].discard(stream)
        await response.write_eof()

    async def _answer_expired(self, request: web.Request, resource: str) -> web.StreamResponse:
        self.counts[f"expired {resource}"] += 1
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(expired_event(request.query["resourceVersion"]))
        await response.write_eof()
        return response

    async def _hold(self, request: web.Request, resource: str) -> web.StreamResponse:
        self.counts[f"held {request.method} {resource}"] += 1
        dropped = asyncio.get_running_loop().create_future()
        self.held.append(dropped)
        try:
            await dropped
        finally:
            self.held.remove(dropped)
        request.transport.close()  # no answer: the connection just ends
        return web.Response(status=502)  # never reaches the client

    # -- control ----------------------------------------------------------------------------

    async def silence(self, request: web.Request) -> web.Response:
        streams = self.watches.get(request.query["resource"], set())
        for stream in streams:
            stream.silent = True
        return web.json_response({"silenced": len(streams)})

    async def expire(self, request: web.Request) -> web.Response:
        streams = list(self.watches.get(request.query["resource"], ()))
        for stream in streams:
            self.expired.add(stream.collection)
            stream.ended.set()
        return web.json_response({"ended": len(streams)})

    async def hold(self, request: web.Request) -> web.Response:
        self.holds.append(Hold(request.query["method"].upper(), request.query["resource"],
                               request.query.get("name"), request.query.get("subresource")))
        return web.json_response({"armed": len(self.holds)})

    async def drop(self, _request: web.Request) -> web.Response:
        held = list(self.held)
        for dropped in held:
            dropped.set_result(None)
        return web.json_response({"dropped": len(held)})

    async def clear(self, _request: web.Request) -> web.Response:
        self.expired.clear()
        self.holds.clear()
        return web.json_response({})

    async def state(self, _request: web.Request) -> web.Response:
        return web.json_response({"counts": dict(self.counts), "held_now": len(self.held),
                                  "watching": {resource: len(streams) for resource, streams in self.watches.items()}})


def applications(proxy: FaultProxy) -> tuple[web.Application, web.Application]:
    """The proxied API, and the control endpoint."""
    api = web.Application(client_max_size=64 * 1024 * 1024)
    api.router.add_route("*", "/{path:.*}", proxy.proxy)
    control = web.Application()
    control.router.add_post("/silence", proxy.silence)
    control.router.add_post("/expire", proxy.expire)
    control.router.add_post("/hold", proxy.hold)
    control.router.add_post("/drop", proxy.drop)
    control.router.add_post("/clear", proxy.clear)
    control.router.add_get("/state", proxy.state)
    return api, control


async def serve(args: argparse.Namespace) -> None:
    upstream_tls = ssl.create_default_context(cafile=args.ca_file)
    serving_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving_tls.minimum_version = ssl.TLSVersion.TLSv1_2
    serving_tls.load_cert_chain(args.tls_cert_file, args.tls_private_key_file)
    # No timeout: watches last as long as the apiserver keeps them; no decompression: bytes pass as sent.
    proxy = FaultProxy(args.upstream.rstrip("/"), upstream_tls)
    proxy.session = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None),
                                  auto_decompress=False)

    api, control = applications(proxy)
    addresses = {}
    # handler_cancellation: a client that goes (a watch it gave up, a killed operator) ends its handler.
    for key, app, tls in (("server", api, serving_tls), ("control", control, None)):
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        listening = socket.create_server((LOOPBACK, 0))
        await web.SockSite(runner, listening, ssl_context=tls).start()
        addresses[key] = f"{'https' if tls else 'http'}://{LOOPBACK}:{listening.getsockname()[1]}"
    written = Path(f"{args.ready_file}.partial")
    written.write_text(json.dumps(addresses))
    written.replace(args.ready_file)  # whole when it appears
    await asyncio.Event().wait()  # until killed


@dataclass(frozen=True)
class Control:
    """The test's side of the control endpoint (`url`), for the proxy serving at `server`."""

    url: str
    server: str

    @classmethod
    def of(cls, ready_file: Path) -> "Control":
        addresses = json.loads(ready_file.read_text())
        return cls(addresses["control"], addresses["server"])

    def _call(self, verb: str, path: str, **query: str) -> dict:
        address = f"{self.url}{path}" + (f"?{urlencode(query)}" if query else "")
        with urlopen(Request(address, method=verb, data=b"" if verb == "POST" else None), timeout=10) as answer:
            return json.loads(answer.read())

    def silence(self, resource: str) -> int:
        return self._call("POST", "/silence", resource=resource)["silenced"]

    def expire(self, resource: str) -> int:
        return self._call("POST", "/expire", resource=resource)["ended"]

    def hold(self, method: str, resource: str, name: str | None = None, subresource: str | None = None) -> None:
        named = {"name": name} if name else {}
        self._call("POST", "/hold", method=method, resource=resource, **named,
                   **({"subresource": subresource} if subresource else {}))

    def drop(self) -> int:
        return self._call("POST", "/drop")["dropped"]

    def clear(self) -> None:
        self._call("POST", "/clear")

    def state(self) -> dict:
        return self._call("GET", "/state")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmfleet_sandbox.apiproxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the apiserver's URL")
    parser.add_argument("--ca-file", required=True, help="the CA the apiserver's certificate is from")
    parser.add_argument("--tls-cert-file", required=True)
    parser.add_argument("--tls-private-key-file", required=True)
    parser.add_argument("--ready-file", required=True, help="where the listening URLs are written, as JSON")
    asyncio.run(serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
