"""`llmfleet run`: the operator itself, Kopf with llmfleet's handlers, as the only replica or
as one of several that elect a leader."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Callable

from llmfleet import exit_codes
from llmfleet.cli.inputs import BadInput, positive_float, positive_int
from llmfleet.cli.prometheus import add_prometheus_arguments, prometheus_connection, prometheus_default
from llmfleet.metrics.cadence import RATE_WINDOW_SCRAPES, CadenceSource, ScrapeCadence
from llmfleet.render.settings import RenderSettings
from llmfleet.settings import OperatorSettings

# The Lease that operator replicas elect their leader with (--leader-election-namespace).
LEADER_LEASE_NAME = "llmfleet-operator"
log = logging.getLogger(__name__)


def add_commands(commands) -> None:
    run = commands.add_parser(
        "run", help="run the operator (kubeconfig or in-cluster)",
        description="Run the LLMDeployment operator. Uses the in-cluster service account when "
                    "running in a pod, else --kubeconfig or $KUBECONFIG.")
    run.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, "
                                                        "then $KUBECONFIG, then ~/.kube/config)")
    run.add_argument("--namespace", action="append", default=[],
                     help="watch only namespaces matching this Kopf pattern: a name, a glob, or !GLOB to "
                          "exclude (repeatable; default: all namespaces)")
    run.add_argument("--engine-cache-claim", default=RenderSettings.engine_cache_claim_name, metavar="NAME",
                     help="PersistentVolumeClaim (ReadWriteMany) holding built engines in each namespace; "
                          "created when missing (default %(default)s)")
    run.add_argument("--engine-cache-storage-class", default=None, metavar="CLASS",
                     help="StorageClass of a created engine cache claim (default: the cluster's default)")
    run.add_argument("--engine-cache-size", default=RenderSettings.engine_cache_size, metavar="SIZE",
                     help="size of a created engine cache claim (default %(default)s)")
    run.add_argument("--model-code-image", default=RenderSettings.model_code_image, metavar="IMAGE",
                     help="image holding tensorrtllm_backend's all_models at each pinned tag, copied into the "
                          "serving pods' model repository (default %(default)s, the operator's own image)")
    run.add_argument("--object-store-client-image", default=RenderSettings.object_store_client_image,
                     metavar="IMAGE", help="AWS CLI image that downloads s3:// model sources in the build and "
                                           "prepare Jobs (default %(default)s; a mirror must keep the tag)")
    add_prometheus_arguments(run, "for autoscaling, canary analysis and live re-planning; without it "
                                   "autoscaling holds")
    run.add_argument("--prometheus-scrape-interval-seconds", type=positive_float,
                     default=prometheus_default("scrape-interval-seconds"), metavar="S",
                     help="how often Prometheus scrapes the serving pods (the PodMonitor's interval); the "
                          "query windows and the staleness limit follow from it (default: "
                          "$LLMFLEET_PROMETHEUS_SCRAPE_INTERVAL_SECONDS, else read from the spacing of "
                          "each deployment's samples)")
    run.add_argument("--endpoint-picker-cluster-role", default=RenderSettings.endpoint_picker_cluster_role,
                     metavar="NAME", help="ClusterRole bound to the endpoint pickers of spec.routing.inferencePool "
                                          "in each namespace that has one; the chart creates it per release "
                                          "(default %(default)s)")
    run.add_argument("--rank-launcher-cluster-role", default=RenderSettings.rank_launcher_cluster_role,
                     metavar="NAME", help="ClusterRole bound to the leaders of replicas spanning nodes in each "
                                          "namespace that has one; the chart creates it per release "
                                          "(default %(default)s)")
    run.add_argument("--operator-namespace", default=None, metavar="NS",
                     help="the namespace this operator's pods run in: NetworkPolicies rendered for "
                          "spec.networkPolicy let it reach the serving pods (golden prompts) "
                          "(default: none, as when it runs outside the cluster)")
    run.add_argument("--leader-election-namespace", default=None, metavar="NS",
                     help="run as one of several replicas: act only while holding the Lease "
                          "llmfleet-operator in this namespace, stand by otherwise (default: no "
                          "leader election; run exactly one replica)")
    run.add_argument("--leader-election-identity", default=None, metavar="ID",
                     help="this replica's name in the Lease; unique per process (default: "
                          "hostname and a random suffix). A process restarted with the same "
                          "identity takes its lease back without waiting for it to expire")
    run.add_argument("--observation-interval-seconds", type=positive_int,
                     default=int(OperatorSettings.observation_interval_seconds), metavar="S",
                     help="how often a settled revision's traffic is observed for live re-planning "
                          "(spec.plan.liveReplanning; default %(default)s)")
    run.add_argument("--observation-window-seconds", type=positive_int,
                     default=OperatorSettings.observation_window_seconds, metavar="S",
                     help="the window each observation covers (default %(default)s)")
    run.add_argument("--observation-min-requests", type=positive_int,
                     default=OperatorSettings.observation_min_requests, metavar="N",
                     help="requests a window needs before a speed is fitted to it (default %(default)s)")
    run.add_argument("--liveness", default=None, metavar="URL",
                     help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--metrics-address", type=_listen_address, default=None, metavar="HOST:PORT",
                     help="serve every LLMDeployment's state as Prometheus gauges at /metrics, e.g. "
                          "0.0.0.0:8081 (docs/operator.md, dashboards and alerts; default: not served)")
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.set_defaults(handler=_run_operator)


def _listen_address(text: str) -> str:
    _, separator, port = text.rpartition(":")
    if not separator or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, e.g. 0.0.0.0:8081, got {text!r}")
    return text


@contextlib.contextmanager
def _liveness_while_standing_by(url: str | None):
    """Answer 200 on the liveness URL's path until the block ends (then Kopf serves it)."""
    if url is None:
        yield
        return
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    parsed = urlparse(url)

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == (parsed.path or "/") else 404)
            self.end_headers()

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def operator_settings(args) -> OperatorSettings:
    """The settings of `run`. An observation window that holds too few scrapes at the configured
    interval is refused; at an interval read from the data it is widened per deployment
    (status.observation.message says so)."""
    interval = args.prometheus_scrape_interval_seconds
    if interval is not None:
        shortest = ScrapeCadence(interval, CadenceSource.CONFIGURED).shortest_window_seconds
        if args.observation_window_seconds < shortest:
            raise BadInput(f"--observation-window-seconds {args.observation_window_seconds} holds fewer than "
                           f"{RATE_WINDOW_SCRAPES} scrapes at --prometheus-scrape-interval-seconds {interval:g}: "
                           f"give at least {shortest}")
    return OperatorSettings(
        scrape_interval_seconds=interval,
        observation_interval_seconds=args.observation_interval_seconds,
        observation_window_seconds=args.observation_window_seconds,
        observation_min_requests=args.observation_min_requests,
        render=RenderSettings(
            engine_cache_claim_name=args.engine_cache_claim, engine_cache_storage_class=args.engine_cache_storage_class,
            engine_cache_size=args.engine_cache_size, model_code_image=args.model_code_image,
            object_store_client_image=args.object_store_client_image, operator_namespace=args.operator_namespace,
            endpoint_picker_cluster_role=args.endpoint_picker_cluster_role,
            rank_launcher_cluster_role=args.rank_launcher_cluster_role))


def _stopping_on_failure(failed: concurrent.futures.Future, stop_within_s: float) -> Callable[[str], None]:
    """What an internal task that failed calls with why (kept in `failed`): the process signals
    itself to stop, as Kubernetes would, so that Kopf stops the way it does for a pod's
    termination, and it ends within `stop_within_s` however that stop goes. Not Kopf's stop
    flag: Kopf 1.45.2 waits on a concurrent.futures flag in a thread of the loop's default
    executor (_cogs/aiokits/aioadapters.py, wait_flag), which a stop for any other reason leaves
    blocked, so the loop's shutdown waited on it until Kopf's ultimate kill, the Lease unreleased."""
    def stop_operator(why: str) -> None:
        if failed.done():
            return
        failed.set_result(why)
        deadline = threading.Timer(stop_within_s, _exit_at_once, args=(why, stop_within_s))
        deadline.daemon = True
        deadline.start()
        os.kill(os.getpid(), signal.SIGTERM)
    return stop_operator


def _exit_at_once(why: str, stop_within_s: float) -> None:
    log.error("operator: not stopped %.0f s after %s; exiting now", stop_within_s, why)
    logging.shutdown()
    os._exit(exit_codes.OPERATOR_FAILED)


def _run_operator(args) -> int:
    if args.kubeconfig:
        # Kopf's own login reads the same file. Set before the kubernetes client is imported:
        # it reads $KUBECONFIG once, at import.
        os.environ["KUBECONFIG"] = str(Path(args.kubeconfig).resolve())
    import kopf

    from llmfleet import handlers  # registers the handlers
    prometheus = prometheus_connection(args)  # a wrong option stops here, before any election
    settings = operator_settings(args)
    kopf.configure(verbose=args.verbose)
    elector = None
    if args.leader_election_namespace:
        from llmfleet.k8s import leader, load_api_client

        elector = leader.LeaderElector(
            load_api_client(args.kubeconfig), args.leader_election_namespace, LEADER_LEASE_NAME,
            args.leader_election_identity or leader.default_identity())
        stopping = threading.Event()
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, lambda *_: stopping.set())
        # A standby is alive too: it answers the liveness probe until Kopf takes the port over.
        with _liveness_while_standing_by(args.liveness):
            if not elector.acquire(stopping):
                return exit_codes.OK
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signal_number, signal.SIG_DFL)  # Kopf installs its own
        elector.keep_renewing(leader.exit_on_lost_lease)
    failed = concurrent.futures.Future()  # set to why when an internal task of llmfleet's fails
    try:
        # An internal task of Kopf's that fails stops it too, and kopf.run raises the error.
        kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
                 liveness_endpoint=args.liveness,
                 memo=kopf.Memo(operator_settings=settings, kubeconfig=args.kubeconfig,
                                prometheus=prometheus, metrics_address=args.metrics_address,
                                stop_operator=_stopping_on_failure(failed, handlers.STOP_WITHIN_S)))
    finally:
        if elector is not None:
            elector.release()
    if failed.done():
        log.error("operator: stopped because %s; exiting to be restarted", failed.result())
        return exit_codes.OPERATOR_FAILED
    return exit_codes.OK
