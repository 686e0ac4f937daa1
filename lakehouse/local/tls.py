"""The local MariaDB's TLS: a CA and a server certificate generated on the first `up`, so the CDC
user can be required to use TLS and the jobs verify the server, as they do against RDS."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

VALIDITY = timedelta(days=825)
RENEW_BEFORE = timedelta(days=30)


@dataclass(frozen=True)
class ServerTls:
    ca: Path
    certificate: Path
    key: Path


def ensure_server_tls(directory: Path, host: str, now: datetime | None = None) -> ServerTls:
    """The CA and server certificate for `host` in `directory`; made (again) when missing, for
    another host, or expiring within 30 days."""
    files = ServerTls(directory / "ca.pem", directory / "server-cert.pem", directory / "server-key.pem")
    now = now or datetime.now(UTC)
    if not _usable(files, host, now):
        _generate(files, host, now)
    return files


def _usable(files: ServerTls, host: str, now: datetime) -> bool:
    from cryptography import x509

    if not all(path.exists() for path in (files.ca, files.certificate, files.key)):
        return False
    certificate = x509.load_pem_x509_certificate(files.certificate.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    covered = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    covered += names.get_values_for_type(x509.DNSName)
    return host in covered and certificate.not_valid_after_utc - RENEW_BEFORE > now


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _generate(files: ServerTls, host: str, now: datetime) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = name("lakehouse local MariaDB CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans = {host, "127.0.0.1", "localhost"}
    server = (
        x509.CertificateBuilder()
        .subject_name(name(host))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in sorted(sans)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    files.ca.parent.mkdir(parents=True, exist_ok=True)
    files.key.touch(mode=0o600, exist_ok=True)
    files.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
    )
    files.certificate.write_bytes(server.public_bytes(pem))
    files.ca.write_bytes(ca.public_bytes(pem))
