"""The sandbox's fault proxy (llmfleet_sandbox.apiproxy) in front of a stand-in apiserver: a
silenced watch forwards nothing and stays open, an expired collection answers a resumed watch
with the apiserver's in-stream 410 until it is listed again, a held request never reaches the
apiserver and is dropped unanswered; the rest passes through."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmfleet_sandbox.apiproxy import Control, FaultProxy, applications, resource_of

COLLECTION = "/apis/llmfleet.io/v1alpha1/namespaces/ns/llmdeployments"


@pytest.mark.parametrize(("path", "expected"), [
    (COLLECTION, ("llmdeployments", None, None)),
    (f"{COLLECTION}/a/status", ("llmdeployments", "a", "status")),
    ("/api/v1/namespaces/ns", ("namespaces", "ns", None)),
    ("/api/v1/namespaces/ns/pods", ("pods", None, None)),
    ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", ("leases", "l", None)),
    ("/apis/llmfleet.io/v1alpha1/llmdeployments", ("llmdeployments", None, None)),
    ("/version", (None, None, None)),
])
def test_a_path_names_its_resource_object_and_subresource(path, expected):
    assert resource_of(path) == expected


class Upstream:
    """A stand-in apiserver: a watch streams what `events` is given until it gets None."""

    def __init__(self):
        self.events: asyncio.Queue = asyncio.Queue()
        self.requests: list[str] = []
        self.headers: list[dict] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path_qs}")
        self.headers.append(dict(request.headers))
        if request.query.get("watch") != "true":
            return web.json_response({"items": [], "metadata": {"resourceVersion": "9"}})
        response = web.StreamResponse()
        await response.prepare(request)
        while (event := await self.events.get()) is not None:
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response


def scenario(test):
    """Run `test(session, api_url, control_url, upstream)` against the proxy and a stand-in."""
    async def run():
        upstream = Upstream()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", upstream.handle)
        async with TestServer(app) as upstream_server:
            proxy = FaultProxy(str(upstream_server.make_url("")).rstrip("/"), ssl.create_default_context())
            proxy.session = aiohttp.ClientSession()
            api, control = applications(proxy)
            async with TestServer(api) as api_server, TestServer(control) as control_server, \
                    aiohttp.ClientSession() as session:
                try:
                    async with asyncio.timeout(20):
                        await test(session, str(api_server.make_url("")).rstrip("/"),
                                   str(control_server.make_url("")).rstrip("/"), upstream)
                finally:
                    await upstream.events.put(None)
                    await proxy.session.close()
    asyncio.run(run())


async def _event(stream: aiohttp.ClientResponse, within_s: float = 5) -> dict | None:
    """The next event, or None at the stream's end."""
    line = await asyncio.wait_for(stream.content.readline(), within_s)
    return json.loads(line) if line else None


def test_a_silenced_watch_forwards_nothing_more_and_stays_open_after_the_apiserver_ends_it():
    async def test(session, api, control, upstream):
        async with session.get(f"{api}{COLLECTION}", params={"watch": "true", "resourceVersion": "5"}) as stream:
            await upstream.events.put({"type": "ADDED", "object": {"metadata": {"resourceVersion": "6"}}})
            assert (await _event(stream))["type"] == "ADDED"
            async with session.post(f"{control}/silence", params={"resource": "llmdeployments"}) as answer:
                assert (await answer.json())["silenced"] == 1
            await upstream.events.put({"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "7"}}})
            await upstream.events.put(None)  # the apiserver ends it
            with pytest.raises(TimeoutError):
                await _event(stream, within_s=1)  # no event, no close
            # A new watch passes as usual.
            async with session.get(f"{api}{COLLECTION}", params={"watch": "true"}) as fresh:
                await upstream.events.put({"type": "ADDED", "object": {"metadata": {"resourceVersion": "8"}}})
                assert (await _event(fresh))["type"] == "ADDED"
    scenario(test)


def test_an_expired_collection_answers_a_resumed_watch_410_in_the_stream_until_it_is_listed():
    async def test(session, api, control, upstream):
        async with session.get(f"{api}{COLLECTION}", params={"watch": "true", "resourceVersion": "5"}) as stream:
            await upstream.events.put({"type": "ADDED", "object": {"metadata": {"resourceVersion": "6"}}})
            await _event(stream)
            async with session.post(f"{control}/expire", params={"resource": "llmdeployments"}) as answer:
                assert (await answer.json())["ended"] == 1
            assert await _event(stream) is None  # ended
        for _ in range(2):  # a client that resumes again is answered again
            async with session.get(f"{api}{COLLECTION}", params={"watch": "true", "resourceVersion": "6"}) as resumed:
                assert resumed.status == 200
                error = await _event(resumed)
                assert error["type"] == "ERROR" and error["object"]["code"] == 410, error
                assert error["object"]["reason"] == "Expired"
                assert await _event(resumed) is None
        async with session.get(f"{api}{COLLECTION}") as listed:
            assert (await listed.json())["metadata"]["resourceVersion"] == "9"
        async with session.get(f"{api}{COLLECTION}", params={"watch": "true", "resourceVersion": "9"}) as watch:
            await upstream.events.put({"type": "ADDED", "object": {"metadata": {"resourceVersion": "10"}}})
            assert (await _event(watch))["type"] == "ADDED"
        async with session.get(f"{control}/state") as answer:
            assert (await answer.json())["counts"]["expired llmdeployments"] == 2
    scenario(test)


def test_a_held_request_never_reaches_the_apiserver_and_is_dropped_unanswered():
    async def test(session, api, control, upstream):
        held_path = f"{COLLECTION}/a/status"
        await asyncio.to_thread(Control(control, api).hold, "PATCH", "llmdeployments", "a", "status")
        patch = asyncio.create_task(session.patch(f"{api}{held_path}", json={"status": {}}))
        while True:
            async with session.get(f"{control}/state") as answer:
                if (await answer.json())["held_now"] == 1:
                    break
            await asyncio.sleep(0.05)
        async with session.post(f"{control}/drop") as answer:
            assert (await answer.json())["dropped"] == 1
        with pytest.raises(aiohttp.ClientError):
            await patch
        assert not [r for r in upstream.requests if r.startswith("PATCH")]
        async with session.patch(f"{api}{held_path}", json={"status": {}}) as again:  # held once only
            assert again.status == 200
        assert upstream.requests[-1] == f"PATCH {held_path}"
    scenario(test)


def test_a_request_passes_with_the_headers_the_client_sent_and_no_others():
    async def test(session, api, control, upstream):
        # As the Python kubernetes client sends an update: JSON with no Content-Type.
        async with session.put(f"{api}{COLLECTION}/a", data=b'{"spec": {}}', skip_auto_headers=("Content-Type",),
                               headers={"Authorization": "Bearer t"}) as answer:
            assert answer.status == 200
        headers = upstream.headers[-1]
        assert "Content-Type" not in headers and headers["Authorization"] == "Bearer t", headers
    scenario(test)
