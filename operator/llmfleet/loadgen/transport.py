"""gRPC streaming to a decoupled Triton model through `tritonclient.grpc`: the engine runtime's
`ensemble` or the LLM-API runtime's `tensorrt_llm` model, told apart by their inputs.

Each `RequestStream` is one client with one started stream and carries one request at a time:
tritonclient hands an error response to the callback without its request id, so only a stream
with a single request in flight can say which request failed. Streams are reused (opening one
costs a channel and a thread; see docs/loadgen.md for the numbers).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import tritonclient.grpc as grpcclient

from llmfleet.loadgen.stats import RequestRecord

# Callback timings kept for the overhead report; enough for stable percentiles, bounded memory.
CALLBACK_SAMPLES_KEPT = 200_000


# gRPC shares TCP connections between channels to the same address by default; each
# stream needs its own, or a Service (which balances connections) sees just one.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


# The models the operator renders, in the order `--model` defaults to them: the engine
# runtime's ensemble (tokenizing around the engine) or the LLM-API runtime's model.
SERVED_MODELS = ("ensemble", "tensorrt_llm")
# Request tensors per protocol: (prompt, answer length, streaming flag).
ENSEMBLE_INPUTS = ("text_input", "max_tokens", "stream")
LLMAPI_INPUTS = ("text_input", "sampling_param_max_tokens", "streaming")


class TargetUnavailable(Exception):
    """An endpoint does not answer or does not serve the model; the message names it."""


def check_endpoints(endpoints: list[str], model: str | None, timeout_s: float = 10.0) -> str:
    """The model to load every endpoint with: `model`, or the first of SERVED_MODELS the first
    endpoint has ready."""
    for endpoint in endpoints:
        client = grpcclient.InferenceServerClient(endpoint)
        try:
            if model is None:
                ready_models = {entry["name"] for entry in client.get_model_repository_index(
                    as_json=True, client_timeout=timeout_s).get("models", []) if entry.get("state") == "READY"}
                model = next((name for name in SERVED_MODELS if name in ready_models), None)
                if model is None:
                    raise TargetUnavailable(f"{endpoint} serves none of {', '.join(SERVED_MODELS)} "
                                            f"(ready: {', '.join(sorted(ready_models)) or 'none'}); name one with --model")
            ready = client.is_model_ready(model, client_timeout=timeout_s)
        except TargetUnavailable:
            raise
        except Exception as error:  # tritonclient raises its own type for every transport failure
            raise TargetUnavailable(f"{endpoint} does not answer gRPC: {error}") from None
        finally:
            client.close()
        if not ready:
            raise TargetUnavailable(f"{endpoint} answers but model {model!r} is not ready")
    return model


class RunClock:
    """Seconds since the start of the run, on the high-resolution monotonic clock."""

    def __init__(self):
        self._start_s = time.perf_counter()

    def start(self) -> None:
        self._start_s = time.perf_counter()

    def now_s(self) -> float:
        return time.perf_counter() - self._start_s


class CallbackTimer:
    """How long the stream callbacks take: the client's own per-token cost."""

    def __init__(self):
        self.samples_us: list[float] = []

    def add(self, microseconds: float) -> None:
        if len(self.samples_us) < CALLBACK_SAMPLES_KEPT:
            self.samples_us.append(microseconds)


class RequestStream:
    """One gRPC stream to one endpoint; `send` one request, `on_done(stream, record)` follows."""

    def __init__(self, endpoint: str, model: str, clock: RunClock, timer: CallbackTimer,
                 on_done: Callable[[RequestStream, RequestRecord], None]):
        self.endpoint = endpoint
        self.broken = False  # after an error the stream is not reused
        self._model = model
        self._clock = clock
        self._timer = timer
        self._on_done = on_done
        self._record: RequestRecord | None = None
        self._token_times_s: list[float] = []
        # Guards _record between the stream's callback thread and `abandon` at the end of a run.
        self._lock = threading.Lock()
        self._opened_monotonic_s = time.monotonic()
        self._client = grpcclient.InferenceServerClient(endpoint, channel_args=OWN_CONNECTION)
        # A connection that fails to open (a Service with no ready endpoint for a moment) fails
        # the request sent on it, not the run.
        self._open_error: str | None = None
        try:
            # TensorRT-LLM's model repositories batch (max_batch_size > 0): every input then
            # carries a leading batch dimension, [1, 1] for one request.
            config = self._client.get_model_config(model, as_json=True)["config"]
            self._client.start_stream(callback=self._on_response)
        except Exception as error:  # tritonclient raises its own type for every transport failure
            self._open_error, self.broken, config = f"connect failed: {error}", True, {}
        self._shape = [1, 1] if int(config.get("max_batch_size", 0)) > 0 else [1]
        inputs = {tensor["name"] for tensor in config.get("input", [])}
        self._input_names = LLMAPI_INPUTS if LLMAPI_INPUTS[1] in inputs else ENSEMBLE_INPUTS

    def age_s(self) -> float:
        return time.monotonic() - self._opened_monotonic_s

    def send(self, record: RequestRecord, prompt: str) -> None:
        if self._open_error is not None:
            self._record, self._token_times_s = record, []
            record.send_s = self._clock.now_s()
            self._finish(self._open_error, final=False, now_s=record.send_s)
            return
        values = (("BYTES", np.array([prompt.encode()], dtype=np.object_)),
                  ("INT32", np.array([record.output_tokens_requested], dtype=np.int32)),
                  ("BOOL", np.array([True])))
        inputs = []
        for name, (datatype, value) in zip(self._input_names, values):
            tensor = grpcclient.InferInput(name, self._shape, datatype)
            tensor.set_data_from_numpy(value.reshape(self._shape))
            inputs.append(tensor)
        self._record, self._token_times_s = record, []
        record.send_s = self._clock.now_s()
        try:
            self._client.async_stream_infer(self._model, inputs, request_id=str(record.index),
                                            enable_empty_final_response=True)
        except Exception as error:  # the stream died before this request went out
            self._finish(f"send failed: {error}", final=False, now_s=self._clock.now_s())

    def _on_response(self, result, error) -> None:
        now_s = self._clock.now_s()
        with self._lock:
            if self._record is None:  # a late response after the run gave up on this request
                return
            if error is not None:
                self._finish(str(error), final=False, now_s=now_s)
            else:
                response = result.get_response()
                if response.outputs:
                    self._token_times_s.append(now_s)
                if response.parameters["triton_final_response"].bool_param:
                    self._finish(None, final=True, now_s=now_s)
        self._timer.add((self._clock.now_s() - now_s) * 1e6)

    def _finish(self, error: str | None, final: bool, now_s: float) -> None:
        record, self._record = self._record, None
        record.token_times_s = np.asarray(self._token_times_s, dtype=np.float64)
        record.end_s, record.final, record.error = now_s, final, error
        self.broken = self.broken or error is not None
        self._on_done(self, record)

    def abandon(self) -> RequestRecord | None:
        """Stop waiting for the request in flight (it stays truncated) and close the stream."""
        with self._lock:
            record, self._record = self._record, None
            if record is not None:
                record.token_times_s = np.asarray(self._token_times_s, dtype=np.float64)
                record.end_s = self._clock.now_s()
        self.close(cancel_requests=True)
        return record

    def close(self, cancel_requests: bool = False) -> None:
        self._client.stop_stream(cancel_requests=cancel_requests)
        self._client.close()
