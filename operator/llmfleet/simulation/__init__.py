"""Pure simulation of a serving fleet in virtual time: the emulated engine's scheduler, its profile
from the planner's model, and (`llmfleet simulate`) replicas, routing, the metrics Prometheus would hold
and the autoscaler policy. No I/O, no clock; the sandbox's emulator runs the same engine code."""
