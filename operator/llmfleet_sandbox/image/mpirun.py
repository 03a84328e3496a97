"""The image's `mpirun` (OpenMPI), as a TP/PP serving pod uses it: one tritonserver per rank.

Real ranks share one GPU group: rank 0's server loads every model and serves, the others load
only `tensorrt_llm` and work as its MPI ranks, never serving. The emulated engine has no ranks
(one process models the whole group; its profile accounts for TP, PP and the hand-offs between
nodes), so this stand-in checks the command line against the release's record and, for a group
over several pods (`--host` and an rsh agent, upstream's LeaderWorkerSet recipe), against the
LeaderWorkerSet record as well (`llmfleet_dev.release_checks`, the checks the render tests make).
It then runs rank 0's program in the foreground, with OpenMPI's variables: the world's size,
rank 0's number and the ranks on rank 0's host (the emulated engine places its pipeline by them).

A group's other ranks would start through the rsh agent (`kubectl exec` into each pod); the
sandbox's node agent serves no kubelet API, so no exec can run there. Instead the stand-in checks
what that launch relies on and fails as mpirun would when it does not hold (`group_hosts`): the
agent exists and is executable, the first host is this pod, and every other host is a Running pod
of this namespace, read with this pod's ServiceAccount as the agent's kubectl would, reachable
from this pod at its stable address (`<hostname>.<subdomain>.<namespace>`). While rank 0 runs it
stays as mpirun does, passing signals on to rank 0, and when another host's container, where that
host's ranks would run, ends or restarts, it kills rank 0 and exits 1, as OpenMPI aborts a job that
lost a remote daemon: the engine cannot step without its other ranks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass

from llmfleet_sandbox.emulator.profile import MPI_LOCAL_SIZE_VARIABLE
from llmfleet_sandbox.image.group_hosts import GroupLaunchError, GroupWatch, Host, check_group

# Options that take no value (the ones a serving command uses, and harmless others).
SWITCHES = ("--allow-run-as-root", "--oversubscribe", "--tag-output", "-q", "--quiet", "--report-bindings")
# Options before the first app context that take values: -np (the world), --host, -mca <name> <value>.
PROCESS_COUNT_OPTIONS = ("-n", "-np", "--n", "--np")
HOST_OPTIONS = ("--host", "-host", "-H")
MCA_OPTIONS = ("-mca", "--mca")
# How often the other hosts are read while rank 0 runs (OpenMPI notices a lost daemon at once).
HOST_POLL_SECONDS = 1.0
# The signals mpirun passes on to its ranks (the kubelet's stop among them).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
RSH_AGENT_PARAMETER = "plm_rsh_agent"


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class AppContext:
    processes: int
    argv: list[str]


@dataclass(frozen=True)
class Command:
    contexts: list[AppContext]
    hosts: list[Host]
    mca: dict[str, str]

    @property
    def world_size(self) -> int:
        return sum(context.processes for context in self.contexts)

    @property
    def rsh_agent(self) -> str | None:
        return self.mca.get(RSH_AGENT_PARAMETER)


def parse_command(argv: list[str]) -> Command:
    """`[options] [-np N] [--host h:s,...] [-mca k v] -n N program args : -n N program args ...`."""
    contexts: list[AppContext] = []
    hosts: list[Host] = []
    mca: dict[str, str] = {}
    for number, part in enumerate(_split(argv)):
        processes, i = 1, 0
        while i < len(part) and part[i].startswith("-"):
            option = part[i]
            if option in PROCESS_COUNT_OPTIONS:
                if i + 1 >= len(part) or not part[i + 1].isdigit() or int(part[i + 1]) < 1:
                    raise UsageError(f"{option} needs a positive process count")
                processes, i = int(part[i + 1]), i + 2
            elif option in SWITCHES and number == 0:
                i += 1
            elif option in HOST_OPTIONS and number == 0:
                hosts, i = _hosts(option, part[i + 1:i + 2]), i + 2
            elif option in MCA_OPTIONS and number == 0:
                if i + 2 >= len(part):
                    raise UsageError(f"{option} needs a parameter name and a value")
                mca[part[i + 1]], i = part[i + 2], i + 3
            else:
                raise UsageError(f"unknown option {option} (the sandbox's mpirun knows {', '.join(SWITCHES)}, "
                                 f"--host and -mca before the first app context, and -n/-np in each)")
        if i >= len(part):
            raise UsageError(f"app context {number} names no executable")
        contexts.append(AppContext(processes, part[i:]))
    if hosts and sum(host.slots for host in hosts) < sum(context.processes for context in contexts):
        raise UsageError(f"{sum(context.processes for context in contexts)} ranks but only "
                         f"{sum(host.slots for host in hosts)} slots on {','.join(h.name for h in hosts)}")
    return Command(contexts, hosts, mca)


def parse(argv: list[str]) -> list[AppContext]:
    return parse_command(argv).contexts


def _hosts(option: str, value: list[str]) -> list[Host]:
    hosts = []
    for entry in (value[0].split(",") if value else []):
        name, _, slots = entry.partition(":")
        if not name or (slots and (not slots.isdigit() or int(slots) < 1)):
            raise UsageError(f"{option} {value[0]!r}: each host is <name>[:<slots>] with positive slots")
        hosts.append(Host(name, int(slots or 1)))
    if not hosts:
        raise UsageError(f"{option} needs a comma-separated host list")
    return hosts


def _split(argv: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for arg in argv:
        if arg == ":":
            parts.append([])
        else:
            parts[-1].append(arg)
    return parts


def record_problems(argv: list[str], command: Command, environ: dict[str, str]) -> list[str]:
    """The command line against the image's release record, and a group's against the
    LeaderWorkerSet record too: what the render tests check of the rendered command."""
    from llmfleet.catalog.lws_record import load_lws_record
    from llmfleet.catalog.release_record import RUNTIME_RELEASES, load_release_record
    from llmfleet.render.layout import TENSORRT_LLM_MODEL
    from llmfleet_dev.release_checks import check_group_mpirun_command, check_mpirun_command
    from llmfleet_sandbox.trtllm_image import RELEASE_VARIABLE

    # The image's release; outside an image (tests), the engine runtime's pinned one.
    record = load_release_record(environ.get(RELEASE_VARIABLE) or RUNTIME_RELEASES["engine"])
    if not command.hosts:
        return check_mpirun_command(record, ["mpirun", *argv], TENSORRT_LLM_MODEL)
    gpus = environ.get("NVIDIA_VISIBLE_DEVICES")
    gpus_per_pod = len(gpus.split(",")) if gpus else command.hosts[0].slots
    return check_group_mpirun_command(record, load_lws_record(), ["mpirun", *argv], TENSORRT_LLM_MODEL, gpus_per_pod)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        command = parse_command(argv)
    except UsageError as error:
        print(f"mpirun: {error}", file=sys.stderr)
        sys.exit(1)
    problems = record_problems(argv, command, dict(os.environ))
    if problems:
        print("mpirun (sandbox): the command line is not the recorded launch:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        sys.exit(1)
    rank_zero = command.contexts[0].argv
    binary = rank_zero[0] if os.path.sep in rank_zero[0] else shutil.which(rank_zero[0])
    if binary is None:
        print(f"mpirun: {rank_zero[0]}: executable not found in PATH", file=sys.stderr)
        sys.exit(1)
    local_ranks, watch = command.world_size, None
    if command.hosts:
        try:
            watch = check_group(command.hosts, command.rsh_agent)
        except GroupLaunchError as error:
            print(f"mpirun (sandbox): {error}", file=sys.stderr, flush=True)
            sys.exit(1)
        local_ranks = command.hosts[0].slots
    print(f"mpirun (sandbox): world size {command.world_size}, {local_ranks} on this host; rank 0 runs here, "
          "the emulated engine models the other ranks", file=sys.stderr, flush=True)
    environment = {**os.environ, "OMPI_COMM_WORLD_SIZE": str(command.world_size), "OMPI_COMM_WORLD_RANK": "0",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "0", MPI_LOCAL_SIZE_VARIABLE: str(local_ranks)}
    if watch is None:
        os.execve(binary, rank_zero, environment)
    sys.exit(supervise(binary, rank_zero, environment, watch))


def supervise(binary: str, argv: list[str], environment: dict[str, str], watch: GroupWatch) -> int:
    """Rank 0 in the foreground while the other hosts' ranks live; its exit status, or 1 once a host
    is lost (rank 0 killed)."""
    rank_zero = subprocess.Popen(argv, executable=binary, env=environment)
    forwarded: list[int] = []

    def forward(received: int, _frame) -> None:
        forwarded.append(received)
        rank_zero.send_signal(received)
    for number in FORWARDED_SIGNALS:
        signal.signal(number, forward)
    while True:
        try:
            code = rank_zero.wait(timeout=HOST_POLL_SECONDS)
        except subprocess.TimeoutExpired:
            lost = watch.lost()
            if lost is None:
                continue
            # A stopping leader loses its workers last, once its streams are done: said, not hidden.
            stopping = f" (rank 0 had signal {forwarded[-1]} and was stopping)" if forwarded else ""
            print(f"mpirun (sandbox): {lost}, and with it that host's ranks; aborting the job{stopping}, as "
                  "OpenMPI does when it loses a remote daemon", file=sys.stderr, flush=True)
            rank_zero.kill()
            rank_zero.wait()
            return 1
        return code if code >= 0 else 128 - code
