"""One pod's life on a sandbox node: network, volumes, containers, probes, status.

Each container runs in the pod's network namespace and a mount namespace of its own whose root
shows the host, the image's files and the pod's volumes at their paths (see `rootfs`).

Nothing that fails here leaves a pod silent, as nothing does on a kubelet: a pod sandbox that
cannot be set up (its network namespace, directories, /etc files) is torn down, reported
(FailedCreatePodSandBox) and set up again after a back-off; a container that cannot be created
(its image, its configuration, its process) waits with the kubelet's reason and the cause
(ErrImagePull, CreateContainerConfigError, CreateContainerError), gets a Warning event and is
tried again after a back-off; any other failure of a pass is reported (FailedSync) and the pass
retried after a back-off. Each failure's traceback goes to the agent's log. The back-off is the
kubelet's: 10 s, doubling each failure in a row, at most 5 min.

A PodWorker thread owns everything local about one pod. It reports status to
the apiserver the way the kubelet does: honestly, from the processes it runs. It reaches its node
agent only through `NodeServices`, as the kubelet's pod workers reach the kubelet through a narrow
interface, so this module never imports the agent.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import urllib3
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from llmfleet.gpu_discovery import GPU_PRODUCT_LABEL, GPU_RESOURCE
from llmfleet_sandbox import faults, images, network, poddns, rootfs
from llmfleet_sandbox.config import SandboxConfig
from llmfleet_sandbox.probes import ProbeState, new_probe, run_lifecycle_hook, run_probe
from llmfleet_sandbox.volumes import (
    Volume,
    VolumeBuilder,
    VolumeError,
    container_mounts,
    field_ref_value,
)

LOOP_SECONDS = 0.25
# The pod's directory its containers see at faults.LIVE_DIRECTORY.
LIVE_FAULT_DIRECTORY = "fault"
BACKOFF_INITIAL_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0
# A container that ran this long without crashing starts its backoff afresh.
BACKOFF_RESET_SECONDS = 600.0
EXIT_CODE_SIGNAL_OFFSET = 128
# The kubelet's limits on a termination message taken from the log (FallbackToLogsOnError).
TERMINATION_MESSAGE_MAX_BYTES = 2048
TERMINATION_MESSAGE_MAX_LINES = 80
NSENTER = shutil.which("nsenter") or "nsenter"
# The kubelet's reason for a pod it cannot admit (e.g. its device manager has too few GPUs left).
ADMISSION_ERROR_REASON = "UnexpectedAdmissionError"


class PodSandboxError(Exception):
    """The pod's sandbox (network namespace, directories, /etc files) could not be set up."""


def next_backoff(previous_seconds: float) -> float:
    """The kubelet's back-off after one more failure in a row: 10 s, doubling, at most 5 min."""
    return min(max(previous_seconds * 2, BACKOFF_INITIAL_SECONDS), BACKOFF_MAX_SECONDS)


def failure_cause(error: BaseException) -> str:
    """What went wrong, for a pod's status and events: the exception's own words and its kind
    (`FileNotFoundError: [Errno 2] No such file or directory: '/x'`)."""
    said = str(error)
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


def _traceback(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)).rstrip()


def rfc3339(timestamp: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp or time.time(), datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRun:
    spec: dict
    is_init: bool
    process: subprocess.Popen | None = None
    image: images.Image | None = None
    env: dict[str, str] = field(default_factory=dict)
    restart_count: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    started_monotonic: float = 0.0
    log_offset: int = 0  # where this run's output starts in the container's log
    started_once: bool = False
    next_start_monotonic: float = 0.0
    backoff_seconds: float = 0.0
    # The back-off of failures to create the container (image, configuration, process start).
    start_backoff_seconds: float = 0.0
    readiness: ProbeState | None = None
    liveness: ProbeState | None = None
    startup: ProbeState | None = None
    finished: bool = False
    exit_code: int | None = None

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def ready(self) -> bool:
        if not self.running:
            return False
        if self.startup is not None and self.startup.passing is not True:
            return False
        if self.readiness is None:
            return True
        return self.readiness.passing is True

    def status(self) -> dict:
        status = {
            "name": self.name,
            "image": self.spec["image"],
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "state": self.state,
        }
        if not self.is_init:
            status["started"] = self.running and (self.startup is None or self.startup.passing is True)
        if self.last_state:
            status["lastState"] = self.last_state
        if self.running or "terminated" in self.state:
            status["containerID"] = f"sandbox://{self.process.pid}" if self.process else ""
        return status


class NodeServices(Protocol):
    """What a pod worker asks of the node agent that runs it (the agent implements it)."""

    config: SandboxConfig
    core: CoreV1Api
    host_ip: str

    def log(self, message: str) -> None: ...

    def event(self, pod: dict, kind: str, reason: str, message: str) -> None: ...

    def read_config_map(self, namespace: str, name: str) -> dict[str, str]: ...

    def read_secret(self, namespace: str, name: str) -> dict[str, str]: ...

    def node_manifest(self, node_name: str) -> dict: ...

    def allocate_pod_ip(self, node_name: str, uid: str) -> str: ...

    def allocate_gpus(self, node_name: str, uid: str, count: int) -> list[int]: ...

    def release(self, node_name: str, uid: str) -> None:
        """Free the pod's IP and GPUs."""

    def delete_pod_object(self, namespace: str, name: str, uid: str) -> None:
        """Finish the pod's graceful deletion on the apiserver."""

    def pod_worker_finished(self, worker: PodWorker) -> None:
        """The worker's thread ends: the agent forgets it."""


class PodWorker(threading.Thread):
    def __init__(self, agent: NodeServices, pod: dict):
        super().__init__(name=f"pod-{pod['metadata']['namespace']}/{pod['metadata']['name']}",
                         daemon=True)
        self.agent = agent
        self.pod = pod
        metadata = pod["metadata"]
        self.uid = metadata["uid"]
        self.namespace = metadata["namespace"]
        self.pod_name = metadata["name"]
        self.node_name = pod["spec"]["nodeName"]
        self.pod_root = agent.config.pods_dir / f"{self.namespace}_{self.pod_name}_{self.uid[:8]}"
        self.netns = network.pod_namespace_name(self.agent.config.network, self.uid)
        self.pod_ip: str | None = None
        self.gpu_indices: list[int] = []
        self.start_time = time.time()
        self.init_runs = [ContainerRun(c, True) for c in pod["spec"].get("initContainers") or []]
        self.app_runs = [ContainerRun(c, False) for c in pod["spec"]["containers"]]
        self.restart_policy = pod["spec"].get("restartPolicy", "Always")
        self.stop_deadline: float | None = None
        self.stop_requested = threading.Event()
        self.delete_object_when_stopped = False
        self.report_final_status = True
        self.pod_error: tuple[str, str] | None = None
        # The pod's sandbox (network namespace, directories, /etc files) is set up.
        self.sandbox_ready = False
        self.sandbox_error: str | None = None
        self.sandbox_backoff_seconds = 0.0
        self.sync_backoff_seconds = 0.0
        # Which version of the sandbox's faults file the pod's live fault was last written from.
        self.faults_version: tuple[int, int] | None = None
        # The worker itself failed: the agent starts another for the pod at its next relist.
        self.crashed = False
        self.last_reported: dict | None = None
        self.condition_times: dict[str, tuple[str, str]] = {}
        self.volumes: dict[str, Volume] = {}

    # -- requests from the agent's watch -------------------------------------------------

    def request_stop(self, grace_seconds: float, delete_object: bool,
                     report_final_status: bool = True) -> None:
        """Stop the pod's containers. A node shutting down passes
        report_final_status=False: the pod did not fail, its node went away,
        and the next agent start runs it again."""
        if not self.stop_requested.is_set():
            self.stop_deadline = time.monotonic() + grace_seconds
            self.delete_object_when_stopped = delete_object
            self.report_final_status = report_final_status
            self.stop_requested.set()

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> None:
        try:
            refused = self._admit()
            if refused is not None:
                self._reject(refused)
                return
            self._sync_until_finished()
            if self.stop_requested.is_set():
                self._terminate_all()
                if self.report_final_status:
                    self._report()
        except Exception as error:  # noqa: BLE001 - a pod's failure must not kill the agent
            self.crashed = True
            self.agent.log(f"pod {self.namespace}/{self.pod_name}: worker error, its processes killed; "
                           f"the next relist starts it again:\n{_traceback(error)}")
            self._kill_all()
        finally:
            try:
                self._teardown()
            finally:  # else the agent would think the pod still runs, and ignore it for good
                self.agent.pod_worker_finished(self)

    def _admit(self) -> str | None:
        """Take the pod's GPUs, as the kubelet's device manager does when it admits a pod; why
        not, when the node has too few left (the scheduler may bind a preemptor while its
        victims still hold theirs)."""
        requested = self._gpu_request()
        self.gpu_indices = self.agent.allocate_gpus(self.node_name, self.uid, requested)
        if len(self.gpu_indices) < requested:
            return (f"Allocate failed due to requested number of devices unavailable for {GPU_RESOURCE}. "
                    f"Requested: {requested}, Available: {len(self.gpu_indices)}, which is unexpected")
        return None

    def _reject(self, message: str) -> None:
        """A pod the node cannot admit fails at once, without running anything; its controller
        makes another."""
        self.agent.log(f"pod {self.namespace}/{self.pod_name}: not admitted: {message}")
        status = {"phase": "Failed", "reason": ADMISSION_ERROR_REASON, "message": message,
                  "startTime": rfc3339(self.start_time)}
        self.agent.core.patch_namespaced_pod_status(self.pod_name, self.namespace, {"status": status})

    def _sync_until_finished(self) -> None:
        """Set the pod's sandbox up, then drive its containers, until the pod finishes or is
        stopped. A pass that fails is reported and retried after a back-off, as the kubelet
        retries a failed pod sync; it never ends the worker, never spins."""
        while not self.stop_requested.is_set():
            try:
                if not self.sandbox_ready:
                    self._prepare()
                self._refresh_live_fault()
                self._step()
                self._report()
                self.sync_backoff_seconds = 0.0
                if self._pod_finished():
                    return
                delay = LOOP_SECONDS
            except Exception as error:  # noqa: BLE001 - reported on the pod, then retried
                delay = self._sync_failed(error)
            self.stop_requested.wait(delay)

    def _sync_failed(self, error: Exception) -> float:
        """Report a failed pass on the pod, as the kubelet does, and say how long to back off."""
        if isinstance(error, PodSandboxError):
            self.sandbox_backoff_seconds = delay = next_backoff(self.sandbox_backoff_seconds)
            cause = failure_cause(error.__cause__ or error)
            self.sandbox_error = f"Failed to create pod sandbox: {cause}"
            what, reason, message = "setting up the pod sandbox", "FailedCreatePodSandBox", self.sandbox_error
        else:
            self.sync_backoff_seconds = delay = next_backoff(self.sync_backoff_seconds)
            what, reason, message = "syncing the pod", "FailedSync", f"error syncing pod: {failure_cause(error)}"
        self.agent.log(f"pod {self.namespace}/{self.pod_name}: {what} failed, retrying in {delay:.0f} s:\n"
                       f"{_traceback(error)}")
        self.agent.event(self.pod, "Warning", reason, message)
        try:
            self._report()
        except Exception as report_error:  # noqa: BLE001 - the next pass reports again
            self.agent.log(f"pod {self.namespace}/{self.pod_name}: status report failed:\n{_traceback(report_error)}")
        return delay

    def _prepare(self) -> None:
        """The pod's sandbox: its IP, directories, network namespace and /etc files. One that
        fails half-way is torn down (PodSandboxError), so that nothing of it stays until the
        next try."""
        try:
            self.pod_ip = self.agent.allocate_pod_ip(self.node_name, self.uid)
            self.pod_root.mkdir(parents=True, exist_ok=True)
            for directory in ("logs", "run", "rootfs", LIVE_FAULT_DIRECTORY):
                (self.pod_root / directory).mkdir(exist_ok=True)
            network.create_pod_namespace(self.agent.config.network, self.netns, self.pod_ip)
            self._write_etc_files()
        except Exception as error:
            network.delete_pod_namespace(self.netns)
            raise PodSandboxError(failure_cause(error)) from error
        self.sandbox_ready = True
        self.sandbox_error = None
        self.sandbox_backoff_seconds = 0.0
        self._report()

    def _write_etc_files(self) -> None:
        """The pod's /etc/hosts, /etc/hostname and /etc/resolv.conf, which every container
        mounts, as the kubelet and the runtime write them (see `poddns`); the containers'
        hostname is the pod's too (`rootfs.set_hostname`)."""
        (self.pod_root / "etc-hosts").write_text(poddns.hosts_file(self.pod, self.pod_ip))
        (self.pod_root / "etc-hostname").write_text(poddns.pod_hostname(self.pod) + "\n")
        host_resolv_conf = poddns.HOST_RESOLV_CONF.read_text() if poddns.HOST_RESOLV_CONF.exists() else ""
        resolv_conf = poddns.resolv_conf(self.pod, self.agent.config.cluster_dns_ip, host_resolv_conf)
        if resolv_conf is not None:
            (self.pod_root / "resolv.conf").write_text(resolv_conf)

    def _refresh_live_fault(self) -> None:
        """Keep the pod's live fault (faults.write_live) as the sandbox's faults file says, as a
        runtime changes the resources of a running container; rewritten when that file changed."""
        faults_file = self.agent.config.state_dir / faults.FAULTS_FILE
        try:
            stat = faults_file.stat()
            version = (stat.st_ino, stat.st_mtime_ns)  # it is replaced whole: a new inode each time
        except FileNotFoundError:
            version = (0, 0)
        if version == self.faults_version:
            return
        faults.write_live(self.pod_root / LIVE_FAULT_DIRECTORY, faults.pod_fault(
            self.agent.config.state_dir, self.namespace, self.pod["metadata"].get("labels") or {}))
        self.faults_version = version

    def _etc_mounts(self) -> list[rootfs.Mount]:
        return [rootfs.Mount(target, self.pod_root / name)
                for target, name in (("/etc/hosts", "etc-hosts"), ("/etc/hostname", "etc-hostname"),
                                     ("/etc/resolv.conf", "resolv.conf"))
                if (self.pod_root / name).exists()]

    def _gpu_request(self) -> int:
        total = 0
        for container in self.pod["spec"]["containers"]:
            resources = container.get("resources") or {}
            limits = resources.get("limits") or resources.get("requests") or {}
            total += int(limits.get(GPU_RESOURCE, 0))
        return total

    def _ensure_volumes(self) -> bool:
        if self.volumes or not self.pod["spec"].get("volumes"):
            return True
        try:
            builder = VolumeBuilder(self.agent.core, self.pod, self.pod_root,
                                    self.agent.config.state_dir / "hostpath")
            self.volumes = builder.build_all()
            self.pod_error = None
            return True
        except Exception as raised:  # noqa: BLE001 - the pod waits for its volumes, as on a kubelet
            if isinstance(raised, VolumeError):
                error = raised
            else:  # not the pod's fault (the apiserver unreachable, the disk): retried
                self.agent.log(f"pod {self.namespace}/{self.pod_name}: volume setup failed:\n{_traceback(raised)}")
                error = VolumeError("ContainerCreating", f"MountVolume.SetUp failed: {failure_cause(raised)}")
            if self.pod_error != (error.reason, str(error)):
                self.agent.event(self.pod, "Warning", "FailedMount", str(error))
            self.pod_error = (error.reason, str(error))
            return False

    def _step(self) -> None:
        if not self._ensure_volumes():
            for run in self.init_runs + self.app_runs:
                run.state = {"waiting": {"reason": self.pod_error[0], "message": self.pod_error[1]}}
            time.sleep(1.0)
            return
        for run in self.init_runs:
            if not run.finished:
                self._drive(run)
                return
        for run in self.app_runs:
            self._drive(run)

    def _drive(self, run: ContainerRun) -> None:
        now = time.monotonic()
        if run.process is None:
            if not run.finished and now >= run.next_start_monotonic:
                self._start(run)
            return
        code = run.process.poll()
        if code is None:
            self._probe(run, now)
            return
        self._record_exit(run, code)

    def _start_failed(self, run: ContainerRun, reason: str, message: str, event: str,
                      error: BaseException | None = None) -> None:
        """A container that could not be created waits with the kubelet's reason and the cause,
        gets a Warning event, and is tried again after a back-off; `error`, when the failure is
        the sandbox's rather than the pod spec's, goes to the agent's log with its traceback."""
        run.start_backoff_seconds = next_backoff(run.start_backoff_seconds)
        run.next_start_monotonic = time.monotonic() + run.start_backoff_seconds
        run.state = {"waiting": {"reason": reason, "message": message}}
        if error is not None:
            self.agent.log(f"pod {self.namespace}/{self.pod_name}: container {run.name}: {reason}, retrying in "
                           f"{run.start_backoff_seconds:.0f} s:\n{_traceback(error)}")
        self.agent.event(self.pod, "Warning", "Failed", event)

    def _start(self, run: ContainerRun) -> None:
        try:
            self._create_and_start(run)
        except Exception as error:  # noqa: BLE001 - the kubelet's CreateContainerError, retried
            if run.process is not None:  # it failed after the process started: nothing stays
                _signal_group(run.process, signal.SIGKILL)
                run.process.wait()
                run.process = None
            cause = failure_cause(error)
            self._start_failed(run, "CreateContainerError", cause, f"Error: {cause}", error)

    def _create_and_start(self, run: ContainerRun) -> None:
        spec = run.spec
        try:
            if run.image is None:
                run.image = images.resolve(spec["image"], self.agent.config.state_dir)
        except images.ImageNotRunnable as error:
            self._start_failed(run, "ErrImagePull", str(error), f"Failed to pull image: {error}")
            return
        except Exception as error:  # noqa: BLE001 - laying the image out failed: a failed pull
            message = f'failed to lay out image "{spec["image"]}": {failure_cause(error)}'
            self._start_failed(run, "ErrImagePull", message, f"Failed to pull image: {message}", error)
            return
        try:
            container_env = self._container_environment(spec)
            argv = run.image.argv([_expand_env(arg, container_env) for arg in spec.get("command") or []],
                                  [_expand_env(arg, container_env) for arg in spec.get("args") or []])
            if not argv:
                raise ValueError(f'container "{run.name}": no command specified')
            run.env = {**self._base_environment(run.image), **run.image.env, **container_env}
            image_files = [rootfs.Mount(path, source, read_only=True)
                           for path, source in run.image.files.items()]
            environment = [rootfs.Mount(path, Path(path), read_only=True) for path in images.ENVIRONMENT_PATHS]
            environment.append(rootfs.Mount(faults.LIVE_DIRECTORY, self.pod_root / LIVE_FAULT_DIRECTORY,
                                            read_only=True))
            # The pod's own volumes go after the kubelet's files: one mounted at /etc/hosts wins.
            ops = rootfs.plan(image_files, self._etc_mounts() + container_mounts(spec, self.volumes),
                              spec.get("workingDir") or "/", environment=environment)
        except (VolumeError, rootfs.MountError, KeyError, ValueError) as error:
            self._start_failed(run, "CreateContainerConfigError", str(error), f"Error: {error}")
            return
        except ApiException as error:
            if error.status != 404:
                raise
            # A ConfigMap or Secret the environment names is missing: 'configmaps "x" not found'.
            message = _api_message(error)
            self._start_failed(run, "CreateContainerConfigError", message, f"Error: {message}")
            return
        staging = self.pod_root / "rootfs" / run.name
        staging.mkdir(exist_ok=True)
        self._start_error_file(run).unlink(missing_ok=True)
        launch = self.pod_root / "run" / f"{run.name}.json"
        launch.write_text(json.dumps({
            "staging": str(staging), "ops": ops, "argv": argv, "env": run.env,
            "cwd": spec.get("workingDir") or "/", "error_file": str(self._start_error_file(run)),
            "hostname": poddns.pod_hostname(self.pod),
        }))
        probes = [new_probe(spec.get(kind)) for kind in ("readinessProbe", "livenessProbe", "startupProbe")]
        # The process starts last: a failure before it leaves nothing running.
        log = open(self._log_file(run), "ab")
        run.log_offset = log.tell()
        try:
            run.process = subprocess.Popen(
                network.exec_prefix(self.netns) + rootfs.launcher_command(launch),
                env={"PATH": os.environ.get("PATH", ":".join(images.DEFAULT_PATH))}, cwd=self.pod_root,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            log.close()
        run.started_monotonic = time.monotonic()
        run.start_backoff_seconds = 0.0
        if run.started_once:
            run.restart_count += 1
        run.started_once = True
        run.state = {"running": {"startedAt": rfc3339()}}
        run.readiness, run.liveness, run.startup = probes
        self.agent.event(self.pod, "Normal", "Started", f"Started container {run.name}")

    def _log_file(self, run: ContainerRun) -> Path:
        return self.pod_root / "logs" / f"{run.name}.log"

    def _log_tail(self, run: ContainerRun) -> str:
        """The end of this run's output, as much as the kubelet puts in a termination message."""
        with open(self._log_file(run), "rb") as log:
            log.seek(max(run.log_offset, log.seek(0, os.SEEK_END) - TERMINATION_MESSAGE_MAX_BYTES))
            text = log.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-TERMINATION_MESSAGE_MAX_LINES:])

    def _start_error_file(self, run: ContainerRun) -> Path:
        return self.pod_root / "run" / f"{run.name}.start-error"

    def _base_environment(self, image: images.Image) -> dict[str, str]:
        env = {
            "PATH": image.search_path,
            "HOME": "/root",
            "HOSTNAME": poddns.pod_hostname(self.pod),
            "KUBERNETES_SERVICE_HOST": self.agent.config.network.kubernetes_service_ip,
            "KUBERNETES_SERVICE_PORT": "443",
        }
        if self.gpu_indices:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.gpu_indices)
            # The engine stand-in learns its GPU from here, as a real engine does from the driver.
            labels = self.agent.node_manifest(self.node_name)["metadata"]["labels"]
            env["LLMFLEET_SANDBOX_GPU_PRODUCT"] = labels[GPU_PRODUCT_LABEL]
        env[faults.LIVE_FAULT_VARIABLE] = f"{faults.LIVE_DIRECTORY}/{faults.LIVE_FILE}"
        env.update(faults.environment(self.agent.config.state_dir, self.namespace,
                                      self.pod["metadata"].get("labels") or {}))
        return env

    def _container_environment(self, spec: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self.agent.read_config_map(self.namespace, source["configMapRef"]["name"])
            else:
                data = self.agent.read_secret(self.namespace, source["secretRef"]["name"])
            env.update({prefix + key: value for key, value in data.items()})
        for variable in spec.get("env") or []:
            env[variable["name"]] = self._env_value(variable, env)
        return env

    def _env_value(self, variable: dict, env: dict[str, str]) -> str:
        if "value" in variable:
            return _expand_env(variable["value"], env)
        source = variable.get("valueFrom") or {}
        if "fieldRef" in source:
            pod = dict(self.pod, status={"podIP": self.pod_ip, "hostIP": self.agent.host_ip})
            return field_ref_value(pod, source["fieldRef"]["fieldPath"])
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self.agent.read_config_map(self.namespace, ref["name"])[ref["key"]]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.agent.read_secret(self.namespace, ref["name"])[ref["key"]]
        return ""

    def _probe(self, run: ContainerRun, now: float) -> None:
        prefix = rootfs.exec_prefix(run.process.pid, NSENTER)
        if run.startup is not None and run.startup.passing is not True:
            if run.startup.due(now):
                ok, message = run_probe(run.startup.spec, run.spec, self.pod_ip, prefix, run.env)
                run.startup.record(ok, now)
                if run.startup.passing is False:
                    self._kill_for_restart(run, f"Startup probe failed: {message}")
            for waiting in (run.readiness, run.liveness):
                if waiting is not None:
                    waiting.pass_tick(now)
            return
        if run.readiness is not None and run.readiness.due(now):
            ok, message = run_probe(run.readiness.spec, run.spec, self.pod_ip, prefix, run.env)
            was = run.readiness.passing
            run.readiness.record(ok, now)
            if not ok and was is not False and run.readiness.passing is False:
                self.agent.event(self.pod, "Warning", "Unhealthy", f"Readiness probe failed: {message}")
        if run.liveness is not None and run.liveness.due(now):
            ok, message = run_probe(run.liveness.spec, run.spec, self.pod_ip, prefix, run.env)
            run.liveness.record(ok, now)
            if run.liveness.passing is False:
                self._kill_for_restart(run, f"Liveness probe failed: {message}")

    def _kill_for_restart(self, run: ContainerRun, message: str) -> None:
        self.agent.event(self.pod, "Warning", "Unhealthy", message)
        grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        _stop_process(run.process, grace)

    def _record_exit(self, run: ContainerRun, code: int) -> None:
        exit_code = EXIT_CODE_SIGNAL_OFFSET - code if code < 0 else code
        terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": run.state.get("running", {}).get("startedAt", rfc3339()),
            "finishedAt": rfc3339(),
        }
        if code < 0:
            terminated["signal"] = -code
        start_error = self._start_error_file(run)
        if start_error.exists() and start_error.stat().st_size:
            # The runtime could not exec the command (or build its root): the kubelet's StartError.
            terminated.update(reason="StartError", message=start_error.read_text())
            self.agent.event(self.pod, "Warning", "Failed", f"Error: {terminated['message']}")
        elif exit_code != 0 and run.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            # The sandbox has no termination-log file to read first: the log's tail is the message.
            terminated["message"] = self._log_tail(run)
        run.exit_code = exit_code
        ran_seconds = time.monotonic() - run.started_monotonic
        run.process = None
        if run.is_init and exit_code == 0:
            run.finished = True
            run.state = {"terminated": terminated}
            return
        restart = self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and exit_code != 0)
        if run.is_init and self.restart_policy == "Always":
            restart = exit_code != 0
        if not restart:
            run.finished = True
            run.state = {"terminated": terminated}
            return
        if ran_seconds >= BACKOFF_RESET_SECONDS:
            run.backoff_seconds = 0.0
        # The first restart is immediate; later ones back off like the kubelet's.
        delay = run.backoff_seconds
        run.backoff_seconds = min(max(delay * 2, BACKOFF_INITIAL_SECONDS), BACKOFF_MAX_SECONDS)
        run.last_state = {"terminated": terminated}
        run.next_start_monotonic = time.monotonic() + delay
        if delay > 0:
            run.state = {"waiting": {"reason": "CrashLoopBackOff", "message":
                         f"back-off {delay:.0f}s restarting failed container={run.name} "
                         f"pod={self.pod_name}"}}
            self.agent.event(self.pod, "Warning", "BackOff", f"Back-off restarting failed container {run.name}")
        else:
            run.state = {"waiting": {"reason": "ContainerCreating"}}

    def _pod_finished(self) -> bool:
        init_failed = any(r.finished and r.exit_code not in (0, None) for r in self.init_runs)
        return init_failed or all(run.finished for run in self.app_runs)

    # -- stopping -------------------------------------------------------------------------

    def _terminate_all(self) -> None:
        """Like the kubelet: each container runs its preStop hook, then its main process gets
        SIGTERM; whatever still runs in it when the grace period ends gets SIGKILL."""
        runs = [run for run in self.init_runs + self.app_runs if run.running]
        stoppers = [threading.Thread(target=self._stop_container, args=(run,), daemon=True)
                    for run in runs]
        for stopper in stoppers:
            stopper.start()
        while any(run.running for run in runs) and time.monotonic() < (self.stop_deadline or 0):
            time.sleep(0.1)
        for run in runs:
            if run.running:
                _signal_group(run.process, signal.SIGKILL)
            run.process.wait()
            _kill_leftovers(run.process)  # a container ends with its main process, children too
            self._record_terminated_by_stop(run)

    def _stop_container(self, run: ContainerRun) -> None:
        self.agent.event(self.pod, "Normal", "Killing", f"Stopping container {run.name}")
        hook = (run.spec.get("lifecycle") or {}).get("preStop")
        if hook:
            remaining = (self.stop_deadline or 0) - time.monotonic()
            ok, message = run_lifecycle_hook(hook, run.spec, self.pod_ip,
                                             rootfs.exec_prefix(run.process.pid, NSENTER), remaining,
                                             run.env)
            if not ok:
                self.agent.event(self.pod, "Warning", "FailedPreStopHook",
                                 f"PreStop hook for container {run.name} failed: {message}")
        # Only the container's main process, as a runtime signals PID 1: its children are its
        # own to stop. (Signalling the group stopped Triton's Python backend stubs under it, and
        # streams in flight on a draining replica stalled until the grace period ended.)
        _signal_group(run.process, signal.SIGTERM, main_only=True)

    def _record_terminated_by_stop(self, run: ContainerRun) -> None:
        code = run.process.returncode
        exit_code = EXIT_CODE_SIGNAL_OFFSET - code if code < 0 else code
        run.state = {"terminated": {"exitCode": exit_code,
                                    "reason": "Completed" if exit_code == 0 else "Error",
                                    "startedAt": run.state.get("running", {}).get("startedAt", rfc3339()),
                                    "finishedAt": rfc3339()}}
        run.finished = True

    def _kill_all(self) -> None:
        for run in self.init_runs + self.app_runs:
            if run.running:
                _signal_group(run.process, signal.SIGKILL)

    def _teardown(self) -> None:
        network.delete_pod_namespace(self.netns)
        self.agent.release(self.node_name, self.uid)
        if self.delete_object_when_stopped:
            self.agent.delete_pod_object(self.namespace, self.pod_name, self.uid)

    # -- status ---------------------------------------------------------------------------

    def _phase(self) -> str:
        if any(r.finished and r.exit_code not in (0, None) for r in self.init_runs):
            return "Failed"
        if not all(r.finished for r in self.init_runs):
            return "Pending"
        if all(run.finished for run in self.app_runs):
            failed = any(run.exit_code not in (0, None) for run in self.app_runs)
            return "Failed" if failed else "Succeeded"
        if any(run.started_once for run in self.app_runs):
            return "Running"
        return "Pending"

    def _condition(self, kind: str, ok: bool, reason: str | None = None) -> dict:
        status = "True" if ok else "False"
        previous = self.condition_times.get(kind)
        if previous is None or previous[0] != status:
            self.condition_times[kind] = (status, rfc3339())
        condition = {"type": kind, "status": status,
                     "lastTransitionTime": self.condition_times[kind][1]}
        if reason and not ok:
            condition["reason"] = reason
        return condition

    def _container_status(self, run: ContainerRun) -> dict:
        status = run.status()
        if self.sandbox_error and run.process is None and "waiting" in run.state:
            # The kubelet's containers wait in ContainerCreating while their sandbox cannot be
            # made; the status says why too (the event says it as the kubelet's does).
            status["state"] = {"waiting": {"reason": "ContainerCreating", "message": self.sandbox_error}}
        return status

    def _report(self) -> None:
        initialized = all(r.finished and r.exit_code == 0 for r in self.init_runs)
        containers_ready = initialized and all(run.ready for run in self.app_runs)
        phase = self._phase()
        if phase in ("Succeeded", "Failed"):
            containers_ready = False
        status = {
            "phase": phase,
            "hostIP": self.agent.host_ip,
            "hostIPs": [{"ip": self.agent.host_ip}],
            "podIP": self.pod_ip if self.sandbox_ready else None,
            "podIPs": [{"ip": self.pod_ip}] if self.pod_ip and self.sandbox_ready else [],
            "startTime": rfc3339(self.start_time),
            "qosClass": (self.pod.get("status") or {}).get("qosClass", "BestEffort"),
            "conditions": [
                self._condition("PodReadyToStartContainers", self.sandbox_ready),
                self._condition("Initialized", initialized, "ContainersNotInitialized"),
                self._condition("ContainersReady", containers_ready, "ContainersNotReady"),
                self._condition("Ready", containers_ready, "ContainersNotReady"),
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [self._container_status(run) for run in self.app_runs],
        }
        if self.init_runs:
            status["initContainerStatuses"] = [self._container_status(run) for run in self.init_runs]
        if status == self.last_reported:
            return
        try:
            self.agent.core.patch_namespaced_pod_status(self.pod_name, self.namespace,
                                                         {"status": status})
            self.last_reported = status
        except ApiException as error:
            if error.status == 404:
                self.stop_requested.set()
                self.stop_deadline = time.monotonic()
            else:
                self.agent.log(f"pod {self.namespace}/{self.pod_name}: status patch failed: {error.reason}")
        except (urllib3.exceptions.HTTPError, OSError) as error:  # the apiserver is down: the next report retries
            self.agent.log(f"pod {self.namespace}/{self.pod_name}: status patch failed: {error!r}")


def _api_message(error: ApiException) -> str:
    """The apiserver's own message in an error answer (its Status), else the HTTP reason."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def _expand_env(text: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion; $$(VAR) escapes it."""
    def replace(match):
        if match.group(0).startswith("$$"):
            return match.group(0)[1:]
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$?\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


def _kill_leftovers(process: subprocess.Popen) -> None:
    """SIGKILL what is left of an exited main process's group (its group id is its pid)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _signal_group(process: subprocess.Popen | None, sig: int, main_only: bool = False) -> None:
    """Signal a running container's process group, or with `main_only` its main process."""
    if process is None or process.poll() is not None:
        return
    try:
        (os.kill if main_only else os.killpg)(process.pid, sig)
    except ProcessLookupError:
        pass


def _stop_process(process: subprocess.Popen | None, grace_seconds: float) -> None:
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
