"""The Prometheus adapter against a real Prometheus scraping tiny exporters.

The exporters stand in for Triton pods and are discovered with the sandbox's own pod
discovery format and relabelling, so the label names the PromQL selects on are the ones a
sandbox (or real cluster) Prometheus attaches.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmfleet.catalog.release_record import RUNTIME_RELEASES, load_release_record
from llmfleet.autoscale import MetricsFailure
from llmfleet.metrics import PrometheusMetrics
from llmfleet.metrics.cadence import CadenceSource
from llmfleet.metrics.connection import PrometheusConnection
from llmfleet.metrics.prometheus import deployment_queries
from llmfleet.render.identity import DEPLOYMENT_LABEL, REVISION_LABEL, fit_name
from llmfleet.render.ttft_buckets import UNRECORDED_BOUNDS_MS
from llmfleet_dev.release_checks import check_metric
from llmfleet_sandbox import certs
from llmfleet_sandbox import prometheus as sandbox_prometheus
from llmfleet_sandbox.config import PROMETHEUS_USERNAME, Ports, SandboxConfig
from llmfleet_sandbox.poddiscovery import PodIndex

PROMETHEUS_BINARY = Path("/usr/bin/prometheus")
NAMESPACE = "team-a"
DEPLOYMENT = "llama"
IDLE_DEPLOYMENT = "idle"
# Two revisions rendered for different SLOs: one pod has a bound at 350 ms, the other not.
MIXED_DEPLOYMENT = "mixed"
OLD_REVISION_BOUNDS_MS, NEW_REVISION_BOUNDS_MS = (100, 300, 400, 500), (100, 300, 350, 400, 500)
SKEWED_DEPLOYMENT = "skewed"
# A namespace scraped at an interval of its own (the sandbox's `scrape-interval`).
SLOW_NAMESPACE, SLOW_INTERVAL_SECONDS = "team-slow", 3
WINDOW_SECONDS = 5
SCRAPE_INTERVAL_SECONDS = 1
STARTUP_TIMEOUT_SECONDS = 20

# The bounds the fake pods export (but the "mixed" deployment's).
BOUNDS_MS = UNRECORDED_BOUNDS_MS
# Share of requests per TTFT bucket: 98 % at or under 300 ms, 2 % in (300, 400], so the p99
# interpolates to the middle of that bucket.
SHARE_BY_BUCKET = {100: 0.50, 300: 0.48, 400: 0.02}
EXPECTED_P99_MS = 350.0
REQUESTS_PER_SECOND = 100.0
PROMPT_TOKENS_MEAN, ANSWER_TOKENS_MEAN = 700.0, 150.0
PREFIX_REUSE_FRACTION, TOKENS_PER_BLOCK = 0.25, 64

pytestmark = pytest.mark.skipif(not PROMETHEUS_BINARY.exists(), reason="needs /usr/bin/prometheus")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _histogram(model: str, total: float, share_by_bucket: dict[int, float],
               bounds_ms: tuple[int, ...] = BOUNDS_MS) -> list[str]:
    labels = f'model="{model}",version="1"'
    lines, cumulative = [], 0.0
    for bound in bounds_ms:
        cumulative += share_by_bucket.get(bound, 0.0)
        lines.append(f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="{bound}"}} '
                     f"{total * cumulative}")
    lines += [f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="+Inf"}} {total}',
              f"nv_inference_first_response_histogram_ms_sum{{{labels}}} {total * 150}",
              f"nv_inference_first_response_histogram_ms_count{{{labels}}} {total}"]
    return lines


class FakeTritonPod:
    """Serves /metrics like a Triton pod with the TensorRT-LLM backend, counters growing at a
    fixed request rate (zero for an idle pod)."""

    def __init__(self, name: str, deployment: str, requests_per_second: float, waiting: int,
                 kv_blocks_used: int, kv_blocks_max: int, scrape_fails: bool = False,
                 share_by_bucket: dict[int, float] = SHARE_BY_BUCKET, namespace: str = NAMESPACE,
                 bounds_ms: tuple[int, ...] = BOUNDS_MS):
        self.name, self.deployment, self.scrape_fails = name, deployment, scrape_fails
        self.bounds_ms = bounds_ms
        self.namespace = namespace
        self.share_by_bucket = share_by_bucket
        self.requests_per_second = requests_per_second
        self.waiting, self.kv_blocks_used, self.kv_blocks_max = waiting, kv_blocks_used, kv_blocks_max
        self.started = time.monotonic()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def exposition(self) -> str:
        served = 1000 + self.requests_per_second * (time.monotonic() - self.started)
        gauge = 'model="tensorrt_llm",version="1"'
        lines = ["# TYPE nv_inference_first_response_histogram_ms histogram"]
        lines += _histogram("tensorrt_llm", served, self.share_by_bucket, self.bounds_ms)
        # The ensemble sees the same requests, slower: counting it would double the rate.
        lines += _histogram("ensemble", served, {500: 1.0})
        for family, kind, mean_tokens in (("nv_llm_input_token_len", "total_input_tokens", PROMPT_TOKENS_MEAN),
                                          ("nv_llm_output_token_len", "total_output_tokens", ANSWER_TOKENS_MEAN)):
            labels = f'{gauge},response_metric_type="{kind}"'
            lines += [f"# TYPE {family} histogram",
                      f'{family}_bucket{{{labels},le="+Inf"}} {served}',
                      f"{family}_sum{{{labels}}} {served * mean_tokens}",
                      f"{family}_count{{{labels}}} {served}"]
        lines += ["# TYPE nv_trt_llm_request_metrics gauge",
                  f'nv_trt_llm_request_metrics{{{gauge},request_type="waiting"}} {self.waiting}',
                  f'nv_trt_llm_request_metrics{{{gauge},request_type="active"}} 7',
                  f'nv_trt_llm_request_metrics{{{gauge},request_type="max"}} 10',
                  "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
                  f'nv_trt_llm_kv_cache_block_metrics{{{gauge},kv_cache_block_type="used"}} '
                  f"{self.kv_blocks_used}",
                  f'nv_trt_llm_kv_cache_block_metrics{{{gauge},kv_cache_block_type="max"}} '
                  f"{self.kv_blocks_max}",
                  # A running total: a quarter of every prompt's tokens came from the cache.
                  f'nv_trt_llm_kv_cache_block_metrics{{{gauge},kv_cache_block_type="reused"}} '
                  f"{served * PROMPT_TOKENS_MEAN * PREFIX_REUSE_FRACTION / TOKENS_PER_BLOCK}",
                  f'nv_trt_llm_kv_cache_block_metrics{{{gauge},kv_cache_block_type="tokens_per"}} '
                  f"{TOKENS_PER_BLOCK}"]
        return "\n".join(lines) + "\n"

    def pod(self) -> dict:
        return {
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": f"uid-{self.name}",
                         "labels": {DEPLOYMENT_LABEL: fit_name(self.deployment),
                                    REVISION_LABEL: "0123456789"},
                         "annotations": {"prometheus.io/scrape": "true",
                                         "prometheus.io/port": str(self.port)}},
            "spec": {"nodeName": "node-0",
                     "containers": [{"name": "triton", "ports": [{"containerPort": self.port}]}]},
            "status": {"podIP": "127.0.0.1", "phase": "Running"},
        }

    def _handler(self):
        pod = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if pod.scrape_fails:
                    self.send_error(503)
                    return
                body = pod.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler


def _serve_json(payload) -> ThreadingHTTPServer:
    body = json.dumps(payload).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _now() -> datetime:
    return datetime.now(timezone.utc)


class RunningPrometheus:
    def __init__(self, process: subprocess.Popen, url: str):
        self.process, self.url = process, url

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _client(url: str, timeout_seconds: float = 2, **options) -> PrometheusMetrics:
    return PrometheusMetrics(PrometheusConnection(url, timeout_seconds=timeout_seconds, **options))


def _start(config: SandboxConfig) -> RunningPrometheus:
    log = (config.state_dir / "prometheus.log").open("w")
    process = subprocess.Popen(sandbox_prometheus.argv(config), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return RunningPrometheus(process, config.prometheus_url)


@pytest.fixture(scope="module")
def discovery():
    """The fake pods, served as the sandbox's pod discovery serves them."""
    pods = [FakeTritonPod("llama-a", DEPLOYMENT, REQUESTS_PER_SECOND / 2, 3, 30, 100),
            FakeTritonPod("llama-b", DEPLOYMENT, REQUESTS_PER_SECOND / 2, 5, 50, 100),
            FakeTritonPod("llama-c", DEPLOYMENT, 0.0, 0, 0, 100, scrape_fails=True),
            FakeTritonPod("idle-a", IDLE_DEPLOYMENT, 0.0, 0, 0, 100),
            # One replica swamped (half its requests beyond the top bucket), one fast, one idle.
            FakeTritonPod("skewed-swamped", SKEWED_DEPLOYMENT, 10.0, 0, 0, 100, share_by_bucket={100: 0.5}),
            FakeTritonPod("skewed-fast", SKEWED_DEPLOYMENT, 10.0, 0, 0, 100, share_by_bucket={25: 1.0}),
            FakeTritonPod("skewed-idle", SKEWED_DEPLOYMENT, 0.0, 0, 0, 100),
            FakeTritonPod("slow-a", DEPLOYMENT, 1.0, 0, 0, 100, namespace=SLOW_NAMESPACE),
            FakeTritonPod("mixed-old", MIXED_DEPLOYMENT, 10.0, 0, 0, 100, bounds_ms=OLD_REVISION_BOUNDS_MS),
            FakeTritonPod("mixed-new", MIXED_DEPLOYMENT, 10.0, 0, 0, 100, bounds_ms=NEW_REVISION_BOUNDS_MS,
                          share_by_bucket={100: 0.50, 300: 0.48, 350: 0.01, 400: 0.01})]
    index = PodIndex()
    index.reset([pod.pod() for pod in pods])
    server = _serve_json(index.target_groups(namespace_intervals={SLOW_NAMESPACE: SLOW_INTERVAL_SECONDS}))
    yield server.server_address[1]
    server.shutdown()
    for pod in pods:
        pod.server.shutdown()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, discovery):
    config = SandboxConfig(state_dir=tmp_path_factory.mktemp("prometheus"), prometheus_ip="127.0.0.1",
                           scrape_interval_seconds=SCRAPE_INTERVAL_SECONDS,
                           ports=Ports(prometheus=_free_port(), pod_discovery=discovery))
    running = _start(config)
    try:
        _wait_for_rates(running, _client(running.url, 1))
        yield running
    finally:
        running.stop()


def _wait_for_rates(running: RunningPrometheus, metrics: PrometheusMetrics) -> None:
    """Until both deployments have a window full of scrapes."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    try:
        while time.monotonic() < deadline:
            assert running.process.poll() is None, "prometheus exited; see prometheus.log"
            busy = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
            idle = metrics.snapshot(NAMESPACE, IDLE_DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
            if busy.ttft_p99_ms is not None and idle.requests_per_second is not None:
                # rate() over a window the series only partly covers under-reads: fill it.
                time.sleep(WINDOW_SECONDS + 1)
                return
            time.sleep(0.5)
        raise AssertionError("prometheus did not scrape the fake pods in time")
    finally:
        metrics.close()


@pytest.fixture
def metrics(prometheus):
    client = _client(prometheus.url)
    yield client
    client.close()


def test_the_scrape_interval_is_read_from_the_spacing_of_each_deployments_samples(prometheus, metrics):
    time.sleep(3 * SLOW_INTERVAL_SECONDS)  # three samples of the slow namespace's pod
    now = _now()
    fast = metrics.scrape_cadence(NAMESPACE, DEPLOYMENT, now)
    slow = metrics.scrape_cadence(SLOW_NAMESPACE, DEPLOYMENT, now)
    assert (fast.source, slow.source) == (CadenceSource.OBSERVED, CadenceSource.OBSERVED)
    assert fast.interval_seconds == pytest.approx(SCRAPE_INTERVAL_SECONDS, abs=0.1)
    assert slow.interval_seconds == pytest.approx(SLOW_INTERVAL_SECONDS, abs=0.1)
    # Told, the operator believes the configuration; with no samples it assumes a long interval.
    assert metrics.scrape_cadence(NAMESPACE, DEPLOYMENT, now, configured_seconds=30).source == CadenceSource.CONFIGURED
    assert metrics.scrape_cadence(NAMESPACE, "missing", now).source == CadenceSource.ASSUMED


def test_a_snapshot_carries_its_cadence_for_the_staleness_check(metrics):
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), scrape_interval_seconds=1.0,
                                ttft_bounds_ms=BOUNDS_MS)
    assert (snapshot.scrape_interval_seconds, snapshot.window_seconds) == (1.0, WINDOW_SECONDS)


def test_the_request_rates_peak_and_trend_are_read_over_their_windows(metrics):
    time.sleep(2 * WINDOW_SECONDS)  # the trend's range (two rate windows) full of scrapes
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), scrape_interval_seconds=1.0,
                                peak_window_seconds=3, ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is None
    assert (snapshot.peak_window_seconds, snapshot.trend_window_seconds) == (3, 2 * WINDOW_SECONDS)
    # A steady 100 requests/s: the peak is the rate, and the rate does not trend.
    assert snapshot.requests_per_second_peak == pytest.approx(REQUESTS_PER_SECOND, rel=0.1)
    assert snapshot.requests_per_second_peak >= snapshot.requests_per_second * 0.99
    assert snapshot.requests_per_second_trend == pytest.approx(0, abs=0.05 * REQUESTS_PER_SECOND)


def test_snapshot_reads_the_fleet(metrics):
    now = _now()
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, now, ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is None
    # The p99 lies in the (300, 400] bucket; linear interpolation puts it at the middle.
    assert snapshot.ttft_p99_ms == pytest.approx(EXPECTED_P99_MS, abs=5)
    assert snapshot.requests_per_second == pytest.approx(REQUESTS_PER_SECOND, rel=0.1)
    assert snapshot.waiting_requests == 8  # 3 + 5; the idle deployment's pod is not counted
    assert snapshot.waiting_growth_per_second == pytest.approx(0, abs=1e-9)
    assert snapshot.kv_cache_utilization == pytest.approx(0.4)  # (30 + 50) / (100 + 100)
    assert snapshot.batch_utilization == pytest.approx(0.7)  # (7 + 7) / (10 + 10)
    assert now - timedelta(seconds=3) <= snapshot.sample_time <= now + timedelta(seconds=1)
    assert snapshot.reporting_pods == 2  # llama-c's scrapes fail: it has no series
    assert snapshot.ttft_histogram_top_ms == BOUNDS_MS[-1]
    assert [replica.pod for replica in snapshot.replicas] == ["llama-a", "llama-b"]
    for replica in snapshot.replicas:
        assert replica.ttft_p99_ms == pytest.approx(EXPECTED_P99_MS, abs=5)
        assert replica.requests_per_second == pytest.approx(REQUESTS_PER_SECOND / 2, rel=0.1)


def test_a_revisions_observed_workload_has_its_rate_replicas_ttft_and_lengths_where_exported(metrics):
    engine = load_release_record(RUNTIME_RELEASES["engine"]).metrics
    observed = metrics.observed_workload(NAMESPACE, DEPLOYMENT, "0123456789", WINDOW_SECONDS, _now(), engine)
    assert observed.error is None
    assert observed.requests_per_second == pytest.approx(REQUESTS_PER_SECOND, rel=0.1)
    assert observed.requests == pytest.approx(REQUESTS_PER_SECOND * WINDOW_SECONDS, rel=0.2)
    assert observed.replicas == 2
    assert observed.ttft_p99_ms == pytest.approx(EXPECTED_P99_MS, abs=5)
    assert observed.input_tokens_mean == pytest.approx(PROMPT_TOKENS_MEAN)
    assert observed.output_tokens_mean == pytest.approx(ANSWER_TOKENS_MEAN)
    assert observed.prefix_reuse_fraction == pytest.approx(PREFIX_REUSE_FRACTION, rel=0.01)
    # The LLM-API model exports no token lengths: they are unknown, not zero.
    llmapi = load_release_record(RUNTIME_RELEASES["llmapi"]).metrics
    without = metrics.observed_workload(NAMESPACE, DEPLOYMENT, "0123456789", WINDOW_SECONDS, _now(), llmapi)
    assert (without.input_tokens_mean, without.output_tokens_mean, without.prefix_reuse_fraction) == (None, None, None)
    other = metrics.observed_workload(NAMESPACE, DEPLOYMENT, "another", WINDOW_SECONDS, _now(), engine)
    assert (other.requests, other.replicas, other.ttft_p99_ms) == (0, 0, None)


def test_a_revisions_samples_for_a_canary_analysis_have_requests_p99_and_the_exact_mean(metrics):
    samples = metrics.revision_samples(NAMESPACE, DEPLOYMENT, "0123456789", "another", WINDOW_SECONDS, _now())
    assert samples.error is None
    stable, canary = samples.stable, samples.canary
    assert stable.ttft_p99_ms == pytest.approx(EXPECTED_P99_MS, abs=5)
    assert stable.ttft_mean_ms == pytest.approx(150.0)  # the fake histogram's sum is 150 ms a request
    assert (canary.ttft_p99_ms, canary.ttft_mean_ms) == (None, None)  # a revision without pods: no data


def test_ttft_attainment_is_the_share_within_the_slo_among_pods_with_that_bound(metrics):
    now = _now()
    # 98 % of first tokens at or under 300 ms, the rest by 400 ms.
    assert metrics.ttft_attainment(NAMESPACE, DEPLOYMENT, 300, WINDOW_SECONDS, now) == pytest.approx(0.98, abs=0.005)
    assert metrics.ttft_attainment(NAMESPACE, DEPLOYMENT, 400, WINDOW_SECONDS, now) == pytest.approx(1.0)
    # The SLO is a bound of every revision rendered for it; no pod with that bound, no answer.
    assert metrics.ttft_attainment(NAMESPACE, DEPLOYMENT, 399, WINDOW_SECONDS, now) is None
    assert metrics.ttft_attainment(NAMESPACE, IDLE_DEPLOYMENT, 300, WINDOW_SECONDS, now) is None  # no requests
    # Only the revision rendered for a 350 ms SLO measures it: 99 % of its first tokens.
    assert metrics.ttft_attainment(NAMESPACE, MIXED_DEPLOYMENT, 350, WINDOW_SECONDS, now) == pytest.approx(
        0.99, abs=0.005)


def test_the_fleets_p99_over_revisions_with_other_bounds_reads_the_bounds_they_share(metrics):
    """Summed by `le` over both pods, the 350 ms bucket would hold the new pod's requests alone
    (a cumulative count that falls, which Prometheus flattens) and the p99 would come out at
    375 ms; on the shared bounds both pods say (300, 400] with 2 % in it: 350 ms."""
    shared = tuple(sorted(set(OLD_REVISION_BOUNDS_MS) & set(NEW_REVISION_BOUNDS_MS)))
    snapshot = metrics.snapshot(NAMESPACE, MIXED_DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=shared)
    assert snapshot.ttft_p99_ms == pytest.approx(350, abs=5)
    assert snapshot.ttft_histogram_top_ms == 500
    every = tuple(sorted(set(OLD_REVISION_BOUNDS_MS) | set(NEW_REVISION_BOUNDS_MS)))
    unfiltered = metrics.snapshot(NAMESPACE, MIXED_DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=every)
    assert unfiltered.ttft_p99_ms == pytest.approx(375, abs=5)


def test_each_replica_is_seen_apart_and_a_p99_beyond_the_top_bucket_says_so(metrics):
    snapshot = metrics.snapshot(NAMESPACE, SKEWED_DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is None
    # Half of the swamped pod's requests are beyond the top bucket: the fleet's p99 is too.
    assert snapshot.ttft_p99_ms == BOUNDS_MS[-1]
    by_pod = {replica.pod: replica for replica in snapshot.replicas}
    assert sorted(by_pod) == ["skewed-fast", "skewed-idle", "skewed-swamped"]
    assert by_pod["skewed-swamped"].ttft_p99_ms == BOUNDS_MS[-1]
    assert by_pod["skewed-fast"].ttft_p99_ms < 25
    assert by_pod["skewed-idle"].ttft_p99_ms is None  # no request: NaN, not zero
    assert by_pod["skewed-idle"].requests_per_second == 0
    assert by_pod["skewed-fast"].requests_per_second == pytest.approx(10, rel=0.1)


def test_a_release_without_queue_gauges_makes_the_queue_unobservable(metrics):
    engine = load_release_record(RUNTIME_RELEASES["engine"]).metrics
    llmapi = load_release_record(RUNTIME_RELEASES["llmapi"]).metrics
    assert metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), engine,
                            ttft_bounds_ms=BOUNDS_MS).queue_observable
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), llmapi, ttft_bounds_ms=BOUNDS_MS)
    assert not snapshot.queue_observable and snapshot.ttft_p99_ms is not None


def test_a_deployment_without_requests_has_no_ttft_but_a_zero_rate(metrics):
    snapshot = metrics.snapshot(NAMESPACE, IDLE_DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is None
    assert snapshot.ttft_p99_ms is None  # histogram_quantile over no requests is NaN
    assert snapshot.requests_per_second == 0
    assert snapshot.waiting_requests == 0
    assert snapshot.kv_cache_utilization == 0
    assert snapshot.sample_time is not None
    assert snapshot.reporting_pods == 1


def test_absent_series_are_no_data_not_zero(metrics):
    for namespace, name in ((NAMESPACE, "missing"), ("other-namespace", DEPLOYMENT)):
        snapshot = metrics.snapshot(namespace, name, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
        assert snapshot.error is None
        assert (snapshot.ttft_p99_ms, snapshot.waiting_requests, snapshot.waiting_growth_per_second,
                snapshot.kv_cache_utilization, snapshot.requests_per_second,
                snapshot.sample_time, snapshot.reporting_pods) == (None,) * 7


def test_samples_older_than_the_query_time_show_their_age(metrics):
    later = _now() + timedelta(minutes=2)
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, later, ttft_bounds_ms=BOUNDS_MS)
    # Evaluated two minutes ahead: the last samples are still within the lookback, and old.
    assert snapshot.sample_time is not None
    assert (later - snapshot.sample_time).total_seconds() > 100


def test_an_unreachable_prometheus_is_an_error():
    started = time.monotonic()
    snapshot = _client(f"http://127.0.0.1:{_free_port()}", 1).snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(),
                                                                       ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is not None and "refused" in snapshot.error
    assert snapshot.error_reason == MetricsFailure.UNREACHABLE
    assert snapshot.ttft_p99_ms is None and snapshot.sample_time is None
    assert time.monotonic() - started < 2  # no retries


def test_a_prometheus_that_does_not_answer_times_out():
    with socket.socket() as silent:  # accepts connections, never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        metrics = _client(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5)
        snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is not None and "Timeout" in snapshot.error
    assert snapshot.ttft_p99_ms is None


@pytest.fixture(scope="module")
def secured(tmp_path_factory, discovery):
    """The sandbox's Prometheus behind TLS and basic auth (its web config), scraping the same pods."""
    config = SandboxConfig(state_dir=tmp_path_factory.mktemp("secured"), prometheus_ip="127.0.0.1",
                           scrape_interval_seconds=SCRAPE_INTERVAL_SECONDS, prometheus_auth="basic",
                           ports=Ports(prometheus=_free_port(), pod_discovery=discovery))
    certs.generate_pki(config.pki_dir, ["127.0.0.1"], [])
    running = _start(config)
    options = dict(ca_file=config.pki_dir / "ca.crt", basic_auth_username=PROMETHEUS_USERNAME,
                   basic_auth_password_file=config.prometheus_password_file)
    try:
        _wait_for_rates(running, _client(running.url, 1, **options))
        yield config, options
    finally:
        running.stop()


def _wrong_password(config: SandboxConfig, directory: Path) -> Path:
    wrong = directory / "wrong-password"
    wrong.write_text(config.prometheus_password_file.read_text() + "x")
    return wrong


def test_a_prometheus_behind_tls_and_basic_auth_answers_with_the_ca_and_credentials(secured):
    config, options = secured
    assert config.prometheus_url.startswith("https://")
    snapshot = _client(config.prometheus_url, **options).snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(),
                                                                  ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is None and snapshot.ttft_p99_ms == pytest.approx(EXPECTED_P99_MS, abs=5)


def test_a_wrong_or_missing_credential_is_unauthorized_and_no_message_holds_the_secret(secured, tmp_path):
    config, options = secured
    password = config.prometheus_password_file.read_text().strip()
    wrong = {**options, "basic_auth_password_file": _wrong_password(config, tmp_path)}
    none = {"ca_file": options["ca_file"]}
    for attempt in (wrong, none):
        snapshot = _client(config.prometheus_url, **attempt).snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(),
                                                                      ttft_bounds_ms=BOUNDS_MS)
        assert snapshot.error_reason == MetricsFailure.UNAUTHORIZED, snapshot.error
        assert "--prometheus-basic-auth" in snapshot.error and "401" in snapshot.error
        assert password not in snapshot.error


def test_a_rotated_password_file_is_read_on_the_next_query(secured, tmp_path):
    config, options = secured
    rotating = tmp_path / "password"
    rotating.write_text("not-it")
    metrics = _client(config.prometheus_url, **{**options, "basic_auth_password_file": rotating})
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error_reason == MetricsFailure.UNAUTHORIZED
    rotating.write_text(config.prometheus_password_file.read_text())
    assert metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS).error is None


def test_an_untrusted_or_misnamed_certificate_is_a_tls_failure_and_a_server_name_fixes_the_name(secured):
    config, options = secured
    untrusted = _client(config.prometheus_url, **{**options, "ca_file": None})
    snapshot = untrusted.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error_reason == MetricsFailure.TLS and "--prometheus-ca-file" in snapshot.error
    # The certificate names 127.0.0.1 and the server name, not "localhost".
    by_name = config.prometheus_url.replace("127.0.0.1", "localhost")
    misnamed = _client(by_name, **options).snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(),
                                                    ttft_bounds_ms=BOUNDS_MS)
    assert misnamed.error_reason == MetricsFailure.TLS
    named = _client(by_name, server_name=config.prometheus_server_name, **options)
    assert named.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS).error is None


def test_a_stopped_prometheus_is_an_error(prometheus, metrics):
    # Runs last in this module: it stops the shared Prometheus.
    assert metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS).error is None
    prometheus.stop()
    snapshot = metrics.snapshot(NAMESPACE, DEPLOYMENT, WINDOW_SECONDS, _now(), ttft_bounds_ms=BOUNDS_MS)
    assert snapshot.error is not None
    assert snapshot.ttft_p99_ms is None and snapshot.waiting_requests is None


def _queried_series(query: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(metric, fixed label values other than the selector's) of every series a PromQL query reads."""
    series = set()
    for name, matchers in re.findall(r"(nv_[a-z_]+)\{([^}]*)\}", query):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
        fixed = tuple(sorted((label, value) for label, value in labels.items()
                             if label in ("request_type", "kv_cache_block_type")))
        series.add((re.sub(r"_(bucket|count|sum)$", "", name), fixed))
    return series


@pytest.mark.parametrize("release, absent", [
    # 24.12's backend has no waiting count: the adapter reads it as unknown, the policy falls back.
    ("engine-24.12", {("nv_trt_llm_request_metrics", (("request_type", "waiting"),))}),
    # The LLM-API model exports none of the engine's gauges: the queue is unobservable there.
    ("llmapi-25.05", {("nv_trt_llm_request_metrics", (("request_type", "waiting"),)),
                      ("nv_trt_llm_request_metrics", (("request_type", "active"),)),
                      ("nv_trt_llm_request_metrics", (("request_type", "max"),)),
                      ("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "used"),)),
                      ("nv_trt_llm_kv_cache_block_metrics", (("kv_cache_block_type", "max"),))}),
])
def test_every_series_the_autoscaler_reads_is_exported_by_the_release_or_known_absent(release, absent):
    record = load_release_record(release)
    queries = asdict(deployment_queries("ns", "chat", 30, BOUNDS_MS))
    series = set().union(*map(_queried_series, queries.values()))
    missing = {(name, fixed) for name, fixed in series if check_metric(record, name, dict(fixed))}
    assert missing == absent


def test_every_series_an_observation_reads_is_exported_by_the_engine_release():
    from llmfleet.metrics.prometheus import workload_queries

    record = load_release_record(RUNTIME_RELEASES["engine"])
    queries = asdict(workload_queries("ns", "chat", "abc123", 60))
    series = set().union(*map(_queried_series, queries.values()))
    assert {name for name, _ in series} == {"nv_inference_first_response_histogram_ms", "nv_llm_input_token_len",
                                            "nv_llm_output_token_len", "nv_trt_llm_kv_cache_block_metrics"}
    assert all(check_metric(record, name, dict(fixed)) == [] for name, fixed in series)


@pytest.mark.parametrize("release", sorted(RUNTIME_RELEASES.values()))
def test_every_series_a_canary_analysis_reads_is_exported_by_the_release(release):
    from llmfleet.metrics.prometheus import revision_queries
    from llmfleet.render.layout import REQUEST_MODEL

    record = load_release_record(release)
    queries = asdict(revision_queries("ns", "chat", "abc123", 60, REQUEST_MODEL[record.runtime]))
    series = set().union(*map(_queried_series, queries.values()))
    assert {name for name, _ in series} == {"nv_inference_request_success", "nv_inference_request_failure",
                                            "nv_inference_first_response_histogram_ms"}
    assert all(check_metric(record, name, dict(fixed)) == [] for name, fixed in series)
    assert all('llmfleet_io_revision="abc123"' in query for query in queries.values())
    # Failures are counted where Triton counts them: at the model the client calls.
    assert f'model="{REQUEST_MODEL[record.runtime]}"' in queries["failed"]
