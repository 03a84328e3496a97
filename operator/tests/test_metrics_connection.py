"""Prometheus connection options: validation that names the flag, credentials read from files
on every request, and nothing that holds a secret's value."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from requests import Request

from llmfleet.cli import BadInput, build_parser
from llmfleet.cli.prometheus import prometheus_connection
from llmfleet.cli.run import operator_settings
from llmfleet.metrics.connection import ConnectionOptionError, PrometheusConnection, parse_header

SECRET = "s3cret-value-7f1c"


@pytest.fixture
def secret_file(tmp_path) -> Path:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    return path


def _authorization(connection: PrometheusConnection) -> str:
    prepared = Request("GET", connection.base_url + "/api/v1/query").prepare()
    return connection.auth()(prepared).headers["Authorization"]


def test_a_bearer_token_and_a_basic_auth_password_are_read_from_their_files_on_every_request(secret_file):
    bearer = PrometheusConnection("https://thanos:9091", bearer_token_file=secret_file)
    assert _authorization(bearer) == f"Bearer {SECRET}"
    secret_file.write_text("rotated")  # a projected token or Secret the kubelet refreshed
    assert _authorization(bearer) == "Bearer rotated"
    basic = PrometheusConnection("https://mimir", basic_auth_username="tenant", basic_auth_password_file=secret_file)
    assert _authorization(basic) == "Basic " + base64.b64encode(b"tenant:rotated").decode()
    assert PrometheusConnection("http://prometheus:9090").auth() is None


def test_the_connection_holds_paths_not_secrets(secret_file):
    connection = PrometheusConnection("https://thanos:9091", bearer_token_file=secret_file)
    assert SECRET not in repr(connection)
    session = connection.session()
    assert SECRET not in repr(session.headers) and "Authorization" not in session.headers


def test_tls_options_and_headers_reach_the_session(tmp_path, secret_file):
    ca, cert, key = (tmp_path / name for name in ("ca.crt", "tls.crt", "tls.key"))
    for path in (ca, cert, key):
        path.write_text("pem")
    connection = PrometheusConnection("https://mimir/prometheus/", ca_file=ca, client_cert_file=cert,
                                      client_key_file=key, headers=(("X-Scope-OrgID", "tenant-1"),))
    connection.validate()
    session = connection.session()
    assert session.verify == str(ca) and session.cert == (str(cert), str(key))
    assert session.headers["X-Scope-OrgID"] == "tenant-1"
    assert connection.base_url == "https://mimir/prometheus"  # a path prefix is kept


@pytest.mark.parametrize("options, flag", [
    (dict(url="prometheus:9090"), "--prometheus-url"),
    (dict(url="ftp://prometheus"), "--prometheus-url"),
    (dict(url="http://prometheus:9090/?x=1"), "--prometheus-url"),
    (dict(url="http://p", basic_auth_username="u"), "--prometheus-basic-auth-password-file"),
    (dict(url="http://p", client_key_file=Path("/k")), "--prometheus-client-cert-file"),
    (dict(url="http://p", server_name="prometheus.monitoring"), "--prometheus-server-name"),
    (dict(url="https://p", ca_file=Path("/nonexistent/ca.crt")), "--prometheus-ca-file"),
    (dict(url="https://p", bearer_token_file=Path("/nonexistent/token")), "--prometheus-bearer-token-file"),
    (dict(url="https://p", headers=(("Authorization", "Bearer x"),)), "--prometheus-header"),
    (dict(url="https://p", headers=(("Bad Name", "x"),)), "--prometheus-header"),
])
def test_an_option_that_cannot_work_is_refused_naming_its_flag(options, flag):
    with pytest.raises(ConnectionOptionError, match=flag):
        PrometheusConnection(**options).validate()


def test_bearer_and_basic_auth_together_are_refused(secret_file):
    with pytest.raises(ConnectionOptionError, match="choose one"):
        PrometheusConnection("https://p", bearer_token_file=secret_file, basic_auth_username="u",
                             basic_auth_password_file=secret_file).validate()


@pytest.mark.parametrize("text, header", [("X-Scope-OrgID=tenant-1", ("X-Scope-OrgID", "tenant-1")),
                                          ("X-Scope-OrgID: a=b", ("X-Scope-OrgID", "a=b")),
                                          ("Token=a:b", ("Token", "a:b"))])
def test_a_header_is_name_equals_value_or_name_colon_value(text, header):
    with pytest.raises(ConnectionOptionError, match="NAME=VALUE"):
        parse_header("X-Scope-OrgID")
    assert parse_header(text) == header


def test_the_command_line_builds_the_connection_and_refuses_a_bad_option(secret_file, monkeypatch):
    monkeypatch.delenv("LLMFLEET_PROMETHEUS_URL", raising=False)
    args = build_parser().parse_args([
        "run", "--prometheus-url", "https://thanos:9091", "--prometheus-bearer-token-file", str(secret_file),
        "--prometheus-header", "X-Scope-OrgID=tenant-1", "--prometheus-scrape-interval-seconds", "30"])
    connection = prometheus_connection(args)
    assert connection.bearer_token_file == secret_file and connection.headers == (("X-Scope-OrgID", "tenant-1"),)
    assert args.prometheus_scrape_interval_seconds == 30.0
    bad = build_parser().parse_args(["run", "--prometheus-url", "http://p", "--prometheus-ca-file", str(secret_file)])
    with pytest.raises(BadInput, match="--prometheus-ca-file needs an https://"):
        prometheus_connection(bad)


@pytest.mark.parametrize("interval, window, refused", [("30", "60", True), ("30", "120", False),
                                                      (None, "60", False), ("15", "60", False)])
def test_an_observation_window_too_short_for_the_configured_interval_is_refused(interval, window, refused, monkeypatch):
    monkeypatch.delenv("LLMFLEET_PROMETHEUS_SCRAPE_INTERVAL_SECONDS", raising=False)
    flags = ["run", "--observation-window-seconds", window]
    if interval is not None:
        flags += ["--prometheus-scrape-interval-seconds", interval]
    args = build_parser().parse_args(flags)
    if refused:
        with pytest.raises(BadInput, match="--observation-window-seconds 60 holds fewer than 4 scrapes at "
                                           "--prometheus-scrape-interval-seconds 30: give at least 120"):
            operator_settings(args)
    else:
        assert operator_settings(args).observation_window_seconds == int(window)


def test_each_option_defaults_to_its_environment_variable(secret_file, monkeypatch):
    monkeypatch.setenv("LLMFLEET_PROMETHEUS_URL", "https://prometheus:9090")
    monkeypatch.setenv("LLMFLEET_PROMETHEUS_CA_FILE", str(secret_file))
    monkeypatch.setenv("LLMFLEET_PROMETHEUS_BASIC_AUTH_USERNAME", "llmfleet")
    monkeypatch.setenv("LLMFLEET_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE", str(secret_file))
    connection = prometheus_connection(build_parser().parse_args(["fleet", "status"]))
    assert (connection.url, connection.ca_file, connection.basic_auth_username) == (
        "https://prometheus:9090", secret_file, "llmfleet")
