"""Leader election on a coordination.k8s.io Lease, so that several operator replicas can run
and exactly one acts.

Kopf's own peering freezes every operator when two share a priority, so it cannot keep a
standby. This follows client-go's leader election instead: a replica acts only while it holds
the Lease; the holder renews it every `retry_seconds`; a standby takes it once it has gone
`lease_seconds` without renewal (the holder died) or was released (the holder stopped
cleanly). A holder that cannot renew within `renew_deadline_seconds` exits at once rather
than act beside a new leader.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def default_identity() -> str:
    """Unique per process: two replicas on one host (or a restarted one) never share it."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseTiming:
    # client-go's defaults: a dead leader is replaced within lease + retry seconds.
    lease_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    renew_time: datetime | None
    lease_seconds: int


def may_take(lease: LeaseRecord, identity: str, now: datetime) -> bool:
    """Whether `identity` may hold the lease now: it is free, released, expired, or its own."""
    if not lease.holder or lease.holder == identity or lease.renew_time is None:
        return True
    return now >= lease.renew_time + timedelta(seconds=lease.lease_seconds)


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api_client: client.ApiClient, namespace: str, name: str, identity: str,
                 timing: LeaseTiming = LeaseTiming(), clock: Clock = utc_now):
        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timing, self.clock = timing, clock
        self._renewer: threading.Thread | None = None
        self._stop_renewing = threading.Event()

    def _record(self, lease: client.V1Lease) -> LeaseRecord:
        spec = lease.spec or client.V1LeaseSpec()
        return LeaseRecord(spec.holder_identity, spec.renew_time or spec.acquire_time,
                           spec.lease_duration_seconds or self.timing.lease_seconds)

    def try_acquire_or_renew(self) -> tuple[bool, str | None]:
        """(held now, the other holder when not). A lost race (409) is simply not held."""
        now = self.clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=client.V1LeaseSpec(holder_identity=self.identity, acquire_time=_micro_time(now),
                                        renew_time=_micro_time(now), lease_transitions=0,
                                        lease_duration_seconds=self.timing.lease_seconds))
            return self._write(lambda: self.api.create_namespaced_lease(self.namespace, body))
        record = self._record(lease)
        if not may_take(record, self.identity, now):
            return False, record.holder
        spec = lease.spec or client.V1LeaseSpec()
        if spec.holder_identity != self.identity:
            spec.acquire_time = _micro_time(now)
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        else:
            spec.acquire_time = _micro_time(spec.acquire_time) if spec.acquire_time else _micro_time(now)
        spec.holder_identity, spec.renew_time = self.identity, _micro_time(now)
        spec.lease_duration_seconds = self.timing.lease_seconds
        lease.spec = spec
        # The resourceVersion read above makes this a compare-and-swap.
        return self._write(lambda: self.api.replace_namespaced_lease(self.name, self.namespace, lease))

    def _write(self, call) -> tuple[bool, str | None]:
        try:
            call()
        except ApiException as error:
            if error.status == 409:
                return False, None
            raise
        return True, None

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this replica holds the lease (True), or `stop` is set (False)."""
        announced = None
        while not stop.is_set():
            try:
                held, holder = self.try_acquire_or_renew()
            except Exception as error:  # the API refusing, or unreachable: try again
                log.warning("leader election: the lease %s/%s is unreadable: %s", self.namespace,
                            self.name, getattr(error, "reason", None) or error)
                held, holder = False, announced
            if held:
                log.info("leader election: %s holds the lease %s/%s; acting", self.identity,
                         self.namespace, self.name)
                return True
            if holder and holder != announced:
                log.info("leader election: standing by while %s holds the lease %s/%s", holder,
                         self.namespace, self.name)
                announced = holder
            stop.wait(self.timing.retry_seconds)
        return False

    def keep_renewing(self, on_lost: Callable[[str], None]) -> None:
        """Renew in the background; call `on_lost(why)` once when the lease is lost."""
        def renew() -> None:
            last_renewed = self.clock()
            while not self._stop_renewing.wait(self.timing.retry_seconds):
                try:
                    held, holder = self.try_acquire_or_renew()
                except Exception as error:  # an unreachable API must not end renewing silently
                    held, holder = False, None
                    log.warning("leader election: renewing failed: %s", getattr(error, "reason", None) or error)
                if held:
                    last_renewed = self.clock()
                elif holder:
                    return on_lost(f"{holder} took the lease")
                elif (self.clock() - last_renewed).total_seconds() > self.timing.renew_deadline_seconds:
                    return on_lost(f"not renewed for {self.timing.renew_deadline_seconds:.0f} s")
        self._renewer = threading.Thread(target=renew, name="lease-renewer", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """Stop renewing and hand the lease over at once (a clean stop: no standby waits out the
        lease). Leaves it alone when another replica holds it."""
        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join(timeout=self.timing.retry_seconds + 5)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
                log.info("leader election: released the lease %s/%s", self.namespace, self.name)
        except Exception as error:
            log.warning("leader election: the lease was not released (%s); a standby takes it "
                        "once it expires", getattr(error, "reason", None) or error)


def exit_on_lost_lease(why: str) -> None:
    """Acting beside a new leader would apply children twice: stop the process now, the way
    client-go's callers do; the pod restarts as a standby."""
    log.error("leader election: lost the lease (%s); exiting", why)
    logging.shutdown()
    os._exit(1)
