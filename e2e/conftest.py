"""Session fixtures for tests against the real sandbox.

The sandbox (etcd, kube-apiserver, controller-manager, scheduler, node agent,
service proxy, Prometheus) starts once per test session in its own state
directory and is stopped at the end. Tests marked `sandbox_teardown` run last:
they take the sandbox down themselves and check that nothing is left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from llmfleet_sandbox.config import MAX_INSTANCE

REPO_ROOT = Path(__file__).resolve().parents[1]
LLMFLEET = [sys.executable, "-m", "llmfleet"]


# How many tests a -k or -m expression deselected: checks of the whole suite's traffic skip then.
DESELECTED = pytest.StashKey[int]()


# A directory the workers of one run share, made by the controller (or the only process) and
# handed to each worker: whole-suite checks read there what the other workers left.
RUN_DIR = pytest.StashKey[Path]()
RUN_DIR_INPUT = "llmfleet_e2e_run_dir"


def pytest_configure(config):
    config.addinivalue_line("markers", "after_other_e2e: runs after the other e2e tests, before teardown")
    config.addinivalue_line("markers", "sandbox_teardown: runs after every other e2e test")
    config.addinivalue_line("markers", "disrupts_operator: kills the session's operator or its control plane on "
                                       "purpose; its restarts and logged failures are not held against the test")
    config.addinivalue_line("markers", "long_running: a module of many minutes, started first so that the "
                                       "workers finish together")
    workerinput = getattr(config, "workerinput", None)
    config.stash[RUN_DIR] = (Path(workerinput[RUN_DIR_INPUT]) if workerinput
                             else Path(tempfile.mkdtemp(prefix="llmfleet-e2e-run-")))


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and RUN_DIR in config.stash:
        shutil.rmtree(config.stash[RUN_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[RUN_DIR_INPUT] = str(node.config.stash[RUN_DIR])


def pytest_deselected(items):
    if items:
        config = items[0].config
        config.stash[DESELECTED] = config.stash.get(DESELECTED, 0) + len(items)


def pytest_collection_modifyitems(config, items):
    e2e_dir = Path(__file__).parent
    for item in items:
        if e2e_dir in item.path.parents:
            item.add_marker(pytest.mark.e2e)

    # Workers take whole modules in this order (`--dist loadfile --no-loadscope-reorder`): a worker
    # starts its module after-other and teardown phases only once every module before is under way.
    def order(item) -> tuple[int, bool]:
        phase = (2 if item.get_closest_marker("sandbox_teardown") else
                 1 if item.get_closest_marker("after_other_e2e") else 0)
        return phase, not item.get_closest_marker("long_running")
    items.sort(key=order)


@dataclass
class Sandbox:
    state_dir: Path
    env: dict[str, str]

    def llmfleet(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([*LLMFLEET, "sandbox", *args], env=self.env, capture_output=True,
                              text=True, check=check, timeout=timeout)

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> str:
        result = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True,
                                input=input_text, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result.stdout if check else result.stdout + result.stderr

    def install_crds(self) -> None:
        """Apply the project's CRDs and wait until they are served. kubectl wait fails, rather
        than waits, on a CRD the apiserver has not yet given conditions."""
        self.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        deadline = time.monotonic() + 30
        while True:
            said = self.kubectl("wait", "--for=condition=Established", "crd/llmdeployments.llmfleet.io",
                                "--timeout=30s", check=False)
            if "condition met" in said:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD llmdeployments.llmfleet.io not Established: {said}")
            time.sleep(0.5)

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def container_log(self, pod: dict, container: str) -> str:
        """What a container of `pod` wrote, from the node's log file ('' before it starts)."""
        metadata = pod["metadata"]
        directory = f"{metadata['namespace']}_{metadata['name']}_{metadata['uid'][:8]}"
        path = self.state_dir / "pods" / directory / "logs" / f"{container}.log"
        return path.read_text() if path.exists() else ""

    def apply(self, manifests: list[dict] | str, namespace: str = "default") -> None:
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(manifests)
        self.kubectl("apply", "-n", namespace, "-f", "-", input_text=text)

    def stop_component(self, name: str, sig: int = signal.SIGTERM) -> None:
        """An outage of one sandbox component (`prometheus`, `kube-apiserver`, `etcd`, ...;
        SIGKILL for a crash): `llmfleet("up")` starts it again, alone, on the data it left.
        Returns once the process is gone; a graceful stop that outlasts 90 s is killed."""
        pid = json.loads((self.state_dir / "pids" / f"{name}.json").read_text())["pid"]
        os.kill(pid, sig)
        deadline = time.monotonic() + 90
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    @property
    def prometheus_url(self) -> str:
        return self.env["LLMFLEET_PROMETHEUS_URL"]


# The catalog models the e2e tests deploy, and the Hugging Face repositories they come from.
MODEL_SOURCES = {"llama-3.1-8b": "hf://meta-llama/Llama-3.1-8B-Instruct",
                 "llama-3.1-70b": "hf://meta-llama/Llama-3.1-70B-Instruct",
                 "llama-3.1-405b": "hf://meta-llama/Llama-3.1-405B-Instruct"}


def llm_deployment(name: str, namespace: str, model: str, **spec) -> dict:
    """An LLMDeployment of a catalog model; `spec` holds the other spec fields (slo, workload, ...)."""
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": {"name": model, "source": MODEL_SOURCES[model]}, **spec},
    }


def small_batch_70b(name: str, namespace: str, slo_ttft_p99_ms: int, **spec) -> dict:
    """Llama 3.1 70B on one H100 with a 4-sequence batch: in the emulator one replica serves
    about 3.5 requests/s of 128-token prompts and 32-token answers, so a few requests per
    second (cheap for this machine) need several replicas. `spec` adds top-level spec fields
    such as autoscaling or plan."""
    return llm_deployment(
        name, namespace, "llama-3.1-70b",
        # The engine runtime: the autoscaling tests read its queue, KV and batch gauges.
        engine={"runtime": "engine", "maxBatchSize": 4, "maxInputLen": 1024, "maxSeqLen": 2048, "maxNumTokens": 2048},
        slo={"ttftP99Ms": slo_ttft_p99_ms, "tpotP99Ms": 50, "quality": {"allowedQuantizations": ["BF16", "FP8"]}},
        workload={"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 32, "outputTokensP99": 64,
                  "peakRequestsPerSecond": 0.5},
        resources={"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 8},
        **spec)


def spanning_405b(name: str, namespace: str, **spec) -> dict:
    """Llama 3.1 405B in BF16 only, one replica: 810 GB of weights, TP8 PP2 over two nodes of
    eight H100s, a group of two pods. `spec` adds or replaces top-level spec fields."""
    return llm_deployment(name, namespace, "llama-3.1-405b", **{
        "engine": {"runtime": "engine", "maxBatchSize": 4, "maxInputLen": 1024, "maxSeqLen": 2048,
                   "maxNumTokens": 2048},
        "workload": {"inputTokensMean": 128, "inputTokensP99": 256, "outputTokensMean": 32, "outputTokensP99": 64,
                     "peakRequestsPerSecond": 0.5},
        "slo": {"ttftP99Ms": 5000, "tpotP99Ms": 200, "quality": {"allowedQuantizations": ["BF16"]}},
        "resources": {"allowedGpuTypes": ["H100-SXM-80GB"], "gpuBudget": 16}, "plan": {"replicas": 1}, **spec})


@contextmanager
def temporary_namespace(sandbox: "Sandbox", name: str, wait_s: int = 0):
    """A namespace for a module's or a test's objects, deleted when it is done, also when the
    setup inside fails: in the background (a sandbox takes about a minute to end a namespace's
    serving pods), or with up to `wait_s` spent waiting for its pods to end where the next module
    needs what they held (whole nodes). A module that needs whole nodes itself waits for its
    predecessors' pods: `no_pods_in_ending_namespaces`."""
    sandbox.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        sandbox.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false", check=False)
        if wait_s:
            no_pods_in_ending_namespaces(sandbox, wait_s)


def no_pods_in_ending_namespaces(sandbox: "Sandbox", timeout_s: float = 180) -> None:
    """Wait until no namespace being deleted holds a pod: the modules before this one on its
    worker delete theirs in the background, and their pods hold GPUs until they end. Seen once:
    test_operator, run right after test_rollout, got no new revision within 30 s for a plan that
    needs a whole node, where alone it passed (the held GPUs are the likely cause, not shown).
    Not until the namespaces are gone: the namespace controller looks again only after its
    estimate of the pods' grace periods, a minute after the serving pods ended (seen)."""
    def none_held():
        ending = {n["metadata"]["name"] for n in sandbox.kubectl_json("get", "namespaces")["items"]
                  if (n.get("status") or {}).get("phase") == "Terminating"}
        pods = sandbox.kubectl_json("get", "pods", "--all-namespaces")["items"] if ending else []
        return not [p for p in pods if p["metadata"]["namespace"] in ending]
    wait_for(none_held, timeout_s, "the pods of namespaces being deleted to end")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll predicate until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def stop_load(load: subprocess.Popen) -> tuple[str, str]:
    """End an `llmfleet load` run once the test has seen what it waited for: it sends nothing
    more and its in-flight requests finish (their outcome still counts); (stdout, stderr)."""
    if load.poll() is None:
        load.send_signal(signal.SIGTERM)
    return load.communicate(timeout=300)


def steady_load(sandbox: "Sandbox", name: str, namespace: str, seconds: int, output: Path,
                requests_per_second: int = 2) -> subprocess.Popen:
    """`llmfleet load` of short requests through the deployment's Service."""
    return subprocess.Popen(
        [*LLMFLEET, "load", "--target", service_target(sandbox, name, namespace, timeout=60),
         "--schedule", f"constant:{requests_per_second}", "--duration-s", str(seconds), "--input-tokens", "fixed:64",
         "--output-tokens", "fixed:8", "--output-dir", str(output), "--quiet"],
        env=sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pod_gauge(metrics_url: str, name: str, label: str, value: str) -> float:
    """One gauge a pod exports, read from its metrics port as Prometheus would scrape it."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and f'{label}="{value}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{metrics_url} has no {name}{{{label}={value!r}}}")


def served_every_request(process: subprocess.Popen, output: Path, *, stop: bool = False) -> dict:
    """The load's outcome once it ends (`stop`: ended now; in-flight requests still count)."""
    stdout, stderr = stop_load(process) if stop else process.communicate(timeout=300)
    assert process.returncode == 0, stderr + stdout
    summary = json.loads((output / "summary.json").read_text())
    assert summary["requests"] > 0 and summary["errors"] == 0 and summary["truncated"] == 0, summary
    return summary


def watch_phases(sandbox: "Sandbox", name: str, namespace: str, until: str, timeout: float) -> list[str]:
    """The canary phases an LLMDeployment goes through until `until`, in order."""
    phases: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phase = (sandbox.kubectl_json("get", "llmdeployment", name, "-n", namespace).get("status", {})
                 .get("canary") or {}).get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if phase == until:
            return phases
        time.sleep(0.5)
    canary = sandbox.kubectl_json("get", "llmdeployment", name, "-n", namespace).get("status", {}).get("canary") or {}
    raise AssertionError(f"no {until} within {timeout:.0f} s; phases seen: {phases}; last verdict "
                         f"{canary.get('analysisVerdict')}: {canary.get('analysisMessage')}; {canary.get('message')}")


def revision_of(sandbox: "Sandbox", body: dict) -> str:
    """The revision the operator makes of `body`, as `llmfleet plan` names it."""
    planned = subprocess.run([*LLMFLEET, "plan", "-f", "-", "-o", "json"], input=json.dumps(body), env=sandbox.env,
                             capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    return json.loads(planned.stdout)["revision"]


def fault_the_new_revision(sandbox: "Sandbox", name: str, namespace: str, engine_revision: str, *flags: str) -> str:
    """Inject a fault into the revision that `engine_revision` makes, then change to it: its pods
    start with the fault, however fast its prepare Job is. Returns that revision."""
    body = sandbox.kubectl_json("get", "llmdeployment", name, "-n", namespace)
    stable = body["status"]["stableRevision"]
    body["spec"]["engine"]["revision"] = engine_revision
    canary = revision_of(sandbox, body)
    assert canary != stable
    sandbox.llmfleet("fault", "--namespace", namespace, "--deployment", name, "--revision", canary, *flags)
    sandbox.kubectl("patch", "llmdeployment", name, "-n", namespace, "--type=merge",
                    "-p", json.dumps({"spec": {"engine": {"revision": engine_revision}}}))
    wait_for(lambda: sandbox.kubectl_json("get", "llmdeployment", name, "-n", namespace)["status"]
             .get("currentRevision") == canary, 30, f"revision {canary}")
    return canary


def condition(obj: dict, kind: str) -> dict | None:
    """The status condition of that type on an object, or None."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def wait_until_ready(sandbox: "Sandbox", name: str, namespace: str, timeout: float = 180) -> dict:
    """Wait for an LLMDeployment's Ready condition; returns the object. A timeout names the
    conditions last seen."""
    seen: list[dict] = []

    def ready():
        deployment = sandbox.kubectl_json("get", "llmdeployment", name, "-n", namespace)
        seen[:] = (deployment.get("status") or {}).get("conditions") or []
        return deployment if any(c["type"] == "Ready" and c["status"] == "True" for c in seen) else None
    try:
        return wait_for(ready, timeout, f"{namespace}/{name} Ready")
    except AssertionError as timed_out:
        said = "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}" for c in seen)
        raise AssertionError(f"{timed_out}; conditions: {said or 'none'}") from None


def service_target(sandbox: "Sandbox", name: str, namespace: str, timeout: float = 30) -> str:
    """The Service's gRPC address once a request through it reaches a ready model. Ready pods
    come first; the service proxy learns their endpoints a moment later, as kube-proxy does."""
    from llmfleet.loadgen.transport import TargetUnavailable, check_endpoints

    from llmfleet.render.identity import service_name

    cluster_ip = sandbox.kubectl_json("get", "service", service_name(name), "-n", namespace)["spec"]["clusterIP"]
    target = f"{cluster_ip}:8001"

    deadline = time.monotonic() + timeout
    while True:
        try:
            check_endpoints([target], None, timeout_s=5.0)
            return target
        except TargetUnavailable as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"{namespace}/{name} does not serve through {target} after "
                                     f"{timeout:.0f} s: {error}") from None
        time.sleep(1.0)


@dataclass
class StatusSample:
    seconds: float
    replicas: int | None
    ready: int | None
    ttft_p99_ms: float | None
    metrics_available: str | None
    metrics_reason: str | None = None
    metrics_message: str | None = None


@dataclass
class StatusWatcher:
    """Samples an LLMDeployment's status every second while a load runs."""

    sandbox: Sandbox
    name: str
    namespace: str
    samples: list[StatusSample] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, started: float) -> None:
        while not self.stop.is_set():
            status = self.sandbox.kubectl_json("get", "llmdeployment", self.name, "-n", self.namespace
                                               ).get("status") or {}
            metrics = next((c for c in status.get("conditions") or [] if c["type"] == "MetricsAvailable"), {})
            self.samples.append(StatusSample(time.monotonic() - started, status.get("replicas"),
                                             status.get("readyReplicas"), status.get("ttftP99Ms"),
                                             metrics.get("status"), metrics.get("reason"), metrics.get("message")))
            self.stop.wait(1.0)

    def timeline(self) -> list[tuple]:
        """(s, replicas, ready, p99 TTFT ms) every 5 samples, for failure messages."""
        return [(round(s.seconds), s.replicas, s.ready, s.ttft_p99_ms and round(s.ttft_p99_ms))
                for s in self.samples[::5]]

    def replica_changes(self, since_s: float = 0.0) -> list[tuple[float, int]]:
        changes, previous = [], None
        for sample in self.samples:
            if sample.seconds >= since_s and sample.replicas is not None:
                if previous is not None and sample.replicas != previous:
                    changes.append((sample.seconds, sample.replicas))
                previous = sample.replicas
        return changes


# Prometheus behind TLS and basic auth, as most users run it. Its interval is shorter than the
# sandbox's 15 s default so that the mechanism tests run in minutes; test_scrape_intervals runs
# namespaces at 15 and 30 s, and benchmarks/bench_autoscaling.py measures the defaults.
SCRAPE_INTERVAL_S = 5
# `make e2e` runs the modules on pytest-xdist workers, each with a sandbox and an operator of its
# own: the fault tests stop the control plane, Prometheus and the operator on purpose, and each
# test holds its operator's whole log against it. Instances (own bridge, subnets and ports) from
# E2E_BASE_INSTANCE on: one per worker, then the spares tests start beside their worker's. The
# base stays clear of instance 0, a user's `make sandbox`; another suite on this machine moves it.
E2E_BASE_INSTANCE = int(os.environ.get("LLMFLEET_E2E_INSTANCE", "1"))
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
WORKER_COUNT = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
TEST_INSTANCE = str(E2E_BASE_INSTANCE + int(WORKER.removeprefix("gw")))
# The sandboxes a test starts beside its worker's: one of four H100 nodes (first: a lone run of
# its module on a high LLMFLEET_E2E_INSTANCE stays within the sandbox's instances), a fresh one,
# a second instance, a bearer-token one.
SPARE_INSTANCES = ("four-nodes", "fresh-image", "beside", "bearer-token")


def spare_instance(purpose: str) -> str:
    """The instance of the sandbox a test starts for `purpose` (one of SPARE_INSTANCES). Each
    test module runs on one worker, so no two workers start one purpose's sandbox."""
    instance = E2E_BASE_INSTANCE + WORKER_COUNT + SPARE_INSTANCES.index(purpose)
    if instance > MAX_INSTANCE:
        raise pytest.UsageError(f"LLMFLEET_E2E_INSTANCE={E2E_BASE_INSTANCE} with {WORKER_COUNT} workers needs "
                                f"instances up to {instance}; the sandbox has 0..{MAX_INSTANCE}: lower either")
    return str(instance)
# Two H100 nodes (the default) and one L40S node: a cluster of mixed pools for the planner.
EXTRA_NODE_POOL = ("L40S-48GB", 1)
L40S_NODE = "gpu-node-3"


def _state_environment(state_dir: Path, instance: str = TEST_INSTANCE) -> dict[str, str]:
    return {**os.environ, "LLMFLEET_SANDBOX_DIR": str(state_dir), "LLMFLEET_SANDBOX_INSTANCE": instance}


def _environment(state_dir: Path, instance: str = TEST_INSTANCE) -> dict[str, str]:
    """What `sandbox env` exports for the sandbox in state_dir (of that instance), over this process's environment."""
    env = _state_environment(state_dir, instance)
    exports = subprocess.run([*LLMFLEET, "sandbox", "env"], env=env, capture_output=True,
                             text=True, check=True).stdout
    for line in exports.splitlines():
        name, value = line.removeprefix("export ").split("=", 1)
        env[name] = value.replace("$PATH", os.environ["PATH"])
    return env


def _keep_logs_of_a_failed_run(request, state_dir: Path) -> None:
    """A failed session's sandbox logs outlive `down --purge` (the operator's log is in pytest's
    tmp_path already): what stalled is often in a component's log, not in the assertion."""
    if not request.session.testsfailed or not (state_dir / "logs").is_dir():
        return
    kept = Path(tempfile.mkdtemp(prefix="llmfleet-e2e-failed-"))
    shutil.copytree(state_dir / "logs", kept / "logs")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"sandbox logs of this failed run kept in {kept / 'logs'}")


def _apiserver_logs_of(config, worker: str) -> Path:
    return config.stash[RUN_DIR] / "apiserver-logs" / worker


def _hand_over_apiserver_logs(config, state_dir: Path) -> None:
    """Leave this worker's apiserver logs (klog and audit) where whole-suite checks read every
    worker's (test_rbac_in_use), before `down --purge` removes them."""
    target = _apiserver_logs_of(config, WORKER)
    target.mkdir(parents=True, exist_ok=True)
    for log in (state_dir / "logs").glob("kube-apiserver*.log"):
        shutil.copy(log, target)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """This worker is done, its sandbox down and its apiserver logs handed over (session fixtures
    are torn down before this hook's last implementations)."""
    finished = _apiserver_logs_of(session.config, WORKER).with_suffix(".finished")
    finished.parent.mkdir(parents=True, exist_ok=True)
    finished.touch()


def other_workers_apiserver_logs(config, timeout_s: float = 3600) -> list[Path]:
    """The apiserver log directories of the run's other workers, once every one has finished
    (a worker that never started a sandbox has none)."""
    others = [f"gw{index}" for index in range(WORKER_COUNT) if f"gw{index}" != WORKER]
    wait_for(lambda: all(_apiserver_logs_of(config, worker).with_suffix(".finished").exists() for worker in others),
             timeout_s, f"the other e2e workers ({', '.join(others)}) to finish", interval=5)
    return [directory for worker in others if (directory := _apiserver_logs_of(config, worker)).is_dir()]


@contextmanager
def sandbox_up(request, instance: str, *options: str, prefix: str = "llmfleet-e2e-") -> Iterator[Sandbox]:
    """A sandbox of its own state directory on `instance`, started with `options`, and down
    (purged) afterwards, its logs kept if the session failed."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox needs root for per-pod network namespaces")
    state_dir = Path(tempfile.mkdtemp(prefix=prefix))
    env = _state_environment(state_dir, instance)
    started = subprocess.run([*LLMFLEET, "sandbox", "up", *options], env=env, capture_output=True, text=True,
                             timeout=1800)
    if started.returncode != 0:
        subprocess.run([*LLMFLEET, "sandbox", "down", "--purge"], env=env, capture_output=True)
        raise RuntimeError(f"sandbox up failed:\n{started.stdout}\n{started.stderr}")
    yield Sandbox(state_dir, _environment(state_dir, instance))
    _keep_logs_of_a_failed_run(request, state_dir)
    if instance == TEST_INSTANCE:
        _hand_over_apiserver_logs(request.config, state_dir)
    stopped = subprocess.run([*LLMFLEET, "sandbox", "down", "--purge"], env=env,
                             capture_output=True, text=True)
    # Keep the state (pid files, logs) when down fails, so nothing is orphaned.
    assert stopped.returncode == 0, f"sandbox down failed; state kept in {state_dir}:\n{stopped.stderr}"


@pytest.fixture(scope="session")
def sandbox(request) -> Sandbox:
    with sandbox_up(request, TEST_INSTANCE, "--extra-node-pool", "=".join(map(str, EXTRA_NODE_POOL)),
                    "--scrape-interval", str(SCRAPE_INTERVAL_S), "--prometheus-auth", "basic") as handle:
        yield handle


@contextmanager
def operator_running(sandbox: Sandbox, directory: Path) -> Iterator:
    """The operator on the host with its own ServiceAccount identity,
    autoscaling on the sandbox's Prometheus (basic auth), observing traffic for live re-planning
    more often than by default; the CRD installed."""
    from operator_fixtures import (
        LIVE_REPLANNING_FLAGS,
        OPERATOR_NAMESPACE,
        OperatorProcess,
        chart_rbac_manifests,
        operator_kubeconfig,
    )

    sandbox.install_crds()
    sandbox.kubectl("create", "namespace", OPERATOR_NAMESPACE)
    sandbox.kubectl("apply", "-f", "-", input_text=chart_rbac_manifests(sandbox))
    # Its own copy of the Prometheus password: a test rotates it to a wrong one and back.
    password = directory / "prometheus-password"
    shutil.copy(sandbox.env["LLMFLEET_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"], password)
    process = OperatorProcess(sandbox, operator_kubeconfig(sandbox, directory / "kubeconfig"),
                              directory / "operator.log", identity="e2e-session-operator",
                              extra_args=(*LIVE_REPLANNING_FLAGS, "--prometheus-basic-auth-password-file", str(password)))
    process.prometheus_password_file = password
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def operator(sandbox, tmp_path_factory):
    with operator_running(sandbox, tmp_path_factory.mktemp("operator")) as process:
        yield process


# A line of the operator's log that says a pass, a Kopf handler or an activity failed. A pass's
# exception is logged and swallowed, and the supervisor restarts an operator that exits: only
# its log and restart count show either. (Kopf's "Request attempt ... will retry" lines are
# not failures: it retries them, and the apiserver answers 429 while its storage starts.)
OPERATOR_FAILURE = re.compile(r"Traceback \(most recent call last\)|^\[[^]]+\] llmfleet\S* +\[(ERROR|CRITICAL)|"
                              r"(Handler|Activity) '[^']+' failed")


@pytest.fixture(autouse=True)
def operator_kept_healthy(request):
    """Fail a test during which the session's operator exited by itself or logged a failure,
    unless the test disrupts it on purpose."""
    if "operator" not in request.fixturenames or request.node.get_closest_marker("disrupts_operator"):
        yield
        return
    operator = request.getfixturevalue("operator")
    restarts, offset = operator.restarts, operator.log_size()
    yield
    logged = operator.log_since(offset)
    failures = [line for line in logged.splitlines() if OPERATOR_FAILURE.search(line)]
    assert operator.restarts == restarts, (f"the operator exited and was restarted {operator.restarts - restarts} "
                                           f"time(s) during the test; its log:\n{operator.log_tail()}")
    assert not failures, ("the operator logged failures during the test (" + str(operator.log_path) + "):\n"
                          + "\n".join(failures[:20]))
