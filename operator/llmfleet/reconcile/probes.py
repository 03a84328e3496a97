"""Slow reads run off the pass: the golden prompts (up to a minute a canary) and the canary's
analysis queries. A pass asks a question; it gets the answer when a probe has finished one for
that same question, and otherwise starts one (at most one per deployment and kind) and goes on
without it. A finished probe marks its deployment for another pass, which reads the answer. A
hung canary or Prometheus then holds a probe thread, never a pass worker: every other
deployment's pass goes on (Argo Rollouts runs its analysis outside the reconcile likewise)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypeVar

Answer = TypeVar("Answer")


class Asks(Protocol):
    def answer(self, uid: str, kind: str, question: object, ask: Callable[[], Answer]) -> Answer | None: ...


class AskNow:
    """Every question answered in the pass itself: for one-off passes (tests, the CLI)."""

    def answer(self, uid: str, kind: str, question: object, ask: Callable[[], Answer]) -> Answer | None:
        return ask()


class Probes:
    def __init__(self, workers: int, finished: Callable[[str], None]) -> None:
        """`finished(uid)` is called, from a probe thread, when a probe of that deployment ends."""
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="probe")
        self._finished = finished
        self._lock = threading.Lock()
        self._probes: dict[tuple[str, str], tuple[object, Future]] = {}

    def answer(self, uid: str, kind: str, question: object, ask: Callable[[], Answer]) -> Answer | None:
        """The answer of a finished probe that asked `question`, taken (the next pass that asks
        again starts a new probe); None while it runs, or when it was just started. A probe of
        another question (the canary moved on) is dropped unread. An exception `ask` raised is
        raised here, in the pass, where it is seen."""
        key = (uid, kind)
        with self._lock:
            asked, probe = self._probes.get(key, (None, None))
            if probe is not None and asked == question:
                if not probe.done():
                    return None
                del self._probes[key]
                return probe.result()
            probe = self._executor.submit(ask)
            self._probes[key] = (question, probe)
        probe.add_done_callback(lambda _: self._finished(uid))
        return None

    def forget(self, uid: str) -> None:
        """Drop a deployment's probes (a running one finishes unread)."""
        with self._lock:
            for key in [key for key in self._probes if key[0] == uid]:
                del self._probes[key]

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
