"""Kopf's session: requests in flight are bounded, watch streams are not, against a real HTTP
server that notes each client connection it serves."""

from __future__ import annotations

import asyncio
import ssl

from aiohttp import web

from llmfleet.k8s.kopf_session import bounded_session

WATCHES = 6
REQUEST_SLOTS = 4


def test_requests_in_flight_are_bounded_and_watch_streams_are_not():
    client_ports: set[int] = set()
    watches_open = 0

    async def scenario() -> list[dict]:
        nonlocal watches_open
        release_watches = asyncio.Event()

        async def handle(request: web.Request) -> web.StreamResponse:
            nonlocal watches_open
            client_ports.add(request.transport.get_extra_info("peername")[1])
            if request.query.get("watch") == "true":
                response = web.StreamResponse()
                await response.prepare(request)
                watches_open += 1
                await release_watches.wait()
                return response
            await asyncio.sleep(0.05)  # slow enough that forty requests overlap
            return web.json_response({"path": request.path})

        app = web.Application()
        app.router.add_get("/{path:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        session = bounded_session(ssl.create_default_context(), {}, request_slots=REQUEST_SLOTS)
        try:
            watches = [asyncio.create_task(session.get(f"{url}/api/v1/pods", params={"watch": "true"}))
                       for _ in range(WATCHES)]
            async with asyncio.timeout(10):
                while watches_open < WATCHES:  # more streams than request slots, all open
                    await asyncio.sleep(0.01)

                async def get(index: int) -> dict:
                    async with session.get(f"{url}/api/v1/namespaces/n/pods/p{index}") as response:
                        return await response.json()
                answers = await asyncio.gather(*(get(index) for index in range(40)))
            release_watches.set()
            for watch in watches:
                (await watch).release()
        finally:
            await session.close()
            await runner.cleanup()
        return answers

    answers = asyncio.run(scenario())
    assert [answer["path"] for answer in answers] == [f"/api/v1/namespaces/n/pods/p{i}" for i in range(40)]
    # Each stream has its own connection, the requests share at most four; unbounded, the
    # forty overlapping requests would open forty.
    assert len(client_ports) == WATCHES + REQUEST_SLOTS
