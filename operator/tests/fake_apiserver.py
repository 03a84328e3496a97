"""A Kubernetes API server that answers just enough for the operator to start, in a thread:
discovery, lists (one namespace, nothing else), watch streams that send a bookmark and end
soon after, Events, and Leases kept in memory. For tests of how the operator process lives and dies, not of what it applies."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path

import yaml
from aiohttp import web

from llmfleet.api import GROUP, KIND, PLURAL, VERSION

NAMESPACE = "serving"
_CORE_RESOURCES = [{"name": "namespaces", "kind": "Namespace", "namespaced": False, "singularName": "namespace",
                    "verbs": ["list", "watch", "get"]},
                   {"name": "events", "kind": "Event", "namespaced": True, "singularName": "event",
                    "verbs": ["create"]}]
_GROUP_RESOURCES = {
    ("apiextensions.k8s.io", "v1"): [{"name": "customresourcedefinitions", "kind": "CustomResourceDefinition",
                                      "namespaced": False, "singularName": "customresourcedefinition",
                                      "verbs": ["list", "watch", "get"]}],
    ("coordination.k8s.io", "v1"): [{"name": "leases", "kind": "Lease", "namespaced": True, "singularName": "lease",
                                     "verbs": ["create", "get", "update"]}],
    (GROUP, VERSION): [{"name": PLURAL, "kind": KIND, "namespaced": True, "singularName": KIND.lower(),
                        "verbs": ["list", "watch", "get", "patch"]}],
}


def _answer(body: dict):
    async def handle(_request: web.Request) -> web.Response:
        return web.json_response(body)
    return handle


class FakeApiServer:
    """Serves on 127.0.0.1 from `start()` until `stop()`; `leases` holds the Leases written."""

    def __init__(self, watch_seconds: float = 0.5) -> None:
        # How long each watch request is held open: the apiserver ends one after its
        # timeoutSeconds; sooner here, so that the operator always has a watch about to reopen.
        self.watch_seconds = watch_seconds
        self.leases: dict[tuple[str, str], dict] = {}
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-apiserver", daemon=True)
        self._resource_version = 0

    def start(self) -> FakeApiServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        return path

    def holder(self, namespace: str, name: str) -> str | None:
        return ((self.leases.get((namespace, name)) or {}).get("spec") or {}).get("holderIdentity")

    async def _close(self) -> None:
        self._closing.set()  # ends the watch streams, which the runner waits for
        await self._runner.cleanup()

    async def _serve(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application()
        app.router.add_get("/version", _answer({"major": "1", "minor": "31", "gitVersion": "v1.31.0"}))
        app.router.add_get("/api", _answer({"kind": "APIVersions", "versions": ["v1"]}))
        app.router.add_get("/api/v1", _answer({"kind": "APIResourceList", "groupVersion": "v1",
                                               "resources": _CORE_RESOURCES}))
        app.router.add_get("/apis", self._groups)
        for (group, version), resources in _GROUP_RESOURCES.items():
            app.router.add_get(f"/apis/{group}/{version}", _answer(
                {"kind": "APIResourceList", "groupVersion": f"{group}/{version}", "resources": resources}))
        leases = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        app.router.add_get(leases + "/{name}", self._read_lease)
        app.router.add_post(leases, self._write_lease)
        app.router.add_put(leases + "/{name}", self._write_lease)
        app.router.add_post("/api/v1/namespaces/{namespace}/events", self._accept)
        app.router.add_get("/{path:.*}", self._list_or_watch)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def _groups(self, _request: web.Request) -> web.Response:
        groups = [{"name": group, "versions": [{"groupVersion": f"{group}/{version}", "version": version}],
                   "preferredVersion": {"groupVersion": f"{group}/{version}", "version": version}}
                  for group, version in _GROUP_RESOURCES]
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    def _next_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            items = [{"metadata": {"name": NAMESPACE, "uid": f"{NAMESPACE}-uid", "resourceVersion": "1"}}] \
                if request.path == "/api/v1/namespaces" else []
            return web.json_response({"items": items, "metadata": {"resourceVersion": self._next_version()}})
        # A healthy idle watch: a bookmark at once, then nothing until it ends.
        response = web.StreamResponse()
        await response.prepare(request)
        bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": self._next_version()}}}
        await response.write(json.dumps(bookmark).encode() + b"\n")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), self.watch_seconds)
        return response

    async def _read_lease(self, request: web.Request) -> web.Response:
        lease = self.leases.get((request.match_info["namespace"], request.match_info["name"]))
        if lease is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(lease)

    async def _write_lease(self, request: web.Request) -> web.Response:
        lease = await request.json()
        lease["metadata"]["resourceVersion"] = self._next_version()
        self.leases[request.match_info["namespace"], lease["metadata"]["name"]] = lease
        return web.json_response(lease, status=201 if request.method == "POST" else 200)

    async def _accept(self, request: web.Request) -> web.Response:
        return web.json_response(await request.json(), status=201)
