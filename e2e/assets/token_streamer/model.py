"""A tiny decoupled python-backend model for sandbox tests: streams one
response per token, echoing the prompt's words and then counting. The config
parameter `load_delay_seconds` makes loading slow, so tests can see a pod that
runs but is not yet Ready."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TOKEN_INTERVAL_SECONDS = 0.005


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        delay = parameters.get("load_delay_seconds", {}).get("string_value", "0")
        time.sleep(float(delay))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()[0].decode()
            max_tokens = int(pb_utils.get_input_tensor_by_name(request, "MAX_TOKENS").as_numpy()[0])
            words = prompt.split() or ["token"]
            for index in range(max_tokens):
                token = words[index % len(words)] + f"#{index}"
                tensor = pb_utils.Tensor("TOKEN", np.array([token.encode()], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[tensor]))
                time.sleep(TOKEN_INTERVAL_SECONDS)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
