"""``cpctl webhook serve`` (the restore-gate admission webhook, ``controlplane.api.webhook``)
and ``cpctl webhook certs`` (a CA and serving certificate for it, without cert-manager).

Registered in the parser by ``cli.main`` through :func:`add_webhook_parser`; aiohttp and
cryptography are imported only when these verbs run.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from controlplane.cli.context import clock
from controlplane.errors import ControlPlaneError, UsageError

SERVE_HELP = """\
Serve the mutating admission webhook that holds a StatefulSet's successor pod: a pod
created by a StatefulSet while a migration of a pod of the same namespace/name is in
flight (spec successor: gated) gets the checkpoint.controlplane.dev/restore scheduling
gate; the migration restores into it and removes the gate. Every other pod is allowed
unchanged. The database lookup is cut at 1 s and any failure admits the pod ungated
(fail open, logged, and said in a warning). Serves POST /mutate/pods and GET /healthz over
TLS until SIGTERM or SIGINT. See docs/webhook.md."""

SERVE_EPILOG = """\
examples:
  cpctl webhook serve --db postgresql://cp@db:5432/cp --cert /tls/tls.crt --key /tls/tls.key
  cpctl --db sqlite:///var/controlplane.db webhook serve --cert tls.crt --key tls.key \\
      --host 127.0.0.1 --port 9443
"""

CERTS_HELP = """\
Write a new CA (ca.crt) and a serving certificate signed by it (tls.crt, tls.key) for
the webhook's Service: subject alternative names SERVICE.NAMESPACE.svc,
SERVICE.NAMESPACE.svc.cluster.local and each --ip. Prints the CA as one base64 line: the
caBundle of the MutatingWebhookConfiguration. The CA's key is not kept, so nothing else
can be signed with it; run again to rotate. For clusters without cert-manager (dev,
tests); production uses cert-manager (docs/install.md)."""

CERTS_EPILOG = """\
examples:
  cpctl webhook certs --out var/webhook-tls --service controlplane-webhook \\
      --namespace checkpoint-system
  kubectl -n checkpoint-system create secret tls controlplane-webhook-tls \\
      --cert var/webhook-tls/tls.crt --key var/webhook-tls/tls.key
  cpctl webhook certs --out /tmp/tls --service wh --namespace default --ip 127.0.0.1
"""

#: How long the certificates are valid (a dev cluster's; production rotates with
#: cert-manager).
VALID_DAYS = 365


def add_webhook_parser(verbs: argparse._SubParsersAction[Any],
                       parser_class: type[argparse.ArgumentParser]) -> None:
    """``cpctl webhook serve|certs``: their flags and help."""
    wh = verbs.add_parser("webhook", help="serve the admission webhook that holds a "
                          "StatefulSet's successor pod for its migration, or make its "
                          "certificates")
    sub = wh.add_subparsers(dest="webhook_verb", required=True, parser_class=parser_class,
                            metavar="VERB")
    s = sub.add_parser("serve", help="serve the webhook over TLS until SIGTERM",
                       description=SERVE_HELP, epilog=SERVE_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    # SUPPRESS: when absent here, cpctl's own --db (and its default) stands.
    s.add_argument("--db", default=argparse.SUPPRESS, metavar="URL",
                   help="the control plane's database, where in-flight migrations are "
                   "looked up (default: cpctl's --db, $CONTROLPLANE_DATABASE_URL, else "
                   "sqlite:///var/controlplane.db)")
    s.add_argument("--cert", required=True, metavar="FILE",
                   help="PEM serving certificate (tls.crt of cert-manager's Secret or of "
                   "`cpctl webhook certs`)")
    s.add_argument("--key", required=True, metavar="FILE",
                   help="PEM private key of --cert (tls.key)")
    s.add_argument("--host", default="0.0.0.0",
                   help="address to listen on (default 0.0.0.0: every interface, as in a pod)")
    s.add_argument("--port", type=_port, default=8443,
                   help="port to listen on (default 8443; the Service maps 443 to it; "
                   "0: any free port, printed on stdout)")
    s.set_defaults(handler=serve_cmd)

    c = sub.add_parser("certs", help="write a CA and a serving certificate for the "
                       "webhook; print the caBundle", description=CERTS_HELP,
                       epilog=CERTS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--out", required=True, metavar="DIR",
                   help="directory to write ca.crt, tls.crt and tls.key into (created; "
                   "existing files are replaced; tls.key is mode 0600)")
    c.add_argument("--service", required=True, metavar="NAME",
                   help="the webhook's Service name (first label of the DNS names)")
    c.add_argument("--namespace", required=True, metavar="NS",
                   help="the Service's namespace")
    c.add_argument("--ip", action="append", default=[], metavar="ADDRESS",
                   help="an IP address to put in the certificate too (repeat for several), "
                   "e.g. 127.0.0.1 for a webhook the API server reaches by URL")
    c.set_defaults(handler=certs_cmd)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return int(text)


async def serve_cmd(args: argparse.Namespace) -> int:
    from controlplane.api.webhook import serve_webhook
    from controlplane.store import migrate
    from controlplane.store.database import open_database

    _require_files(("--cert", args.cert), ("--key", args.key))
    db = open_database(args.db)
    try:
        try:
            await migrate.require_current(db)
        except (ControlPlaneError, OSError) as exc:  # serve anyway: lookups fail open
            print(f"cpctl webhook serve: warning: {exc}; pods are admitted ungated until "
                  "the database is ready", file=sys.stderr, flush=True)
        await serve_webhook(db, host=args.host, port=args.port, cert_file=args.cert,
                            key_file=args.key)
    finally:
        await db.dispose()
    return 0


def _require_files(*flags: tuple[str, str]) -> None:
    for flag, path in flags:
        if not os.path.isfile(path):
            raise UsageError(f"{flag} {path!r} is not a file",
                             hint="make them with `cpctl webhook certs`, or mount "
                             "cert-manager's Secret")


async def certs_cmd(args: argparse.Namespace) -> int:
    dns = _service_names(args.service, args.namespace)
    try:
        ips = [ipaddress.ip_address(ip) for ip in args.ip]
    except ValueError as exc:
        raise UsageError(f"--ip: {exc}") from None
    ca_pem, cert_pem, key_pem = make_certificates(dns, ips, now=clock.now())
    written = _write(Path(args.out), {"ca.crt": ca_pem, "tls.crt": cert_pem},
                     secret=("tls.key", key_pem))
    print(f"wrote {', '.join(written)} for {', '.join(dns + args.ip)}", file=sys.stderr)
    print(base64.b64encode(ca_pem).decode())
    return 0


def _write(out: Path, public: dict[str, bytes], *, secret: tuple[str, bytes]) -> list[str]:
    """Write the files into ``out``; the secret one is created mode 0600 (never readable
    by others, not even for a moment)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in public.items():
            (out / name).write_bytes(data)
        key = out / secret[0]
        key.unlink(missing_ok=True)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret[1])
    except OSError as exc:
        raise UsageError(f"cannot write into --out {str(out)!r}: {exc.strerror}") from None
    return [str(out / name) for name in (*public, secret[0])]


def _service_names(service: str, namespace: str) -> list[str]:
    for flag, label in (("--service", service), ("--namespace", namespace)):
        if not label or len(label) > 63 or not all(
                ch.isdigit() or "a" <= ch <= "z" or ch == "-" for ch in label) \
                or label[0] == "-" or label[-1] == "-":
            raise UsageError(f"{flag} {label!r} is not a DNS label",
                             hint="lower-case letters, digits and '-', at most 63")
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def make_certificates(dns_names: list[str], ips: list[ipaddress.IPv4Address |
                                                      ipaddress.IPv6Address], *,
                      now: datetime) -> tuple[bytes, bytes, bytes]:
    """``(ca.crt, tls.crt, tls.key)`` as PEM: a fresh P-256 CA, and a serving certificate
    it signs for ``dns_names`` and ``ips``, both valid from a minute before ``now``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    not_before = now - timedelta(minutes=1)  # a node's clock a little behind still trusts it
    not_after = now + timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "controlplane webhook CA")])
    # A common name holds 64 characters at most; the names that count are the SANs.
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]
                        if len(dns_names[0]) <= 64 else [])
    ca = (x509.CertificateBuilder()
          .subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(not_before).not_valid_after(not_after)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(
              digital_signature=True, key_cert_sign=True, crl_sign=True,
              content_commitment=False, key_encipherment=False, data_encipherment=False,
              key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    cert = (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
