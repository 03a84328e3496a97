"""The open-loop runner's use of streams, with a transport that answers at once: what is
checked is which stream each request goes out on, not what a server does with it."""

from __future__ import annotations

import time

from tritonclient.utils import InferenceServerException

from llmfleet.loadgen import runner, transport
from llmfleet.loadgen.workload import PlannedRequest, PromptFactory

MAX_STREAM_AGE_S = 0.2


class InstantStream:
    """Answers each request as soon as it is sent; records how old it was when it sent."""

    sent_at_age_s: list[float] = []

    def __init__(self, endpoint, model, clock, timer, on_done):
        self.endpoint, self.broken = endpoint, False
        self._clock, self._on_done = clock, on_done
        self._opened_s = time.monotonic()

    def age_s(self) -> float:
        return time.monotonic() - self._opened_s

    def send(self, record, prompt) -> None:
        InstantStream.sent_at_age_s.append(self.age_s())
        record.send_s = record.end_s = self._clock.now_s()
        record.token_times_s, record.final = [record.send_s], True
        self._on_done(self, record)

    def close(self) -> None:
        pass

    def abandon(self):
        return None


def test_a_stream_that_aged_while_its_request_waited_for_its_arrival_is_replaced_at_the_send(monkeypatch):
    """Requests a second apart with streams retired at 0.2 s: each must open a new stream. A
    stream picked before the wait was sent on a second later: at a replica's scale-down it had
    left the Service by then, and the request failed there."""
    monkeypatch.setattr(runner, "RequestStream", InstantStream)
    InstantStream.sent_at_age_s = []
    plan = [PlannedRequest(index, 0.1 + index * 1.0, 8, 1) for index in range(3)]
    result = runner.run_open_loop(runner.Target(["replica:8001"], "ensemble"), plan, PromptFactory(0),
                                  duration_s=2.2, max_in_flight=8, drain_timeout_s=1, quiet=True,
                                  max_stream_age_s=MAX_STREAM_AGE_S)
    assert [record.status for record in result.records] == ["ok"] * 3
    assert len(InstantStream.sent_at_age_s) == 3
    assert max(InstantStream.sent_at_age_s) <= MAX_STREAM_AGE_S, InstantStream.sent_at_age_s


class NoEndpointClient:
    """A connection through a Service that has no ready endpoint at the moment: refused."""

    def __init__(self, endpoint, channel_args=None):
        self.closed = False

    def get_model_config(self, model, as_json=False):
        raise InferenceServerException("[StatusCode.UNAVAILABLE] failed to connect to all addresses")

    def stop_stream(self, cancel_requests=False):
        pass

    def close(self):
        self.closed = True


def test_a_connection_that_cannot_be_opened_fails_its_request_not_the_run(monkeypatch):
    """A Service whose one replica is being replaced refuses new connections for a few seconds;
    the requests sent meanwhile are errors in the summary, and the run goes on (it stopped with
    a traceback and no summary before)."""
    monkeypatch.setattr(transport.grpcclient, "InferenceServerClient", NoEndpointClient)
    plan = [PlannedRequest(index, 0.05 * index, 8, 1) for index in range(3)]
    result = runner.run_open_loop(runner.Target(["replica:8001"], "ensemble"), plan, PromptFactory(0),
                                  duration_s=0.3, max_in_flight=8, drain_timeout_s=1, quiet=True)
    assert [record.status for record in result.records] == ["error"] * 3
    assert all(record.error.startswith("connect failed: [StatusCode.UNAVAILABLE]") for record in result.records)
