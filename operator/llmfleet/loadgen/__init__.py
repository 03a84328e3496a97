"""Load generator for Triton + TensorRT-LLM streaming endpoints (`llmfleet load`).

Pure parts (no clock, no network): `schedule` (arrival-rate schedules and Poisson arrivals),
`lengths` (token-length distributions), `workload` (request plans, traces, synthetic prompts),
`stats` (percentiles, summaries, Pareto frontier). I/O: `transport` (gRPC streams), `runner`
(open- and closed-loop runs, progress, output files), `plot` (the sweep's PNG).
"""
