"""The pass queue: each deployment waits at most once, and is never passed twice at once."""

from __future__ import annotations

import asyncio

from llmfleet.workqueue import PassQueue


def _drain(queue: PassQueue) -> list[str]:
    async def take_all() -> list[str]:
        taken = []
        while len(queue):
            uid = await queue.take()
            taken.append(uid)
            queue.done(uid)
        return taken
    return asyncio.run(take_all())


def test_marks_while_waiting_collapse_into_one_pass_in_first_marked_order():
    queue = PassQueue()
    for uid in ("a", "b", "a", "c", "b", "a"):
        queue.add(uid)
    assert len(queue) == 3
    assert _drain(queue) == ["a", "b", "c"]


def test_a_mark_during_a_pass_waits_for_it_and_then_passes_once_more():
    async def scenario() -> list[object]:
        queue = PassQueue()
        queue.add("a")
        uid = await queue.take()
        queue.add("a")
        queue.add("a")
        seen: list[object] = [len(queue)]  # not takeable while its pass runs
        queue.done(uid)
        seen.append(len(queue))
        seen.append(await queue.take())
        queue.done("a")
        seen.append(len(queue))  # no mark during the second pass: nothing more
        return seen
    assert asyncio.run(scenario()) == [0, 1, "a", 0]


def test_a_taker_waits_until_something_is_marked():
    async def scenario() -> str:
        queue = PassQueue()
        taker = asyncio.create_task(queue.take())
        await asyncio.sleep(0)
        assert not taker.done()
        queue.add("late")
        return await asyncio.wait_for(taker, 1)
    assert asyncio.run(scenario()) == "late"
