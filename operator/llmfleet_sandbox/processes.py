"""Start sandbox daemons detached, remember them by pid, and stop them again.

A pid file holds the pid and the process start time from /proc, so that a
stale file left by a crash never makes `down` signal an unrelated process that
reused the pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces; fields after it are space separated.
    fields_after_name = stat.rsplit(")", 1)[1].split()
    state = fields_after_name[0]
    if state in ("Z", "X"):
        return None
    return int(fields_after_name[19])


@dataclass(frozen=True)
class RecordedProcess:
    name: str
    pid: int
    start_ticks: int

    def alive(self) -> bool:
        return process_start_ticks(self.pid) == self.start_ticks


class ProcessTable:
    """Pid files of the sandbox daemons, one per name."""

    def __init__(self, pids_dir: Path, logs_dir: Path):
        self.pids_dir = pids_dir
        self.logs_dir = logs_dir

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> RecordedProcess:
        self.pids_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.logs_dir / f"{name}.log", "ab")
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=cwd, start_new_session=True,
            )
        finally:
            log.close()
        ticks = None
        while ticks is None and process.poll() is None:
            ticks = process_start_ticks(process.pid)
        if ticks is None:
            raise RuntimeError(
                f"{name} exited at once with code {process.returncode}; "
                f"see {self.logs_dir / (name + '.log')}"
            )
        record = RecordedProcess(name, process.pid, ticks)
        (self.pids_dir / f"{name}.json").write_text(
            json.dumps({"pid": record.pid, "startTicks": record.start_ticks, "argv": argv})
        )
        return record

    def recorded(self) -> list[RecordedProcess]:
        if not self.pids_dir.exists():
            return []
        records = []
        for path in sorted(self.pids_dir.glob("*.json")):
            data = json.loads(path.read_text())
            records.append(RecordedProcess(path.stem, data["pid"], data["startTicks"]))
        return records

    def get(self, name: str) -> RecordedProcess | None:
        return next((r for r in self.recorded() if r.name == name), None)

    def stop(self, name: str, grace_seconds: float = 10.0) -> None:
        record = self.get(name)
        if record is not None:
            terminate_process_group(record, grace_seconds)
            (self.pids_dir / f"{name}.json").unlink(missing_ok=True)


def terminate_process_group(record: RecordedProcess, grace_seconds: float) -> None:
    """SIGTERM the daemon's session, wait, then SIGKILL whatever is left."""
    if not record.alive():
        return
    try:
        os.killpg(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not record.alive():
            break
        _reap(record.pid)
        time.sleep(0.1)
    try:
        os.killpg(record.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(record.pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
