"""A replica larger than a node: a LeaderWorkerSet (catalog/controllers/lws-*.yaml), one group per
replica and one pod per node in each group, every pod holding one node's share of the GPUs.

The rank group starts as upstream's LeaderWorkerSet TensorRT-LLM example starts it (the record's
rank_group): the leader waits until every pod of its group runs, then runs mpirun in the foreground
over the group's pods, named with their GPUs as slots, each remote rank started through an rsh agent
that execs into the pod; rank 0 on the leader serves, the others load only `tensorrt_llm` and serve
nothing. Workers idle; mpirun runs their ranks in them, and a stopped worker waits for its
leader to finish its streams. A dead pod or rank restarts the whole group (the record's restart
policy). The pinned Triton images have no kubectl,
so an init container copies it, and the rsh agent, from the operator's image into the leader.
"""

from __future__ import annotations

import copy
from typing import Any

from llmfleet.catalog.lws_record import LwsRecord
from llmfleet.planner.types import Plan
from llmfleet.render import layout, pod, serving
from llmfleet.render.identity import COMPONENT_LABEL
from llmfleet.render.settings import RenderSettings

WORKER_COMPONENT = "server-worker"
LAUNCHER_CONTAINER = "rank-launcher"
LAUNCHER_VOLUME = "rank-launcher"
LAUNCHER_PATH = "/opt/llmfleet/launcher"
# Where the operator's image keeps kubectl (Containerfile, stage kubectl).
OPERATOR_IMAGE_KUBECTL = "/opt/llmfleet/bin/kubectl"
KUBECTL = f"{LAUNCHER_PATH}/kubectl"
RSH_AGENT = f"{LAUNCHER_PATH}/kubessh"
# The namespace's ServiceAccount for group leaders, bound to the chart's ClusterRole of that name:
# the leader reads its group's pods and execs its ranks into them.
LAUNCHER_SERVICE_ACCOUNT = "llmfleet-rank-launcher"
POD_NAME_ENV = "POD_NAME"
GROUP_PODS_ENV = "GROUP_PODS"

# OpenMPI's rsh agent: `<agent> <host> <command...>`; the host is a pod of the group, the command
# runs in its Triton container.
RSH_AGENT_SCRIPT = f"""#!/bin/sh
pod="$1"
shift
exec {KUBECTL} exec "$pod" -c {serving.CONTAINER} -- /bin/sh -c "$*"
"""
# A stopping worker probes its leader's gRPC port every second, giving each probe this long (bash,
# name lookup and connect, on a busy node), and calls the leader gone after this many failures in a
# row, so that one slow probe does not end the leader's streams.
LEADER_PROBE_TIMEOUT_SECONDS = 5
LEADER_PROBE_FAILURES = 3


def worker_script(leader_address_env: str) -> str:
    """A worker's main process: nothing of its own. Stopped, it stays (and with it the ranks mpirun
    runs in its container, whose loss would abort the whole rank group and cut the leader's streams)
    until its leader's Triton stops answering gRPC, which Triton stops only after its in-flight
    requests finish (triton-inference-server/server@v2.53.0:src/main.cc: StopEndpoints() after
    TRITONSERVER_ServerStop), or until the kubelet kills it at the grace period. No `$(` in it: the
    kubelet expands $(NAME) of the container's variables in a command."""
    return f"""trap : TERM INT
sleep infinity &
wait
kill $! 2>/dev/null
failures=0
while [ "$failures" -lt {LEADER_PROBE_FAILURES} ]; do
  if timeout {LEADER_PROBE_TIMEOUT_SECONDS} bash -c 'exec 3<>"/dev/tcp/$0/$1"' "${leader_address_env}" {layout.GRPC_PORT} 2>/dev/null; then
    failures=0
  else
    ((failures += 1))
  fi
  sleep 1
done
"""


def wait_for_group_script(poll_seconds: int) -> str:
    """The leader's main process: wait for every pod of the group to run, then become mpirun. No
    `$(` in it: the kubelet expands $(NAME) of the container's variables in a command."""
    return f"""set -eu
for pod in ${GROUP_PODS_ENV}; do
  until [ "`{KUBECTL} get pod "$pod" -o jsonpath='{{.status.phase}}'`" = Running ]; do
    echo "waiting for pod $pod of the group to run"
    sleep {poll_seconds}
  done
done
exec "$@"
"""


def group_pod_names(nodes: int) -> list[str]:
    """The group's pods by name, the leader first, as the kubelet expands them in the leader
    (workers are named after their leader with their index: the record's pods)."""
    return [f"$({POD_NAME_ENV})", *(f"$({POD_NAME_ENV})-{index}" for index in range(1, nodes))]


def launch_command(plan: Plan, settings: RenderSettings, record: LwsRecord) -> list[str]:
    """The leader's command: the wait, then mpirun over the group's pods with one rank per GPU."""
    world_size, gpus = pod.gpus_per_replica(plan), pod.gpus_per_pod(plan)
    hosts = ",".join(f"{name}:{gpus}" for name in group_pod_names(plan.nodes_per_replica))
    other_ranks = tuple(flag.replace("<tensorrt_llm model name>", layout.TENSORRT_LLM_MODEL)
                        for flag in record.other_rank_flags)
    return ["/bin/bash", "-c", wait_for_group_script(record.poll_seconds), "rank-group",
            serving.MPIRUN, *serving.MPIRUN_FLAGS, "--report-bindings", "-mca", record.rsh_agent_parameter, RSH_AGENT,
            "-np", str(world_size), "--host", hosts, *serving.rank_contexts(world_size, settings, other_ranks)]


def _launcher(settings: RenderSettings) -> dict[str, Any]:
    """Init container: kubectl and the rsh agent into the leader's launcher volume."""
    script = (f'set -eu\ncp "{OPERATOR_IMAGE_KUBECTL}" "{KUBECTL}"\n'
              f"cat > \"{RSH_AGENT}\" <<'AGENT'\n{RSH_AGENT_SCRIPT}AGENT\nchmod 0555 \"{RSH_AGENT}\"\n")
    return {"name": LAUNCHER_CONTAINER, "image": settings.model_code_image, "command": ["/bin/sh", "-c", script],
            "volumeMounts": [{"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_PATH}], **pod.container_defaults()}


def leader_template(base: dict[str, Any], plan: Plan, settings: RenderSettings, record: LwsRecord) -> dict[str, Any]:
    """The serving pod template, its Triton container running the launch."""
    template = copy.deepcopy(base)
    spec = template["spec"]
    (server,) = spec["containers"]
    server["command"] = launch_command(plan, settings, record)
    server["env"] += [{"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                      {"name": GROUP_PODS_ENV, "value": " ".join(group_pod_names(plan.nodes_per_replica))}]
    server["volumeMounts"].append({"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_PATH, "readOnly": True})
    spec["serviceAccountName"] = LAUNCHER_SERVICE_ACCOUNT
    spec["initContainers"].append(_launcher(settings))
    spec["volumes"].append({"name": LAUNCHER_VOLUME, "emptyDir": {}})
    return template


def worker_template(base: dict[str, Any], record: LwsRecord) -> dict[str, Any]:
    """The serving pod template (GPUs, model repository, engine cache: its ranks read them), its
    Triton container idle and serving nothing, so neither probed nor scraped, and without the
    leader's preStop: it stops when its leader has (`worker_script`)."""
    template = copy.deepcopy(base)
    template["metadata"] = {"labels": {**base["metadata"]["labels"], COMPONENT_LABEL: WORKER_COMPONENT}}
    (server,) = template["spec"]["containers"]
    for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle"):
        del server[key]
    server["command"] = ["/bin/bash", "-c", worker_script(record.leader_address_env)]
    return template


def leader_worker_set(metadata: dict[str, Any], plan: Plan, base: dict[str, Any], serving_replicas: int,
                      settings: RenderSettings, record: LwsRecord) -> dict[str, Any]:
    """`serving_replicas` groups of `nodes_per_replica` pods."""
    return {
        "apiVersion": record.api_version,
        "kind": record.kind,
        "metadata": metadata,
        "spec": {
            "replicas": serving_replicas,
            "startupPolicy": record.startup_policy,
            "leaderWorkerTemplate": {
                "size": plan.nodes_per_replica,
                "restartPolicy": record.restart_policy,
                "leaderTemplate": leader_template(base, plan, settings, record),
                "workerTemplate": worker_template(base, record),
            },
        },
    }


def launcher_prerequisites(namespace: str, cluster_role: str) -> list[dict[str, Any]]:
    """The namespace's group leaders may read its pods and exec into them (the chart's ClusterRole)."""
    return pod.bound_service_account(LAUNCHER_SERVICE_ACCOUNT, namespace, cluster_role)
