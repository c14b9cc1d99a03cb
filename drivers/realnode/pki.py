"""The certificates between the API server and real kubelets, from a CA of the world's own.

:func:`make_pki` writes, once per world, into one folder:

- ``ca.crt``/``ca.key``: the CA. The kubelets trust it for client certificates
  (``authentication.x509.clientCAFile``), the API server for the kubelets' serving
  certificates (``--kubelet-certificate-authority``), a test for both;
- ``kubelet-<node>.crt``/``.key``: each kubelet's serving certificate, for the node's
  name (the API server dials it by its Hostname address), 127.0.0.1 and localhost;
- ``apiserver-kubelet-client.crt``/``.key``: the API server's client certificate towards
  the kubelets (``--kubelet-client-certificate``), in ``system:masters``.

Keys are EC P-256 (fast to make; kubelets and the API server accept them). Called by
:mod:`.world` before the API server starts (its flags name these files).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=7)


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    def serving(self, node: str) -> tuple[Path, Path]:
        return self.folder / f"kubelet-{node}.crt", self.folder / f"kubelet-{node}.key"

    @property
    def apiserver_client(self) -> tuple[Path, Path]:
        return (self.folder / "apiserver-kubelet-client.crt",
                self.folder / "apiserver-kubelet-client.key")


def _name(common: str, org: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(parts)


def _write(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, crt: Path,
           key_path: Path) -> None:
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)


def _issue(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, subject: x509.Name, *,
           now: datetime.datetime, usage: x509.ObjectIdentifier,
           names: Iterable[str] = ()) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + VALID_FOR)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(folder: Path, nodes: Iterable[str], *, now: datetime.datetime) -> Pki:
    """The CA and every certificate above, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(folder)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    subject = _name("controlplane-realnode-ca")
    ca = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + VALID_FOR)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(ca, ca_key, pki.ca_cert, pki.ca_key)
    for node in nodes:
        cert, key = _issue(ca, ca_key, _name(f"system:node:{node}", "system:nodes"), now=now,
                           usage=ExtendedKeyUsageOID.SERVER_AUTH,
                           names=(node, "localhost", "127.0.0.1"))
        _write(cert, key, *pki.serving(node))
    cert, key = _issue(ca, ca_key, _name("kube-apiserver-kubelet-client", "system:masters"),
                       now=now, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    _write(cert, key, *pki.apiserver_client)
    return pki
