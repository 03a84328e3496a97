"""Kopf's own connection to the apiserver, with its requests bounded.

Kopf's client opens a connection for every request in flight and its pool has no limit; each
TLS connection holds some 200 KiB of buffers (asyncio's 128 KiB SSL buffer, aiohttp's reads,
OpenSSL's), and glibc keeps much of a burst's peak after it frees it. With a thousand objects'
handlers finishing together the operator held 470 connections. Here at most
`REQUESTS_IN_FLIGHT` requests are in flight and each is read whole before its slot is freed,
so its connection is back in the pool by then; watch streams, which hold theirs for as long as
they run and number one per kind and watched namespace, are not counted.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

# Requests (patches, lists, events) in flight at once, each on a connection of its own.
REQUESTS_IN_FLIGHT = 32


def _requests_bounded(slots: int):
    in_flight = asyncio.Semaphore(slots)

    async def middleware(request: aiohttp.ClientRequest, handler) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") == "true":
            return await handler(request)
        async with in_flight:
            response = await handler(request)
            await response.read()  # kept for the caller's .json(); the connection goes back now
            return response

    return middleware


def bounded_session(ssl_context: ssl.SSLContext, headers: dict[str, str], proxy: str | None = None,
                    trust_env: bool = False, request_slots: int = REQUESTS_IN_FLIGHT) -> aiohttp.ClientSession:
    """A session as Kopf builds its own from its login, with at most `request_slots` requests in
    flight besides watch streams."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=ssl_context), headers=headers, proxy=proxy,
        trust_env=trust_env, middlewares=(_requests_bounded(request_slots),))
