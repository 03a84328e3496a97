"""Faults the sandbox injects into one revision's engines: a canary that is slower than its
stable revision, for testing rollouts. They live at the runtime boundary, not in the product's
API: the node agent reads them when it starts a container, as a fault-injecting container
runtime would, and hands them to the engine stand-in in its environment."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

FAULTS_FILE = "faults.json"
REVISION_LABEL = "llmfleet.io/revision"
# Every prefill and decode cost of the emulated engine is multiplied by this.
SLOWDOWN_VARIABLE = "LLMFLEET_SANDBOX_SLOWDOWN"


@dataclass(frozen=True)
class Fault:
    namespace: str
    revision: str  # the pods' llmfleet.io/revision label
    slowdown: float = 1.0


def load(state_dir: Path) -> list[Fault]:
    path = state_dir / FAULTS_FILE
    return [Fault(**entry) for entry in json.loads(path.read_text())] if path.exists() else []


def save(state_dir: Path, faults: list[Fault]) -> None:
    (state_dir / FAULTS_FILE).write_text(json.dumps([asdict(fault) for fault in faults], indent=2))


def set_fault(state_dir: Path, fault: Fault) -> None:
    """Add or replace the fault of (namespace, revision); a slowdown of 1 removes it."""
    others = [f for f in load(state_dir) if (f.namespace, f.revision) != (fault.namespace, fault.revision)]
    save(state_dir, others + ([fault] if fault.slowdown != 1.0 else []))


def environment(state_dir: Path, namespace: str, labels: dict[str, str]) -> dict[str, str]:
    """The variables a starting container of this pod gets from the faults."""
    revision = labels.get(REVISION_LABEL)
    fault = next((f for f in load(state_dir) if (f.namespace, f.revision) == (namespace, revision)), None)
    return {} if fault is None else {SLOWDOWN_VARIABLE: repr(fault.slowdown)}
