"""A throw-away certificate authority for TLS tests: a CA, a server certificate for 127.0.0.1 and
localhost, and client certificates, written as PEM files (nothing is committed)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path

    def pair(self) -> tuple[bytes, bytes]:
        """(certificate chain, private key) as PEM bytes."""
        return self.cert.read_bytes(), self.key.read_bytes()


@dataclass(frozen=True)
class Pki:
    ca: CertFiles
    server: CertFiles
    client: CertFiles
    # A client certificate signed by another CA: a server requiring client certs must refuse it.
    stranger: CertFiles


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertFiles:
    files = CertFiles(directory / f"{stem}.pem", directory / f"{stem}-key.pem")
    files.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool, usage=None, names=()
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _authority(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    return _certificate(common_name, key, _name(common_name), key, ca=True), key


def _leaf(subject: str, authority: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], usage, names=()) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert, ca_key = authority
    return _certificate(subject, key, ca_cert.subject, ca_key, ca=False, usage=usage, names=names), key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    authority = _authority("sie test CA")
    server_names = (x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    return Pki(
        ca=_write(directory, "ca", *authority),
        server=_write(directory, "server", *_leaf("sie server", authority, ExtendedKeyUsageOID.SERVER_AUTH, server_names)),
        client=_write(directory, "client", *_leaf("sie gateway", authority, ExtendedKeyUsageOID.CLIENT_AUTH)),
        stranger=_write(directory, "stranger", *_leaf("stranger", _authority("another CA"), ExtendedKeyUsageOID.CLIENT_AUTH)),
    )
