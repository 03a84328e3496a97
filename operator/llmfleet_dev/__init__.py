"""Development code of llmfleet: what only its tests and benchmarks use (the calibration fit,
the checks of rendered workloads against the upstream records).

Not in the operator image, which ships the product package alone, and never imported by the
product (`operator/tests/test_layering.py`).
"""
