"""The operator's own requests to serving pods (the golden prompts of a canary's quality gate):
the only package of the operator that talks to Triton."""

from llmfleet.inference.golden import ask_golden_prompts

__all__ = ["ask_golden_prompts"]
