"""The LLMDeployment the render tests render (a pinned plan, so the manifests do not move with
the planner)."""

from __future__ import annotations


def manifest(tensor_parallel_size: int, *, quantization: str = "FP8", name: str = "chat") -> dict:
    return {
        "apiVersion": "llmfleet.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": name, "namespace": "serving", "uid": "0b5e8f4e-6d1c-4a57-9a55-2f8c1d3e7a10"},
        "spec": {
            "model": {"name": "llama-3.1-70b" if tensor_parallel_size > 1 else "llama-3.1-8b",
                      "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
                      "secretRef": {"name": "hub-token", "key": "token"}},
            "engine": {"runtime": "engine"},
            "slo": {"ttftP99Ms": 2000, "tpotP99Ms": 100},
            "workload": {"inputTokensMean": 512, "inputTokensP99": 2048, "outputTokensMean": 128,
                         "outputTokensP99": 512, "peakRequestsPerSecond": 2, "prefixSharingFraction": 0.25},
            "plan": {"gpuType": "H100-SXM-80GB", "tensorParallelSize": tensor_parallel_size,
                     "quantization": quantization, "kvCacheDtype": "FP8" if quantization == "FP8" else "BF16",
                     "replicas": 1},
        },
    }
