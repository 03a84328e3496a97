"""How the operator reaches a Prometheus that is more than an open URL: a bearer token (a
projected service-account token, as OpenShift's Thanos querier wants), basic auth, a CA bundle
and server name, a client certificate, extra headers (Mimir's and Cortex's `X-Scope-OrgID`), a
path prefix in the URL.

Secrets are named by file, never by value: a Secret mounted as a volume or a projected token,
re-read on every request so that a rotated credential is used without a restart. Nothing here
holds a secret's value longer than one request, so nothing can log one.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from requests import PreparedRequest, Session
from requests.adapters import HTTPAdapter
from requests.auth import AuthBase
from urllib3.util.retry import Retry

# RFC 9110 field names (tokens).
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# Set through the options that read their secret from a file, never as a plain header.
_RESERVED_HEADERS = {"authorization"}


class ConnectionOptionError(ValueError):
    """A Prometheus connection option that cannot work; the message names the option and the fix."""


@dataclass(frozen=True)
class PrometheusConnection:
    url: str
    bearer_token_file: Path | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: Path | None = None
    ca_file: Path | None = None
    server_name: str | None = None
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_seconds: float = 5.0

    def validate(self) -> None:
        """Raise ConnectionOptionError naming the first option (by its flag) that cannot work."""
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectionOptionError(f"--prometheus-url: {self.url!r} is not an http:// or https:// URL "
                                        "with a host (a path prefix after the host is kept)")
        if parts.query or parts.fragment:
            raise ConnectionOptionError(f"--prometheus-url: {self.url!r} has a query or fragment; give the base "
                                        "URL the API paths are appended to")
        if self.bearer_token_file and (self.basic_auth_username or self.basic_auth_password_file):
            raise ConnectionOptionError("--prometheus-bearer-token-file and --prometheus-basic-auth-*: both set "
                                        "the Authorization header; choose one")
        if bool(self.basic_auth_username) != bool(self.basic_auth_password_file):
            raise ConnectionOptionError("--prometheus-basic-auth-username and --prometheus-basic-auth-password-file "
                                        "go together; set both or neither")
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise ConnectionOptionError("--prometheus-client-cert-file and --prometheus-client-key-file go "
                                        "together; set both or neither")
        tls_options = [flag for flag, value in (("--prometheus-ca-file", self.ca_file),
                                                ("--prometheus-server-name", self.server_name),
                                                ("--prometheus-client-cert-file", self.client_cert_file))
                       if value]
        if tls_options and parts.scheme != "https":
            raise ConnectionOptionError(f"{tls_options[0]} needs an https:// --prometheus-url, got {self.url!r}")
        for flag, path in (("--prometheus-bearer-token-file", self.bearer_token_file),
                           ("--prometheus-basic-auth-password-file", self.basic_auth_password_file),
                           ("--prometheus-ca-file", self.ca_file),
                           ("--prometheus-client-cert-file", self.client_cert_file),
                           ("--prometheus-client-key-file", self.client_key_file)):
            if path is not None and not path.is_file():
                raise ConnectionOptionError(f"{flag}: {path} is not a readable file (mount the Secret or "
                                            "ConfigMap that holds it, or fix the path)")
        for name, _ in self.headers:
            if not _HEADER_NAME.match(name):
                raise ConnectionOptionError(f"--prometheus-header: {name!r} is not an HTTP header name")
            if name.lower() in _RESERVED_HEADERS:
                raise ConnectionOptionError(f"--prometheus-header: {name} is set by --prometheus-bearer-token-file "
                                            "or --prometheus-basic-auth-*, which read the secret from a file")

    @property
    def base_url(self) -> str:
        """The URL the API paths are appended to: a path prefix kept, a trailing slash dropped."""
        return self.url.rstrip("/")

    def session(self) -> Session:
        """A requests session that speaks to this Prometheus: TLS settings and the client
        certificate on the session, credentials added to each request as it is sent."""
        session = Session()
        session.verify = str(self.ca_file) if self.ca_file else True
        if self.client_cert_file:
            session.cert = (str(self.client_cert_file), str(self.client_key_file))
        session.headers.update(dict(self.headers))
        return session

    def adapter(self) -> HTTPAdapter:
        """The transport for the URL: no retries (the next reconcile pass is the retry) and, with
        a server name, TLS verified against that name instead of the URL's host."""
        if self.server_name:
            return _ServerNameAdapter(self.server_name, max_retries=Retry(total=False))
        return HTTPAdapter(max_retries=Retry(total=False))

    def auth(self) -> AuthBase | None:
        if self.bearer_token_file:
            return _FileAuth(lambda: f"Bearer {_read_secret(self.bearer_token_file)}")
        if self.basic_auth_username:
            return _FileAuth(lambda: _basic(self.basic_auth_username, _read_secret(self.basic_auth_password_file)))
        return None


def _read_secret(path: Path) -> str:
    # A Secret's value written by hand often ends in a newline no server expects.
    return path.read_text().strip()


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


class _FileAuth(AuthBase):
    """Sets Authorization from a file read as each request is sent."""

    def __init__(self, header_value):
        self._header_value = header_value

    def __call__(self, request: PreparedRequest) -> PreparedRequest:
        request.headers["Authorization"] = self._header_value()
        return request


class _ServerNameAdapter(HTTPAdapter):
    """Sends `server_name` as SNI and checks the certificate against it: a Prometheus reached by
    an address its certificate does not name (a Service IP, a port-forward)."""

    def __init__(self, server_name: str, **kwargs):
        self._server_name = server_name
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        kwargs.update(server_hostname=self._server_name, assert_hostname=self._server_name)
        super().init_poolmanager(*args, **kwargs)


def parse_header(text: str) -> tuple[str, str]:
    """NAME=VALUE (or NAME: VALUE) from the command line; the first separator ends the name."""
    separators = [index for index in (text.find("="), text.find(":")) if index > 0]
    if not separators or not text[:min(separators)].strip():
        raise ConnectionOptionError(f"--prometheus-header: {text!r} is not NAME=VALUE, e.g. X-Scope-OrgID=tenant-1")
    end = min(separators)
    return text[:end].strip(), text[end + 1:].strip()
