"""The build step: where the revision's build (or prepare) Job is."""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api import Reason
from llmfleet.reconcile.context import Children


@dataclass(frozen=True)
class BuildState:
    finished: bool
    failed: bool
    reason: str
    message: str


def build_state(children: Children, revision: str, last_failure: str | None = None) -> BuildState:
    """Where the revision's build (or prepare) Job is; `last_failure` what its last failed pod
    said (`failing_build`, `last_build_failure`), quoted while it retries and once it failed."""
    why = f"; last failure: {last_failure}" if last_failure else ""
    job = children.build_jobs.get(revision)
    if job is None:
        return BuildState(False, False, Reason.BUILD_PENDING, "the Job filling the engine cache is being created")
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition["type"] in ("Complete", "SuccessCriteriaMet"):
            return BuildState(True, False, Reason.ENGINE_READY,
                              f"engine cache entry ready (Job {job['metadata']['name']})")
        if condition["type"] in ("Failed", "FailureTarget"):
            reason = condition.get("reason") or "BackoffLimitExceeded"
            return BuildState(False, True, Reason.BUILD_FAILED,
                              f"Job {job['metadata']['name']} failed ({reason}): "
                              f"{condition.get('message') or 'see the Job pod logs'}{why}")
    failed_attempts = status.get("failed") or 0
    retrying = (f"; {failed_attempts} attempt{'s' if failed_attempts != 1 else ''} failed, retried with the "
                f"Job's backoff (backoffLimit {(job.get('spec') or {}).get('backoffLimit', 6)})"
                if failed_attempts else "")
    return BuildState(False, False, Reason.BUILDING,
                      f"Job {job['metadata']['name']} is filling the engine cache{retrying}{why if retrying else ''}")
