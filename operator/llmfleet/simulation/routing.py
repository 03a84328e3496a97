"""How a Service spreads load over its ready endpoints: kube-proxy IPVS mode's `rr` and `lc`.
The names the sandbox's service proxy and `llmfleet simulate` share."""

ROUND_ROBIN = "round-robin"
LEAST_CONNECTIONS = "least-connections"  # fewest open connections (requests, in the simulator)
ROUTINGS = (ROUND_ROBIN, LEAST_CONNECTIONS)
