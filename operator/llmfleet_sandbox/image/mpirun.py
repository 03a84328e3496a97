"""The image's `mpirun` (OpenMPI), as a TP/PP serving pod uses it: one tritonserver per rank.

Real ranks share one GPU group: rank 0's server loads every model and serves, the others load
only `tensorrt_llm` and work as its MPI ranks, never serving. The emulated engine has no ranks
(one process models the whole group; its profile already accounts for TP), so this stand-in
checks the MPMD command line as mpirun would take it and execs rank 0's program in the
foreground, with the world's size and rank 0's number in OpenMPI's variables.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass

# Options that take no value (the ones a serving command uses, and harmless others).
SWITCHES = ("--allow-run-as-root", "--oversubscribe", "--tag-output", "-q", "--quiet")


class UsageError(Exception):
    pass


@dataclass(frozen=True)
class AppContext:
    processes: int
    argv: list[str]


def parse(argv: list[str]) -> list[AppContext]:
    """`[options] -n N program args : -n N program args ...` -> its app contexts."""
    contexts: list[AppContext] = []
    for number, part in enumerate(_split(argv)):
        processes, i = 1, 0
        while i < len(part) and part[i].startswith("-"):
            option = part[i]
            if option in ("-n", "-np", "--n", "--np"):
                if i + 1 >= len(part) or not part[i + 1].isdigit() or int(part[i + 1]) < 1:
                    raise UsageError(f"{option} needs a positive process count")
                processes, i = int(part[i + 1]), i + 2
            elif option in SWITCHES and number == 0:
                i += 1
            else:
                raise UsageError(f"unknown option {option} (the sandbox's mpirun knows {', '.join(SWITCHES)} "
                                 "before the first app context, and -n/-np in each)")
        if i >= len(part):
            raise UsageError(f"app context {number} names no executable")
        contexts.append(AppContext(processes, part[i:]))
    return contexts


def _split(argv: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for arg in argv:
        if arg == ":":
            parts.append([])
        else:
            parts[-1].append(arg)
    return parts


def main(argv: list[str] | None = None) -> None:
    try:
        contexts = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as error:
        print(f"mpirun: {error}", file=sys.stderr)
        sys.exit(1)
    world_size = sum(context.processes for context in contexts)
    rank_zero = contexts[0].argv
    binary = rank_zero[0] if os.path.sep in rank_zero[0] else shutil.which(rank_zero[0])
    if binary is None:
        print(f"mpirun: {rank_zero[0]}: executable not found in PATH", file=sys.stderr)
        sys.exit(1)
    print(f"mpirun (sandbox): world size {world_size}; rank 0 runs here, the emulated engine models the "
          "other ranks", file=sys.stderr, flush=True)
    os.execve(binary, rank_zero, {**os.environ, "OMPI_COMM_WORLD_SIZE": str(world_size),
                                  "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
