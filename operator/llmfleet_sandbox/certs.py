"""Certificates and kubeconfigs for the sandbox control plane.

One CA signs the apiserver's serving certificate and every client identity;
a separate RSA key pair signs service-account tokens. That is all a
single-machine cluster needs, and the identities match the ones kubeadm uses
so that the default RBAC bindings apply to the controller-manager and scheduler.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class ClientIdentity:
    file_stem: str
    common_name: str
    organization: str | None = None


ADMIN = ClientIdentity("admin", "llmfleet-sandbox-admin", "system:masters")
CONTROLLER_MANAGER = ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = ClientIdentity("scheduler", "system:kube-scheduler")
# The bearer-token proxy in front of Prometheus (llmfleet_sandbox.rbacproxy): a user of no group,
# bound to system:auth-delegator for its token and access reviews, as kube-rbac-proxy's
# ServiceAccount is.
PROMETHEUS_PROXY = ClientIdentity("prometheus-proxy", "llmfleet-sandbox-prometheus-proxy")
# The LeaderWorkerSet controller, bound to its upstream ClusterRoles (`leaderworkerset`).
LWS_CONTROLLER_MANAGER = ClientIdentity("lws-controller-manager", "lws-controller-manager")
CLIENT_IDENTITIES = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, PROMETHEUS_PROXY, LWS_CONTROLLER_MANAGER)


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = []
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _issue(subject, public_key, issuer, issuer_key, *, is_ca, usages, sans=None):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate_pki(pki_dir: Path, serving_ips: list[str], serving_dns: list[str]) -> None:
    """Write ca, apiserver serving, client and service-account keys into pki_dir.

    Existing material is kept so that kubeconfigs handed out earlier stay valid
    across `down`/`up`; a client identity added since gets its certificate from that CA.
    """
    pki_dir.mkdir(parents=True, exist_ok=True)
    if (pki_dir / "ca.crt").exists() and (pki_dir / "sa.key").exists():
        for identity in CLIENT_IDENTITIES:
            issue_client_certificate(pki_dir, identity)
        return
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("llmfleet-sandbox-ca")
    ca_cert = _issue(ca_name, ca_key.public_key(), ca_name, ca_key, is_ca=True, usages=None)
    _write_key(pki_dir / "ca.key", ca_key)
    _write_cert(pki_dir / "ca.crt", ca_cert)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in serving_ips]
    sans += [x509.DNSName(name) for name in serving_dns]
    serving_cert = _issue(
        _name("kube-apiserver"), serving_key.public_key(), ca_name, ca_key,
        is_ca=False, usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans,
    )
    _write_key(pki_dir / "apiserver.key", serving_key)
    _write_cert(pki_dir / "apiserver.crt", serving_cert)

    for identity in CLIENT_IDENTITIES:
        issue_client_certificate(pki_dir, identity)

    # Service-account tokens are signed with RSA, which every consumer accepts.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki_dir / "sa.key", sa_key)
    (pki_dir / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def issue_serving_certificate(pki_dir: Path, stem: Path, common_name: str, ips: list[str],
                              dns_names: list[str]) -> tuple[Path, Path]:
    """A serving certificate from the sandbox's CA (generate_pki first) for another of its
    servers; (certificate, key) written at `stem`.crt and `stem`.key."""
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips] + [x509.DNSName(name) for name in dns_names]
    cert = _issue(_name(common_name), key.public_key(), ca_cert.subject, ca_key, is_ca=False,
                  usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)
    certificate, private_key = stem.with_suffix(".crt"), stem.with_suffix(".key")
    _write_key(private_key, key)
    _write_cert(certificate, cert)
    return certificate, private_key


def issue_client_certificate(pki_dir: Path, identity: ClientIdentity) -> None:
    """A client certificate from the sandbox's CA (generate_pki first) for `identity`, at
    `file_stem`.crt and .key in pki_dir, as write_kubeconfig names them; kept if there."""
    if (pki_dir / f"{identity.file_stem}.crt").exists() and (pki_dir / f"{identity.file_stem}.key").exists():
        return
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(_name(identity.common_name, identity.organization), key.public_key(), ca_cert.subject, ca_key,
                  is_ca=False, usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
    _write_key(pki_dir / f"{identity.file_stem}.key", key)
    _write_cert(pki_dir / f"{identity.file_stem}.crt", cert)


def write_kubeconfig(path: Path, server: str, pki_dir: Path, identity: ClientIdentity) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "llmfleet-sandbox",
            "cluster": {"server": server, "certificate-authority": str(pki_dir / "ca.crt")},
        }],
        "users": [{
            "name": identity.file_stem,
            "user": {
                "client-certificate": str(pki_dir / f"{identity.file_stem}.crt"),
                "client-key": str(pki_dir / f"{identity.file_stem}.key"),
            },
        }],
        "contexts": [{
            "name": "llmfleet-sandbox",
            "context": {"cluster": "llmfleet-sandbox", "user": identity.file_stem},
        }],
        "current-context": "llmfleet-sandbox",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
