"""llmfleet: a Kubernetes operator for LLM serving fleets on Triton + TensorRT-LLM."""

__version__ = "0.1.0"
