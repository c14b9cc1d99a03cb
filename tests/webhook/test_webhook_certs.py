"""``cpctl webhook certs``: a CA and a serving certificate that a TLS client trusting
only that CA accepts for the Service's names and each --ip, and the caBundle printed."""

from __future__ import annotations

import base64
import ipaddress
import ssl
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from cryptography import x509

from controlplane.cli.main import main

LONG = "s" * 63  # the longest DNS label: the names exceed a common name's 64 characters


@pytest.fixture(autouse=True)
def _logs_restored() -> Iterator[None]:
    """main() points the logs at this test's captured stderr, closed after it: put the
    configuration back, or later tests' loggers write to a closed file (and raise)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _certs(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["webhook", "certs", "--out", str(tmp_path), *args]) == 0
    return capsys.readouterr().out.strip()


def test_the_serving_certificate_names_the_service_and_each_ip_and_chains_to_the_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _certs(tmp_path, capsys, "--service", LONG, "--namespace", "checkpoint-system",
                    "--ip", "127.0.0.1", "--ip", "::1")
    assert base64.b64decode(bundle) == (tmp_path / "ca.crt").read_bytes()
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        f"{LONG}.checkpoint-system.svc", f"{LONG}.checkpoint-system.svc.cluster.local"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")  # a matching key
    assert stat.S_IMODE((tmp_path / "tls.key").stat().st_mode) == 0o600


@pytest.mark.parametrize(("flag", "value"), [
    ("--service", "Web_Hook"), ("--namespace", "ns-"), ("--ip", "localhost")])
def test_a_bad_name_or_address_is_refused_with_exit_2_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    args = {"--service": "wh", "--namespace": "ns", flag: value}
    out = tmp_path / "out"
    assert main(["webhook", "certs", "--out", str(out),
                 *[x for kv in args.items() for x in kv]]) == 2
    assert flag in capsys.readouterr().err
    assert not out.exists()
