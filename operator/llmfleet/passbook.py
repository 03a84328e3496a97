"""What the handlers keep about each deployment between its passes, in one object that Kopf's
memo holds (`memo.book`): no module globals for tests to poke or for two operators in one
process to share."""

from __future__ import annotations

import threading
from collections import defaultdict

from llmfleet.settings import OperatorSettings

# A failed pass (a write refused or throttled, the apiserver away) is passed again after a
# back-off that doubles with each failure in a row, as client-go's work queue requeues a failed
# key: from the first tick after FAILED_PASS_BACKOFF_BASE_S to at most FAILED_PASS_BACKOFF_MAX_S,
# rather than waiting for the resync (minutes) while the cluster is already back.
FAILED_PASS_BACKOFF_BASE_S = 2.0
FAILED_PASS_BACKOFF_MAX_S = 60.0


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
        # Deployments whose passes failed, how many times in a row, and when the ticker passes
        # them again (monotonic seconds).
        self.failures: dict[str, int] = {}
        self.retry_at_s: dict[str, float] = {}
        # Set by the first change handler: by then Kopf has filled the indexes (it runs resource
        # handlers only after), so the ticker never reads a half-listed cluster.
        self.indexes_ready = threading.Event()

    def may_observe(self, uid: str, settings: OperatorSettings, now_s: float) -> bool:
        return uid not in self.observed_at_s or now_s - self.observed_at_s[uid] >= settings.observation_interval_seconds

    def pass_failed(self, uid: str, now_s: float) -> float:
        """Schedule the retry of a failed pass; the back-off in seconds."""
        failures = self.failures[uid] = self.failures.get(uid, 0) + 1
        backoff_s = min(FAILED_PASS_BACKOFF_BASE_S * 2 ** (failures - 1), FAILED_PASS_BACKOFF_MAX_S)
        self.retry_at_s[uid] = now_s + backoff_s
        return backoff_s

    def pass_succeeded(self, uid: str) -> None:
        self.failures.pop(uid, None)
        self.retry_at_s.pop(uid, None)

    def retry_due(self, uid: str, now_s: float) -> bool:
        return self.retry_at_s.get(uid, float("inf")) <= now_s

    def retry_in_s(self, uid: str, now_s: float) -> float:
        return max(self.retry_at_s.get(uid, now_s) - now_s, 0.0)

    def known(self) -> set[str]:
        return {*self.locks, *self.last_pass_s, *self.observed_at_s, *self.gone, *self.superseded, *self.failures}

    def forget(self, uid: str) -> None:
        self.locks.pop(uid, None)
        self.last_pass_s.pop(uid, None)
        self.observed_at_s.pop(uid, None)
        self.gone.discard(uid)
        self.superseded.discard(uid)
        self.pass_succeeded(uid)
