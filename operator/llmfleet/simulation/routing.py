"""How a Service spreads load over its ready endpoints: kube-proxy's iptables and nftables modes
pick an endpoint at random for each new connection (the default on Linux), its IPVS mode's `rr`
and `lc` in turn or by fewest connections. The names the sandbox's service proxy and
`llmfleet simulate` share."""

# kube-proxy's default mode on Linux is iptables (k8s.io/kubernetes@v1.36.3:
# cmd/kube-proxy/app/server_linux.go, platformApplyDefaults), whose Service chains pick each new
# connection's endpoint with `-m statistic --mode random` (pkg/proxy/iptables/proxier.go); the
# nftables mode does the same with `numgen random` (pkg/proxy/nftables/proxier.go).
RANDOM = "random"
ROUND_ROBIN = "round-robin"
LEAST_CONNECTIONS = "least-connections"  # fewest open connections (requests, in the simulator)
ROUTINGS = (RANDOM, ROUND_ROBIN, LEAST_CONNECTIONS)
# What a Service does on a cluster nobody tuned.
DEFAULT_ROUTING = RANDOM
