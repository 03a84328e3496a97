"""Which LLMDeployments are due a reconcile pass, each queued at most once.

News about a deployment (a child changed, the ticker found it due) only marks its uid; a few
workers pass the marked deployments, reading their newest state from the indexes when they
get to them. Ten events about one deployment while it waits cost one pass (each child event
used to run its owner's whole pass in Kopf's executor), and a child's event handler returns at
once instead of holding an executor thread. A deployment marked while its pass runs is passed
once more afterwards, never twice at once: the same contract as client-go's work queue.
"""

from __future__ import annotations

import asyncio


class PassQueue:
    """A FIFO of uids without duplicates. Event-loop only (not thread-safe)."""

    def __init__(self) -> None:
        self._order: asyncio.Queue[str] = asyncio.Queue()
        self._waiting: set[str] = set()
        self._passing: set[str] = set()
        self._marked_while_passing: set[str] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, uid: str) -> None:
        if uid in self._passing:
            self._marked_while_passing.add(uid)
        elif uid not in self._waiting:
            self._waiting.add(uid)
            self._order.put_nowait(uid)

    async def take(self) -> str:
        """The next uid to pass; call `done(uid)` when its pass ends, however it ends."""
        uid = await self._order.get()
        self._waiting.discard(uid)
        self._passing.add(uid)
        return uid

    def done(self, uid: str) -> None:
        self._passing.discard(uid)
        if uid in self._marked_while_passing:
            self._marked_while_passing.discard(uid)
            self.add(uid)
