"""The local stack's etcd certificates: no connection to its etcd without the stack's client certificate.

etcd's authentication alone does not keep a stranger on the host out: etcd 3.5
answers `Alarm` without a credential, and while a NOSPACE alarm is raised it
applies `AuthDisable` and user changes unchecked (etcd PR 22386), so three
calls turn authentication off. So `sie up` also makes etcd require a client
certificate (`--client-cert-auth`): a certificate authority made for each run
signs etcd's server certificate (127.0.0.1) and one client certificate that
the stack's services present. The files live in `<state dir>/etcd-tls/`
(mode 0700, keys 0600); the CA's key is never written, so nothing else can be
signed. Who may do what is still each service's etcd user (etcd_credentials.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The run's certificates are made anew at each `sie up`; this only outlasts any run.
VALIDITY = datetime.timedelta(days=3650)


class StackEtcdTls:
    """The CA, server and client certificate files of one run of the stack."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = directory / "ca.pem"
        self.server_cert, self.server_key = directory / "server.pem", directory / "server-key.pem"
        self.client_cert, self.client_key = directory / "client.pem", directory / "client-key.pem"

    def create(self) -> None:
        """Make a CA, etcd's server certificate for 127.0.0.1 and the services' client certificate."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = _name("sie up etcd CA")
        ca = _sign(_builder(ca_name, ca_name, ca_key).add_extension(_basic(ca=True), critical=True), ca_key)
        _write(self.ca, ca.public_bytes(serialization.Encoding.PEM))
        for cert_path, key_path, common_name, usage, names in (
            (self.server_cert, self.server_key, "sie up etcd", ExtendedKeyUsageOID.SERVER_AUTH, True),
            (self.client_cert, self.client_key, "sie up service", ExtendedKeyUsageOID.CLIENT_AUTH, False),
        ):
            key = ec.generate_private_key(ec.SECP256R1())
            builder = _builder(_name(common_name), ca_name, key).add_extension(_basic(ca=False), critical=True)
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            if names:
                address = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
                builder = builder.add_extension(x509.SubjectAlternativeName([address]), critical=False)
            _write(cert_path, _sign(builder, ca_key).public_bytes(serialization.Encoding.PEM))
            private = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            _write(key_path, private)

    def env(self) -> dict[str, str]:
        """What a service needs to reach the stack's etcd (SIE_ETCD_CA_FILE, SIE_ETCD_CERT_FILE, SIE_ETCD_KEY_FILE)."""
        return {
            "SIE_ETCD_CA_FILE": str(self.ca),
            "SIE_ETCD_CERT_FILE": str(self.client_cert),
            "SIE_ETCD_KEY_FILE": str(self.client_key),
        }


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _basic(*, ca: bool) -> x509.BasicConstraints:
    return x509.BasicConstraints(ca=ca, path_length=None)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def _sign(builder: x509.CertificateBuilder, key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    return builder.sign(key, hashes.SHA256())


def _write(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by this user only."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)
