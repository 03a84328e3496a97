"""Each pod's /etc/resolv.conf and /etc/hosts, as the kubelet writes them.

resolv.conf follows the pod's dnsPolicy: ClusterFirst (the default) names the cluster's DNS
(`clusterdns`, the kubelet's --cluster-dns) and searches the pod's namespace, `svc` and the
cluster domain before the host's own search domains, with ndots:5; Default is the host's file;
None takes only the pod's dnsConfig, which the other policies merge in too. The hosts file maps
localhost and the pod's own hostname (and, with a subdomain, its fully qualified name) to its
IP, then the pod's hostAliases.
"""

from __future__ import annotations

from pathlib import Path

from llmfleet_sandbox.config import CLUSTER_DOMAIN

HOST_RESOLV_CONF = Path("/etc/resolv.conf")
CLUSTER_FIRST_OPTIONS = {"ndots": "5"}
# The kubelet's limits (validation.MaxDNSSearchPaths and its search line length).
MAX_SEARCH_PATHS = 32
MAX_SEARCH_LINE = 2048


def _parse_resolv_conf(text: str) -> tuple[list[str], list[str], dict[str, str | None]]:
    nameservers: list[str] = []
    searches: list[str] = []
    options: dict[str, str | None] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if fields[0] == "nameserver" and len(fields) > 1:
            nameservers.append(fields[1])
        elif fields[0] in ("search", "domain"):
            searches = fields[1:]
        elif fields[0] == "options":
            for option in fields[1:]:
                name, _, value = option.partition(":")
                options[name] = value or None
    return nameservers, searches, options


def resolv_conf(pod: dict, cluster_dns: str, host_resolv_conf: str) -> str | None:
    """The pod's resolv.conf; None: the host's own file (dnsPolicy Default, no dnsConfig)."""
    spec = pod["spec"]
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    dns_config = spec.get("dnsConfig") or {}
    host_nameservers, host_searches, host_options = _parse_resolv_conf(host_resolv_conf)
    if policy == "Default" and not dns_config:
        return None
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet"):
        namespace = pod["metadata"]["namespace"]
        nameservers = [cluster_dns]
        searches = [f"{namespace}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN, *host_searches]
        options: dict[str, str | None] = dict(CLUSTER_FIRST_OPTIONS)
    elif policy == "Default":
        nameservers, searches, options = host_nameservers, host_searches, dict(host_options)
    else:  # None
        nameservers, searches, options = [], [], {}
    nameservers = nameservers + [server for server in dns_config.get("nameservers") or [] if server not in nameservers]
    searches = list(dict.fromkeys(searches + list(dns_config.get("searches") or [])))
    for option in dns_config.get("options") or []:
        options[option["name"]] = option.get("value")
    while searches and (len(searches) > MAX_SEARCH_PATHS or len(" ".join(searches)) > MAX_SEARCH_LINE):
        searches.pop()
    lines = [f"nameserver {server}" for server in nameservers]
    if searches:
        lines.append("search " + " ".join(searches))
    if options:
        lines.append("options " + " ".join(name if value is None else f"{name}:{value}"
                                           for name, value in options.items()))
    return "\n".join(lines) + "\n"


def pod_hostname(pod: dict) -> str:
    """The pod's hostname: spec.hostname, else its name (at most 63 characters, as the kubelet
    cuts it)."""
    return (pod["spec"].get("hostname") or pod["metadata"]["name"])[:63].rstrip("-.")


def hosts_file(pod: dict, pod_ip: str) -> str:
    hostname = pod_hostname(pod)
    subdomain = pod["spec"].get("subdomain")
    lines = ["# Kubernetes-managed hosts file.",
             "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback",
             "fe00::0\tip6-localnet",
             "fe00::0\tip6-mcastprefix",
             "fe00::1\tip6-allnodes",
             "fe00::2\tip6-allrouters"]
    if subdomain:
        namespace = pod["metadata"]["namespace"]
        lines.append(f"{pod_ip}\t{hostname}.{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}\t{hostname}")
    else:
        lines.append(f"{pod_ip}\t{hostname}")
    aliases = pod["spec"].get("hostAliases") or []
    if aliases:
        lines.append("")
        lines.append("# Entries added by HostAliases.")
        lines += [f"{alias['ip']}\t" + "\t".join(alias.get("hostnames") or []) for alias in aliases]
    return "\n".join(lines) + "\n"
