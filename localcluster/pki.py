"""Certificates and keys for the local control plane (what kwokctl and envtest generate)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

SERVER_NAMES = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]
SERVER_IPS = ["127.0.0.1", "::1", "10.0.0.1"]


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(
    subject: x509.Name,
    key: rsa.RSAPrivateKey,
    issuer: x509.Name,
    issuer_key: rsa.RSAPrivateKey,
    *,
    ca: bool,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def generate(directory: Path, extra_ips: list[str] | None = None) -> None:
    """Writes ca.crt/key, apiserver.crt/key (serving; SERVER_IPS and `extra_ips` in its SANs), admin.crt/key
    (system:masters) and sa.key/pub."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _key(), _name("servlane-local-ca")
    _write_key(ca_key, directory / "ca.key")
    _write_cert(_sign(ca_name, ca_key, ca_name, ca_key, ca=True), directory / "ca.crt")

    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVER_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in [*SERVER_IPS, *(extra_ips or [])]]
    server_key = _key()
    _write_key(server_key, directory / "apiserver.key")
    server = _sign(_name("kube-apiserver"), server_key, ca_name, ca_key, ca=False, sans=sans)
    _write_cert(server, directory / "apiserver.crt")

    admin_key = _key()
    _write_key(admin_key, directory / "admin.key")
    admin = _sign(_name("servlane-admin", "system:masters"), admin_key, ca_name, ca_key, ca=False, sans=sans)
    _write_cert(admin, directory / "admin.crt")

    sa_key = _key()
    _write_key(sa_key, directory / "sa.key")
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
