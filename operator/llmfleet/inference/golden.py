"""Golden prompts sent straight to serving pods over Triton's gRPC API, with greedy decoding.

The request goes to the model clients call (render.layout.REQUEST_MODEL): the engine runtime's
ensemble, or the LLM-API runtime's model. Each takes the prompt as text and returns text;
greedy decoding is top-k 1, under the input name of that model (tensor names as in the release
records, catalog/releases/*.yaml).
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient

from llmfleet.render.layout import ENSEMBLE_MODEL
from llmfleet.rollout.quality import GoldenAnswers, PodAnswers

# Per model: (prompt, answer length, streaming flag, top-k) input names.
GREEDY_INPUTS = {
    ENSEMBLE_MODEL: ("text_input", "max_tokens", "stream", "top_k"),
    "tensorrt_llm": ("text_input", "sampling_param_max_tokens", "streaming", "sampling_param_top_k"),
}
TEXT_OUTPUT = "text_output"
# Requests in flight at once over all pods: enough to ask a few replicas in parallel without
# loading any one of them like traffic would.
PARALLEL_REQUESTS = 8


@dataclass(frozen=True)
class Replica:
    pod: str
    endpoint: str  # host:port of its gRPC API


def _inputs(model: str, shape: list[int], prompt: str, max_tokens: int) -> list:
    names = GREEDY_INPUTS[model]
    values = ((np.array([prompt.encode()], dtype=np.object_), "BYTES"),
              (np.array([max_tokens], dtype=np.int32), "INT32"),
              (np.array([False]), "BOOL"),
              (np.array([1], dtype=np.int32), "INT32"))
    tensors = []
    for name, (value, datatype) in zip(names, values):
        tensor = grpcclient.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(value.reshape(shape))
        tensors.append(tensor)
    return tensors


def _answer(endpoint: str, model: str, prompt: str, max_tokens: int, timeout_s: float) -> str:
    """The whole answer to one prompt; raises with Triton's message when the request fails."""
    client = grpcclient.InferenceServerClient(endpoint)
    responses: queue.Queue = queue.Queue()
    try:
        config = client.get_model_config(model, as_json=True, client_timeout=timeout_s)["config"]
        # TensorRT-LLM's repositories batch: every input then has a leading batch dimension.
        shape = [1, 1] if int(config.get("max_batch_size", 0)) > 0 else [1]
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, _inputs(model, shape, prompt, max_tokens), enable_empty_final_response=True)
        text = []
        while True:
            result, error = responses.get(timeout=timeout_s)
            if error is not None:
                raise RuntimeError(str(error))
            response = result.get_response()
            if any(output.name == TEXT_OUTPUT for output in response.outputs):
                text.extend(item.decode() if isinstance(item, bytes) else str(item)
                            for item in result.as_numpy(TEXT_OUTPUT).reshape(-1))
            if response.parameters["triton_final_response"].bool_param:
                return "".join(text)
    finally:
        client.stop_stream()
        client.close()


def _collect(pod: str, futures) -> PodAnswers:
    answers, errors = [], []
    for future in futures:
        try:
            answers.append(future.result())
        except Exception as error:  # tritonclient raises its own type for every failure; any is an answer
            answers.append(None)
            errors.append(f"{type(error).__name__}: {error}"[:300])
    return PodAnswers(pod, tuple(answers), tuple(errors))


def ask_golden_prompts(stable: Replica, canary: Sequence[Replica], model: str, prompts: Sequence[str],
                       max_tokens: int, timeout_s: float = 60.0) -> GoldenAnswers:
    """Every prompt to one stable replica (the reference) and to every canary replica."""
    replicas = (stable, *canary)
    with ThreadPoolExecutor(PARALLEL_REQUESTS) as pool:
        futures = [[pool.submit(_answer, replica.endpoint, model, prompt, max_tokens, timeout_s)
                    for prompt in prompts] for replica in replicas]
        reference, *answers = (_collect(replica.pod, pending) for replica, pending in zip(replicas, futures))
    return GoldenAnswers(tuple(prompts), reference, tuple(answers))
