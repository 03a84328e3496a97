"""Kopf's own connection to the apiserver, with a bounded pool.

Kopf's client opens a connection for every request in flight and its pool has no limit; each
TLS connection holds some 200 KiB of buffers (asyncio's 128 KiB SSL buffer, aiohttp's reads,
OpenSSL's), and glibc keeps much of a burst's peak after it frees it. A thousand objects'
handlers finishing together opened hundreds. Capped, requests past the cap wait for a free
connection instead. Watch streams hold theirs for as long as they run, so the cap is the watch
streams plus a share for requests; where the streams cannot be counted (namespace globs), the
pool stays unbounded.
"""

from __future__ import annotations

import aiohttp
import kopf

# Connections for requests (patches, lists, events) beside the watch streams.
REQUEST_CONNECTIONS = 32


def bounded_session(info: kopf.ConnectionInfo, connections: int) -> kopf.AiohttpSession:
    """Kopf's session for `info`, as Kopf would build it, with at most `connections`."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env)
    return kopf.AiohttpSession(server=info.server, default_namespace=info.default_namespace,
                               priority=info.priority, expiration=info.expiration, aiohttp_session=session)


def countable_namespaces(patterns: list[str]) -> int | None:
    """How many namespaces Kopf watches for these `--namespace` patterns; None for a glob or an
    exclusion, whose matches change as namespaces come and go."""
    if any(set(pattern) & set("*?[!") for pattern in patterns):
        return None
    return len(patterns)
