"""What the handlers keep about each deployment between its passes, in one object that Kopf's
memo holds (`memo.book`): no module globals for tests to poke or for two operators in one
process to share."""

from __future__ import annotations

import threading
from collections import defaultdict

from llmfleet.settings import OperatorSettings


class PassBook:
    def __init__(self) -> None:
        # Change handlers and the queue's workers run in different threads; one object
        # reconciles at a time.
        self.locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        # When each object's last pass ended (monotonic seconds), for the resync.
        self.last_pass_s: dict[str, float] = {}
        # Deployments found gone, or in a namespace being deleted: the ticker marks them no more.
        self.gone: set[str] = set()
        # When each object's traffic was last read (monotonic seconds): an observation that told
        # nothing new is not written to status, so status alone cannot pace them.
        self.observed_at_s: dict[str, float] = {}
        # Deployments whose last pass lost its status write to a newer version: the ticker passes
        # them again. Nothing else would: the newer version is often the pass's own status, which
        # triggers no handler, and its children may have nothing more to say (seen in e2e
        # test_faults: a pass that saw both replicas ready lost to one that had not, and Ready
        # stayed False for minutes).
        self.superseded: set[str] = set()
        # Set by the first change handler: by then Kopf has filled the indexes (it runs resource
        # handlers only after), so the ticker never reads a half-listed cluster.
        self.indexes_ready = threading.Event()

    def may_observe(self, uid: str, settings: OperatorSettings, now_s: float) -> bool:
        return uid not in self.observed_at_s or now_s - self.observed_at_s[uid] >= settings.observation_interval_seconds

    def known(self) -> set[str]:
        return {*self.locks, *self.last_pass_s, *self.observed_at_s, *self.gone, *self.superseded}

    def forget(self, uid: str) -> None:
        self.locks.pop(uid, None)
        self.last_pass_s.pop(uid, None)
        self.observed_at_s.pop(uid, None)
        self.gone.discard(uid)
        self.superseded.discard(uid)
