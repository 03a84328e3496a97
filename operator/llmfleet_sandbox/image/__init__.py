"""Stand-ins for programs of the Triton TensorRT-LLM image, laid out by `llmfleet_sandbox.trtllm_image`."""
