"""The sandbox's kube-rbac-proxy: Prometheus behind Kubernetes bearer tokens
(`llmfleet sandbox up --prometheus-auth bearer`).

Clusters often put Prometheus behind kube-rbac-proxy (OpenShift's Thanos querier, the
kube-prometheus components): HTTPS, and a request gets through only with a Kubernetes bearer
token that the apiserver authenticates (TokenReview) and whose identity it authorizes
(SubjectAccessReview). The sandbox would run kube-rbac-proxy itself, but its Go module is not
served by the module proxy the sandbox builds its Go parts from. oauth2-proxy, which is, only
checks a JWT's signature against the issuer's keys: no TokenReview (the token of a deleted
ServiceAccount would still pass) and no SubjectAccessReview (an identity without the permission
would pass, where kube-rbac-proxy answers 403), and a bad token is a 403 there, not a 401. So
this module does what kube-rbac-proxy does, the way it does it:

- TLS, with a serving certificate from the sandbox's CA;
- no `Authorization: Bearer` token, or one the apiserver's TokenReview does not authenticate
  (or cannot review): 401;
- a SubjectAccessReview of the token's user, groups, uid and extra, with kube-rbac-proxy's
  verb for the HTTP method (GET and HEAD get, POST create, PUT update, PATCH patch, DELETE
  delete) on fixed resource attributes, as its `authorization.resourceAttributes` config
  gives them: the `proxy` subresource of Service `--service` in `--namespace` (what
  `kubectl proxy` to that Service needs; the Service need not exist). Denied: 403; a review
  that fails: 500;
- allowed: the request goes on to Prometheus on loopback, without its Authorization header.

The proxy reviews with its own identity (a client certificate bound to system:auth-delegator,
as kube-rbac-proxy's ServiceAccount is), never the admin's. Every request is reviewed afresh:
kube-rbac-proxy may answer from a cache for a while, so a client must not rely on a revoked
permission lingering, and here it does not.

Run as `python -m llmfleet_sandbox.rbacproxy --kubeconfig FILE --listen HOST:PORT --upstream URL
--tls-cert-file FILE --tls-private-key-file FILE --namespace NS --service NAME`.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import ssl
import sys
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from llmfleet_sandbox import certs
from llmfleet_sandbox.config import (
    PROMETHEUS_NAMESPACE,
    PROMETHEUS_READER,
    PROMETHEUS_SERVICE,
    SANDBOX_LABEL,
    SandboxConfig,
)

# kube-rbac-proxy's verbs for HTTP methods; other methods are not served (501).
VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# What a proxy does not pass on (RFC 9110 7.6.1), and the credential Prometheus has no use for.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade"}
NOT_FORWARDED = HOP_BY_HOP | {"authorization", "host", "content-length"}
REVIEW_TIMEOUT_SECONDS = 10
# Prometheus' own query timeout is 2 minutes.
UPSTREAM_TIMEOUT_SECONDS = 130


def access_manifests() -> list[dict]:
    """The RBAC the proxy and its readers need: the proxy's user may review tokens and access
    (system:auth-delegator), and ServiceAccount PROMETHEUS_READER may read Prometheus through it
    (Role PROMETHEUS_READER, which `reader_binding` grants to other ServiceAccounts)."""
    labels = {SANDBOX_LABEL: "true"}
    namespace = PROMETHEUS_NAMESPACE
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": PROMETHEUS_READER, "namespace": namespace, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": PROMETHEUS_READER, "namespace": namespace, "labels": labels},
         # get: GET and HEAD; create: POST, which clients use for long queries.
         "rules": [{"apiGroups": [""], "resources": ["services/proxy"], "resourceNames": [PROMETHEUS_SERVICE],
                    "verbs": ["get", "create"]}]},
        reader_binding(namespace, PROMETHEUS_READER),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": certs.PROMETHEUS_PROXY.common_name, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": certs.PROMETHEUS_PROXY.common_name}]},
    ]


def reader_binding(namespace: str, service_account: str) -> dict:
    """A RoleBinding that lets a ServiceAccount read the sandbox's Prometheus through the proxy."""
    name = PROMETHEUS_READER if (namespace, service_account) == (PROMETHEUS_NAMESPACE, PROMETHEUS_READER) \
        else f"{PROMETHEUS_READER}-{namespace}-{service_account}"
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": PROMETHEUS_NAMESPACE, "labels": {SANDBOX_LABEL: "true"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PROMETHEUS_READER},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]}


def kubeconfig(config: SandboxConfig):
    return config.state_dir / f"{certs.PROMETHEUS_PROXY.file_stem}.kubeconfig"


def argv(config: SandboxConfig, python: str) -> list[str]:
    """The proxy's command line: at `prometheus_url`, in front of Prometheus on loopback. Writes
    its client identity and kubeconfig (kept) and its serving certificate (issued anew)."""
    certs.issue_client_certificate(config.pki_dir, certs.PROMETHEUS_PROXY)
    certs.write_kubeconfig(kubeconfig(config), config.apiserver_url, config.pki_dir, certs.PROMETHEUS_PROXY)
    config.prometheus_proxy_dir.mkdir(parents=True, exist_ok=True)
    certificate, key = certs.issue_serving_certificate(
        config.pki_dir, config.prometheus_proxy_dir / "tls", "prometheus", [config.prometheus_ip],
        [config.prometheus_server_name])
    upstream_host, upstream_port = config.prometheus_listen_address
    return [python, "-m", "llmfleet_sandbox.rbacproxy", "--kubeconfig", str(kubeconfig(config)),
            "--listen", f"{config.prometheus_ip}:{config.ports.prometheus}",
            "--upstream", f"http://{upstream_host}:{upstream_port}",
            "--tls-cert-file", str(certificate), "--tls-private-key-file", str(key),
            "--namespace", PROMETHEUS_NAMESPACE, "--service", PROMETHEUS_SERVICE]


@dataclass(frozen=True)
class Decision:
    """What the proxy answers: 200 lets the request through; `message` is the body otherwise
    (never the token)."""

    status: int
    message: str


def bearer_token(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class Reviewer:
    """TokenReview and SubjectAccessReview against the apiserver, with the proxy's identity."""

    def __init__(self, kubeconfig_file: str, namespace: str, service: str, audiences: list[str]):
        from kubernetes import client, config as kube_config

        api = kube_config.new_client_from_config(config_file=kubeconfig_file)
        self.client = client
        self.authentication = client.AuthenticationV1Api(api)
        self.authorization = client.AuthorizationV1Api(api)
        self.namespace, self.service, self.audiences = namespace, service, audiences

    def decide(self, authorization: str | None, method: str) -> Decision:
        token = bearer_token(authorization)
        if token is None:
            return Decision(401, "Unauthorized")
        client = self.client
        try:
            review = self.authentication.create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=self.audiences or None)),
                _request_timeout=REVIEW_TIMEOUT_SECONDS)
        except Exception as error:  # noqa: BLE001 - as kube-rbac-proxy: a failed review is a 401
            _log(f"token review failed: {type(error).__name__}: {str(error)[:300]}")
            return Decision(401, "Unauthorized")
        if not review.status or not review.status.authenticated:
            return Decision(401, "Unauthorized")
        user = review.status.user
        verb = VERBS[method]
        where = (f"user={user.username}, verb={verb}, namespace={self.namespace}, resource=services, "
                 f"subresource=proxy, name={self.service}")
        attributes = client.V1ResourceAttributes(namespace=self.namespace, verb=verb, group="", version="v1",
                                                 resource="services", subresource="proxy", name=self.service)
        try:
            access = self.authorization.create_subject_access_review(
                client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
                    user=user.username, groups=user.groups, uid=user.uid, extra=user.extra,
                    resource_attributes=attributes)),
                _request_timeout=REVIEW_TIMEOUT_SECONDS)
        except Exception as error:  # noqa: BLE001 - as kube-rbac-proxy: a failed review is a 500
            _log(f"access review failed ({where}): {type(error).__name__}: {str(error)[:300]}")
            return Decision(500, f"Authorization error ({where})")
        if not access.status.allowed:
            _log(f"forbidden ({where})")
            return Decision(403, f"Forbidden ({where})")
        return Decision(200, user.username)


def _log(message: str) -> None:
    print(message, flush=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmfleet-sandbox-rbac-proxy"
    # Seconds a connection may sit idle (and its TLS handshake take).
    timeout = 60
    server: "RbacProxy"

    def setup(self) -> None:
        super().setup()
        # The handshake here, in this connection's thread, not in the accepting one.
        self.connection.do_handshake()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self._reply(411, "Length Required")
            return
        body = self.rfile.read(length) if length else None
        decision = self.server.reviewer.decide(self.headers.get("Authorization"), self.command)
        if decision.status != 200:
            self._reply(decision.status, decision.message)
            return
        self._forward(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def _forward(self, body: bytes | None) -> None:
        upstream = self.server.upstream
        headers = {name: value for name, value in self.headers.items() if name.lower() not in NOT_FORWARDED}
        headers["Host"] = upstream.netloc
        connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=UPSTREAM_TIMEOUT_SECONDS)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            content = response.read()
        except (OSError, http.client.HTTPException) as error:
            _log(f"upstream {upstream.geturl()} failed: {error}")
            self._reply(502, "Bad Gateway")
            return
        finally:
            connection.close()
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(content)

    def _reply(self, status: int, message: str) -> None:
        body = (message + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="kubernetes"')
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass  # denials are logged by the reviewer; every query would fill the log


class RbacProxy(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, listen: tuple[str, int], upstream: str, reviewer: Reviewer, tls: ssl.SSLContext):
        super().__init__(listen, _Handler)
        self.upstream = urlsplit(upstream)
        self.reviewer = reviewer
        self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, (ssl.SSLError, ConnectionError, socket.timeout)):
            super().handle_error(request, client_address)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True, help="the proxy's own identity, for its reviews")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--upstream", required=True, metavar="URL", help="Prometheus, e.g. http://127.0.0.1:19092")
    parser.add_argument("--tls-cert-file", required=True)
    parser.add_argument("--tls-private-key-file", required=True)
    parser.add_argument("--namespace", required=True, help="the Service's namespace in the access review")
    parser.add_argument("--service", required=True, help="the Service whose proxy subresource a reader may get")
    parser.add_argument("--audience", action="append", default=[],
                        help="an audience the token must be for (default: the apiserver's)")
    args = parser.parse_args(argv)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.load_cert_chain(args.tls_cert_file, args.tls_private_key_file)
    reviewer = Reviewer(args.kubeconfig, args.namespace, args.service, args.audience)
    server = RbacProxy(_address(args.listen), args.upstream, reviewer, tls)
    _log(f"serving https://{args.listen}, reviewing tokens for services/proxy {args.namespace}/{args.service}, "
         f"forwarding to {args.upstream}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
