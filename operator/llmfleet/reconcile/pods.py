"""What a deployment's pods say about themselves: why they are not ready, what a failed build
container printed last. Read from pod objects the pass listed; pure."""

from __future__ import annotations

from llmfleet.catalog.lws_record import load_lws_record
from llmfleet.planner.placement import part_room
from llmfleet.planner.types import ClusterGpus, Plan

LWS = load_lws_record()


def last_build_failure(pods: list[dict]) -> str | None:
    """The newest failed container of the build pods, with the last line of its termination
    message (the log's tail: the error a failing tool prints last)."""
    failures = []
    for pod in pods:
        status = pod.get("status") or {}
        for entry in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            for state in (entry.get("state") or {}, entry.get("lastState") or {}):
                terminated = state.get("terminated") or {}
                if terminated.get("exitCode"):
                    failures.append((terminated.get("finishedAt") or "", pod["metadata"]["name"], entry["name"],
                                     terminated))
    if not failures:
        return None
    _, pod_name, container, terminated = max(failures, key=lambda failure: failure[0])
    said = _last_line(terminated.get("message"))
    return f"pod {pod_name} container {container} exited with code {terminated['exitCode']}" + (
        f": {said}" if said else "")


def _last_line(message: str | None) -> str | None:
    """The last non-empty line of a termination message: what a failing program printed last."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1] if lines else None


def not_ready_reason(pods: list[dict]) -> str | None:
    """Why pods are not ready, from the first that says: the scheduler's message for a Pending
    pod, an eviction, a waiting or crashed container's reason, or a node gone silent. A pod of a
    group (a replica spanning nodes) is named with its group and role, and every other pod of
    that group that says why is named too: the group serves only when all of them run."""
    said = [(pod, reason) for pod in pods if (reason := _pod_says(pod)) is not None]
    if not said:
        return None
    first, reason = said[0]
    group = _group_of(first)
    if group is None:
        return reason
    others = [f"{_role(pod)}: {why}" for pod, why in said[1:] if _group_of(pod) == group]
    return f"group {group[0]}-{group[1]}, " + "; ".join([f"{_role(first)}: {reason}", *others])


def a_group_pod_unschedulable(pods: list[dict]) -> bool:
    """Whether the scheduler found no node for a pod of a group: then where a part fits is worth
    saying (the scheduler's message counts nodes, it names none)."""
    return any(_group_of(pod) is not None and _unschedulable(pod) for pod in pods)


def room_for_a_part(gpus: ClusterGpus, plan: Plan) -> str:
    """Which nodes of the plan's GPU type have a group pod's GPUs free now, the deployment's own
    pods' GPUs counted as held, e.g. "nodes for a part of 8 H100-SXM-80GB: no node has 8 free;
    lacking per node: gpu-node-1 8, gpu-node-2 8"."""
    part = plan.layout.gpus // plan.nodes_per_replica
    return f"nodes for a part of {part} {plan.gpu_type}: {part_room(gpus.free_now(plan.gpu_type), part)}"


def _unschedulable(pod: dict) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _group_of(pod: dict) -> tuple[str, str] | None:
    """(LeaderWorkerSet, group index) of a group's pod, else None."""
    labels = pod["metadata"].get("labels") or {}
    name, index = labels.get(LWS.name_label), labels.get(LWS.group_index_label)
    return (name, index) if name is not None and index is not None else None


def _role(pod: dict) -> str:
    index = (pod["metadata"].get("labels") or {}).get(LWS.worker_index_label)
    return "leader" if index == LWS.leader_worker_index else f"worker {index}"


def _pod_says(pod: dict) -> str | None:
    """Why this pod is not ready, when it says."""
    status = pod.get("status") or {}
    name = pod["metadata"]["name"]
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False":
        return f"pod {name} is {status.get('phase', 'Pending')}: {scheduled.get('reason', '')}: " \
               f"{scheduled.get('message', '')}".strip()
    disruption = conditions.get("DisruptionTarget") or {}
    if disruption.get("status") == "True":
        return f"pod {name} is being evicted: {disruption.get('reason', '')}: {disruption.get('message', '')}"
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for entry in containers:
        waiting = (entry.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
            last_said = _last_line(((entry.get("lastState") or {}).get("terminated") or {}).get("message"))
            return (f"pod {name} container {entry['name']}: {waiting['reason']}{_restarts(entry)}: "
                    f"{waiting.get('message', '')}").rstrip(": ") + (f"; it last said: {last_said}"
                                                                     if last_said else "")
    # The node lifecycle controller marks a silent node's pods not ready and leaves what its
    # kubelet last reported: containers that say ready in a pod that is not.
    if (conditions.get("Ready") or {}).get("status") == "False" and (status.get("containerStatuses") or []) \
            and all(entry.get("ready") for entry in status["containerStatuses"]):
        return (f"pod {name} is not ready though its containers last reported ready: its node "
                f"{(pod.get('spec') or {}).get('nodeName', '?')} stopped reporting")
    return None


def _restarts(container_status: dict) -> str:
    """' (restarted N times, last exit code C)' for a container that has restarted, else ''."""
    count = container_status.get("restartCount") or 0
    if not count:
        return ""
    last = ((container_status.get("lastState") or {}).get("terminated") or {})
    exit_code = f", last exit code {last['exitCode']}" if last.get("exitCode") is not None else ""
    return f" (restarted {count} time{'s' if count != 1 else ''}{exit_code})"
