"""The engine stand-in: a CPU emulator of a TensorRT-LLM engine, served inside a real Triton."""
