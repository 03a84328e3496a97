"""The upstream record of the LeaderWorkerSet controller (``controllers/<name>.yaml``): the API fields,
labels and environment render relies on, and upstream's recipe for a Triton TensorRT-LLM rank group
over one group's pods. Facts carry their upstream source; tests check rendered groups against it."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

CONTROLLERS_DIR = "controllers"
# The version the sandbox runs (operator/controlplane/lws.sh LWS_VERSION).
LEADER_WORKER_SET = "lws-v0.9.0"


@dataclass(frozen=True)
class LwsRecord:
    version: str
    api_version: str
    kind: str
    plural: str
    spec_fields: frozenset[str]
    restart_policy: str
    startup_policy: str
    ready_replicas_field: str
    name_label: str
    group_index_label: str
    worker_index_label: str
    leader_worker_index: str
    leader_address_env: str
    group_size_env: str
    worker_index_env: str
    # The rank group's launch: mpirun's flags beyond the release's, the rsh agent's MCA
    # parameter, the flags of every rank but 0, how often the leader polls its pods.
    mpirun_flags: frozenset[str]
    rsh_agent_parameter: str
    other_rank_flags: tuple[str, ...]
    poll_seconds: int
    # (API group, resource, verbs) the leader's commands use.
    permissions: tuple[tuple[str, str, tuple[str, ...]], ...]


@functools.lru_cache(maxsize=None)
def load_lws_record(name: str = LEADER_WORKER_SET) -> LwsRecord:
    raw = yaml.safe_load(resources.files(__package__).joinpath(CONTROLLERS_DIR, f"{name}.yaml").read_text("utf-8"))
    api, labels, environment, group = raw["api"], raw["labels"], raw["environment"], raw["rank_group"]
    return LwsRecord(
        version=raw["version"], api_version=api["api_version"], kind=api["kind"], plural=api["plural"],
        spec_fields=frozenset(field["name"] for field in api["spec_fields"]),
        restart_policy=api["restart_policy"]["value"], startup_policy=api["startup_policy"]["value"],
        ready_replicas_field=api["status"]["ready_replicas"],
        name_label=labels["name"], group_index_label=labels["group_index"], worker_index_label=labels["worker_index"],
        leader_worker_index=str(labels["leader_worker_index"]),
        leader_address_env=environment["leader_address"], group_size_env=environment["group_size"],
        worker_index_env=environment["worker_index"],
        mpirun_flags=frozenset(group["mpirun_flags"]), rsh_agent_parameter=group["rsh_agent"]["parameter"],
        other_rank_flags=tuple(group["rank_flags"]["other_ranks"]), poll_seconds=int(group["poll_seconds"]),
        permissions=tuple((entry["api_group"], entry["resource"], tuple(entry["verbs"]))
                          for entry in group["permissions"]))
