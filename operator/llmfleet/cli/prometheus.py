"""The --prometheus-* options of the commands that query Prometheus (`run`, `fleet status`)."""

from __future__ import annotations

import os
from pathlib import Path

from llmfleet.cli.inputs import BadInput


def prometheus_default(option: str) -> str | None:
    """Each --prometheus-OPTION defaults to $LLMFLEET_PROMETHEUS_OPTION (`sandbox env` sets them)."""
    return os.environ.get("LLMFLEET_PROMETHEUS_" + option.upper().replace("-", "_"))


def add_prometheus_arguments(parser, purpose: str) -> None:
    group = parser.add_argument_group(
        "Prometheus", "How to reach Prometheus; each option defaults to $LLMFLEET_PROMETHEUS_<OPTION> "
                      "(e.g. $LLMFLEET_PROMETHEUS_CA_FILE). Secrets are read from files on every request, "
                      "so a rotated Secret or projected token is used without a restart.")
    group.add_argument("--prometheus-url", default=prometheus_default("url"), metavar="URL",
                       help=f"Prometheus' base URL, a path prefix included (e.g. https://thanos:9091 or "
                            f"https://proxy/prometheus), {purpose}")
    group.add_argument("--prometheus-bearer-token-file", type=Path, default=prometheus_default("bearer-token-file"),
                       metavar="FILE", help="send the file's content as a bearer token (e.g. the projected "
                                            "service-account token /var/run/secrets/kubernetes.io/serviceaccount/token)")
    group.add_argument("--prometheus-basic-auth-username", default=prometheus_default("basic-auth-username"),
                       metavar="NAME", help="basic auth user name (with --prometheus-basic-auth-password-file)")
    group.add_argument("--prometheus-basic-auth-password-file", type=Path,
                       default=prometheus_default("basic-auth-password-file"), metavar="FILE",
                       help="the file holding the basic auth password")
    group.add_argument("--prometheus-ca-file", type=Path, default=prometheus_default("ca-file"), metavar="FILE",
                       help="PEM bundle of the CAs that sign Prometheus' certificate (default: the system's)")
    group.add_argument("--prometheus-server-name", default=prometheus_default("server-name"), metavar="NAME",
                       help="the name Prometheus' certificate must carry, when the URL's host is not it")
    group.add_argument("--prometheus-client-cert-file", type=Path, default=prometheus_default("client-cert-file"),
                       metavar="FILE", help="PEM client certificate for mutual TLS (with --prometheus-client-key-file)")
    group.add_argument("--prometheus-client-key-file", type=Path, default=prometheus_default("client-key-file"),
                       metavar="FILE", help="PEM key of the client certificate")
    group.add_argument("--prometheus-header", action="append", default=None, metavar="NAME=VALUE",
                       help="an extra header on every query, e.g. X-Scope-OrgID=tenant-1 for Mimir or Cortex; "
                            "repeat for more (default: $LLMFLEET_PROMETHEUS_HEADER, one NAME=VALUE)")


def prometheus_connection(args):
    """The validated connection, or None without a URL; a wrong option is BadInput naming it."""
    from llmfleet.metrics.connection import ConnectionOptionError, PrometheusConnection, parse_header

    if not args.prometheus_url:
        return None
    headers = args.prometheus_header or ([prometheus_default("header")] if prometheus_default("header") else [])
    try:
        connection = PrometheusConnection(
            url=args.prometheus_url, bearer_token_file=args.prometheus_bearer_token_file,
            basic_auth_username=args.prometheus_basic_auth_username,
            basic_auth_password_file=args.prometheus_basic_auth_password_file, ca_file=args.prometheus_ca_file,
            server_name=args.prometheus_server_name, client_cert_file=args.prometheus_client_cert_file,
            client_key_file=args.prometheus_client_key_file,
            headers=tuple(parse_header(text) for text in headers))
        connection.validate()
    except ConnectionOptionError as error:
        raise BadInput(str(error)) from error
    return connection
