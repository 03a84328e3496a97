"""The serving container's preStop drain (render/serving.py `drain_hook`), run as the kubelet runs
it, against a metrics endpoint whose engine gauge the test sets: it waits while the engine holds
requests and ends once it holds none, at its budget, or when the metrics cannot be read."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmfleet.render import RenderSettings, layout, serving


class Engine:
    """The active requests the fake metrics endpoint reports."""

    active = 0


class Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        body = (f'{layout.REQUEST_GAUGE}{{model="tensorrt_llm",{layout.REQUEST_TYPE_LABEL}="max",version="1"}} 4\n'
                f'{layout.REQUEST_GAUGE}{{model="tensorrt_llm",{layout.REQUEST_TYPE_LABEL}='
                f'"{layout.ACTIVE_REQUESTS}",version="1"}} {Engine.active}\n').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def _drain(url: str, budget_s: float) -> subprocess.Popen:
    """The rendered hook with the test's endpoint, no initial delay and a short budget and poll."""
    command = serving.drain_hook(RenderSettings())["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    delay, _budget, _url, _poll, *rest = command[3:]
    assert (delay, _url) == (str(serving.DRAIN_DELAY_SECONDS), f"http://127.0.0.1:{layout.METRICS_PORT}/metrics")
    return subprocess.Popen([sys.executable, "-c", command[2], "0", str(budget_s), url, "0.1", *rest])


def test_the_drain_waits_while_the_engine_holds_requests_and_ends_once_it_holds_none(metrics_url):
    Engine.active = 2
    started = time.monotonic()
    drain = _drain(metrics_url, budget_s=30)
    time.sleep(1.5)
    assert drain.poll() is None, "the drain ended while the engine held requests"
    Engine.active = 0
    assert drain.wait(timeout=5) == 0
    assert 1.5 <= time.monotonic() - started < 5


def test_the_drain_ends_at_its_budget_or_when_the_metrics_cannot_be_read(metrics_url):
    Engine.active = 3
    started = time.monotonic()
    assert _drain(metrics_url, budget_s=1).wait(timeout=5) == 0
    assert 1 <= time.monotonic() - started < 3
    started = time.monotonic()
    assert _drain("http://127.0.0.1:9/metrics", budget_s=30).wait(timeout=5) == 0
    assert time.monotonic() - started < 3


def test_the_grace_period_holds_the_delay_the_drain_and_tritons_stop():
    settings = RenderSettings()
    assert (serving.drain_budget_seconds(settings) + serving.exit_timeout_seconds(settings)
            + serving.EXIT_MARGIN_SECONDS) == settings.termination_grace_period_seconds
    assert serving.exit_timeout_seconds(settings) == serving.STOP_SECONDS
