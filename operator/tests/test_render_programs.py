"""Every program a container of the Triton image runs by name is one the pinned release's record
says the image has (`executables`, each with its source): the serving container and its preStop
drain, a group's leader and worker, the engine build and the model repository's assembly, for
both runtimes. Programs given by path are held to the record's image paths (test_render.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmfleet.api import LLMDeployment
from llmfleet.catalog.release_record import load_release_record
from llmfleet.planner import plan
from llmfleet.planner.spec_adapter import plan_request_from_spec
from llmfleet.render import RenderSettings, render, revision_hash
from llmfleet_dev.release_checks import check_programs, command_programs, script_programs
from render_builders import manifest

RELEASES = {"engine": "engine-24.12", "llmapi": "llmapi-25.05"}


def _pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] == "LeaderWorkerSet":
        group = obj["spec"]["leaderWorkerTemplate"]
        return [group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]]
    template = (obj.get("spec") or {}).get("template")
    return [template["spec"]] if template else []


def _programs(runtime: str, tensor_parallel_size: int, nodes: int, image: str) -> dict[str, set[str]]:
    """Programs by container name, of the containers that run `image`."""
    body = manifest(tensor_parallel_size, quantization="BF16" if runtime == "llmapi" else "FP8")
    body["spec"]["engine"]["runtime"] = runtime
    deployment = LLMDeployment.from_manifest(body)
    chosen = plan(plan_request_from_spec(deployment.spec))
    if nodes > 1:
        chosen = replace(chosen, pipeline_parallel_size=nodes, nodes_per_replica=nodes)
    objects = render(deployment, chosen, revision_hash(deployment.spec, chosen), RenderSettings(), serving_replicas=1)
    programs: dict[str, set[str]] = {}
    for obj in objects:
        for spec in _pod_specs(obj):
            for container in [*spec.get("initContainers", ()), *spec["containers"]]:
                if container["image"] != image:
                    continue
                pre_stop = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
                found = command_programs([*container.get("command", ()), *container.get("args", ())])
                found |= command_programs(pre_stop.get("command", []))
                key = f"{obj['kind']}/{container['name']}"
                programs[key] = programs.get(key, set()) | found
    return programs


@pytest.mark.parametrize("runtime,tensor_parallel_size,nodes", [
    ("engine", 1, 1), ("engine", 2, 1), ("engine", 8, 2), ("llmapi", 1, 1), ("llmapi", 2, 1)])
def test_every_program_the_image_runs_by_name_is_recorded_present(runtime, tensor_parallel_size, nodes):
    record = load_release_record(RELEASES[runtime])
    programs = _programs(runtime, tensor_parallel_size, nodes, record.image)
    everything = set().union(*programs.values())
    # Not vacuous: the server and its drain are among them, and a group's worker waits with bash.
    assert {"tritonserver", "python3"} <= everything, programs
    if nodes > 1:
        assert {"bash", "timeout", "sleep"} <= programs["LeaderWorkerSet/triton"], programs
    assert check_programs(record, everything) == [], programs


def test_the_check_names_a_program_the_record_does_not_know():
    record = load_release_record(RELEASES["engine"])
    assert check_programs(record, ["python3", "jq"]) == [
        f"program jq is not in the record (unknown whether {record.image} has it)"]


def test_programs_are_read_where_a_shell_runs_them_and_nowhere_else():
    script = ("set -eu  # rm here is a comment\n"
              'LEVEL=1 grep -q x file | sort > "$out" 2>/dev/null && exec timeout 5s curl -s url\n'
              'if [ -f x ]; then echo "ls in quotes" ; fi\n'
              'until [ "`kubectl get pod`" = Running ]; do sleep 1; done\n'
              "((failures += 1))\n"
              "bash -c 'exec 3<>/dev/tcp/$0/$1; jq .' host 8001\n"
              "/opt/tools/by-path --flag; \"$@\"\n")
    assert script_programs(script) == {"grep", "sort", "timeout", "curl", "kubectl", "sleep", "bash", "jq"}
    assert command_programs(["/bin/bash", "-c", 'exec "$@"', "name", "mpirun", "-n", "1", "tritonserver", ":",
                             "-n", "1", "tritonserver"]) == {"mpirun", "tritonserver"}
