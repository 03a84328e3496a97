"""Faults the sandbox injects into one revision's engines, for testing rollouts and recovery: a
canary that is slower than its stable revision, one whose answers drift, one that fails
requests, an engine that fails to load (its container crash-loops), an engine build whose
cache volume is full; nodes that lose power; and pods that Prometheus loses.
They live at the runtime boundary, not in the product's API: the node agent reads them when it
starts a container, as a fault-injecting container runtime would, and hands them to the engine
stand-in in its environment; it also keeps each pod's fault as it is now in a file it mounts into
the pod's containers, so that a running engine follows a changed slowdown or error rate, as
running pods slow down under a throttled GPU or a noisy neighbour; a powered-off node's agent stops heartbeating and its pods'
processes die, as when a machine is unplugged; an unscraped pod drops out of Prometheus'
service discovery, so its series end (staleness markers) while it goes on serving."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from llmfleet.render.identity import DEPLOYMENT_LABEL, REVISION_LABEL

FAULTS_FILE = "faults.json"
POWERED_OFF_FILE = "nodes-powered-off.json"
UNSCRAPED_FILE = "pods-unscraped.json"
# Every prefill and decode cost of the emulated engine is multiplied by this.
SLOWDOWN_VARIABLE = "LLMFLEET_SANDBOX_SLOWDOWN"
# Added to the chance that an output position leaves the model's reference answer.
DRIFT_VARIABLE = "LLMFLEET_SANDBOX_DRIFT"
# The share of requests the engine fails, in percent.
ERROR_PERCENT_VARIABLE = "LLMFLEET_SANDBOX_ERROR_PERCENT"
# "1": the engine fails to load, as on a GPU without the memory for it; Triton exits.
FAIL_LOAD_VARIABLE = "LLMFLEET_SANDBOX_FAIL_LOAD"
# "1": the engine build's writes fail with ENOSPC, as on a full engine cache volume.
CACHE_FULL_VARIABLE = "LLMFLEET_SANDBOX_CACHE_FULL"
# Where, in a pod's containers, the node agent keeps the pod's fault as it is now (the directory
# is mounted read-only; the file in it is replaced whole), and the variable that names the file.
LIVE_DIRECTORY = "/run/llmfleet-sandbox"
LIVE_FILE = "fault.json"
LIVE_FAULT_VARIABLE = "LLMFLEET_SANDBOX_LIVE_FAULT_FILE"
# A running engine reads its live fault at most this often: a throttle shows within a second.
LIVE_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Fault:
    """A revision hash is not unique within a namespace (two deployments of the same model and plan
    share it), so a fault names the deployment too."""

    namespace: str
    deployment: str  # the pods' llmfleet.io/deployment label
    revision: str  # the pods' llmfleet.io/revision label
    slowdown: float = 1.0
    drift: float = 0.0
    error_percent: float = 0.0
    fail_load: bool = False
    cache_full: bool = False

    def problems(self) -> list[str]:
        """What is out of range, by flag."""
        problems = []
        if not self.slowdown > 0:
            problems.append(f"--slowdown must be greater than 0, got {self.slowdown:g}")
        if not 0 <= self.drift <= 1:
            problems.append(f"--drift is a per-token probability within [0, 1], got {self.drift:g}")
        if not 0 <= self.error_percent <= 100:
            problems.append(f"--error-percent must be within [0, 100], got {self.error_percent:g}")
        return problems

    @property
    def harmless(self) -> bool:
        return (self.slowdown == 1.0 and self.drift == 0.0 and self.error_percent == 0.0 and not self.fail_load
                and not self.cache_full)

    def describe(self) -> str:
        effects = [f"{self.slowdown:g}x slower"] if self.slowdown != 1.0 else []
        effects += [f"answers drifting {self.drift:g} per token"] if self.drift else []
        effects += [f"failing {self.error_percent:g}% of requests"] if self.error_percent else []
        effects += ["failing to load"] if self.fail_load else []
        effects += ["building into a full engine cache"] if self.cache_full else []
        return ", ".join(effects) or "no fault"

    @property
    def target(self) -> tuple[str, str, str]:
        return self.namespace, self.deployment, self.revision


def _from_dict(entry: dict) -> Fault:
    known = {f.name for f in fields(Fault)}
    return Fault(**{k: v for k, v in entry.items() if k in known})


def _write_whole(path: Path, text: str) -> None:
    """Written whole, then renamed: other processes poll these files."""
    staging = path.with_name(f"{path.name}.new")
    staging.write_text(text)
    staging.replace(path)


def load(state_dir: Path) -> list[Fault]:
    path = state_dir / FAULTS_FILE
    return [_from_dict(entry) for entry in json.loads(path.read_text())] if path.exists() else []


def save(state_dir: Path, faults: list[Fault]) -> None:
    _write_whole(state_dir / FAULTS_FILE, json.dumps([asdict(fault) for fault in faults], indent=2))


def set_fault(state_dir: Path, fault: Fault) -> None:
    """Add or replace the fault of (namespace, deployment, revision); a harmless one removes it."""
    others = [f for f in load(state_dir) if f.target != fault.target]
    save(state_dir, others + ([] if fault.harmless else [fault]))


def pod_fault(state_dir: Path, namespace: str, labels: dict[str, str]) -> Fault | None:
    """The fault of the pod with these labels in `namespace`, if any."""
    target = (namespace, labels.get(DEPLOYMENT_LABEL), labels.get(REVISION_LABEL))
    return next((f for f in load(state_dir) if f.target == target), None)


def environment(state_dir: Path, namespace: str, labels: dict[str, str]) -> dict[str, str]:
    """The variables a starting container of this pod gets from the faults."""
    fault = pod_fault(state_dir, namespace, labels)
    if fault is None:
        return {}
    variables = {SLOWDOWN_VARIABLE: fault.slowdown, DRIFT_VARIABLE: fault.drift,
                 ERROR_PERCENT_VARIABLE: fault.error_percent}
    return {**{name: repr(value) for name, value in variables.items()},
            FAIL_LOAD_VARIABLE: "1" if fault.fail_load else "0", CACHE_FULL_VARIABLE: "1" if fault.cache_full else "0"}


def injected(environ: dict[str, str]) -> Fault:
    """The faults a container was started with (`environment`); whose pod it is, is not known
    there."""
    return Fault("", "", "", float(environ.get(SLOWDOWN_VARIABLE, "1")), float(environ.get(DRIFT_VARIABLE, "0")),
                 float(environ.get(ERROR_PERCENT_VARIABLE, "0")), environ.get(FAIL_LOAD_VARIABLE) == "1",
                 environ.get(CACHE_FULL_VARIABLE) == "1")


def write_live(directory: Path, fault: Fault | None) -> None:
    """Keep `fault` (None: none) in the pod's live-fault directory, which its containers mount at
    LIVE_DIRECTORY."""
    _write_whole(directory / LIVE_FILE, json.dumps(asdict(fault or Fault("", "", ""))))


class LiveFault:
    """A running container's fault: the one it was started with (`injected`), then, where the
    node agent names a live-fault file (LIVE_FAULT_VARIABLE), what that file says, read at most
    every LIVE_POLL_SECONDS. Only what a running engine can change with takes effect: its
    slowdown and error rate; drift, a failed load and a full cache apply at the next start."""

    def __init__(self, environ: dict[str, str], clock: Callable[[], float] = time.monotonic):
        self._path = Path(environ[LIVE_FAULT_VARIABLE]) if environ.get(LIVE_FAULT_VARIABLE) else None
        self._fault = injected(environ)
        self._clock = clock
        self._next_read_s = clock()
        self._lock = threading.Lock()

    def __call__(self) -> Fault:
        with self._lock:
            if self._path is not None and self._clock() >= self._next_read_s:
                self._next_read_s = self._clock() + LIVE_POLL_SECONDS
                try:
                    self._fault = _from_dict(json.loads(self._path.read_text()))
                except (OSError, ValueError):  # not written yet, or unreadable: the last one stands
                    pass
            return self._fault


def _read_names(path: Path) -> set[str]:
    return set(json.loads(path.read_text())) if path.exists() else set()


def _toggle_name(path: Path, name: str, present: bool) -> None:
    names = _read_names(path)
    names = names | {name} if present else names - {name}
    _write_whole(path, json.dumps(sorted(names)))


def powered_off_nodes(state_dir: Path) -> set[str]:
    return _read_names(state_dir / POWERED_OFF_FILE)


def set_node_power(state_dir: Path, node_name: str, on: bool) -> None:
    _toggle_name(state_dir / POWERED_OFF_FILE, node_name, not on)


def unscraped_pods(state_dir: Path) -> set[str]:
    """"namespace/name" of the pods service discovery leaves out."""
    return _read_names(state_dir / UNSCRAPED_FILE)


def set_pod_scraped(state_dir: Path, namespace: str, pod_name: str, scraped: bool) -> None:
    _toggle_name(state_dir / UNSCRAPED_FILE, f"{namespace}/{pod_name}", not scraped)
