"""Who asked: every event a person causes records the requester, and ``cpctl serve``
guards its tokens on the wire (named tokens, HTTPS, loopback-only plain HTTP).

Real subprocesses as operators run them; history is read back through ``cpctl history
-o json`` (its ``worker_id`` is the "by" column of the table).
"""

from __future__ import annotations

import getpass
import ipaddress
import json
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controlplane.cli.webhook import make_certificates
from tests.support.cpctl import ROOT, assert_one_line_error, cpctl, reap, upgraded

pytestmark = pytest.mark.slow  # real subprocesses (or a browser): its file starts first

ME = f"{getpass.getuser()}@{socket.gethostname()}"
GATED = '{"steps": 1, "gate_pod": "ns/p", "gate_pod_uid": "uid-9"}'


@pytest.fixture
def ready_db(db_url: str) -> str:
    return upgraded(db_url)


def _by(db: str, machine_id: str) -> list[tuple[str, str]]:
    out = cpctl(db, "history", machine_id, "-o", "json")
    assert out.returncode == 0, out.stderr
    return [(e["type"], e["worker_id"]) for e in json.loads(out.stdout)]


def test_the_cli_records_the_os_user_and_host_on_submit_wake_and_cancel(ready_db: str) -> None:
    assert cpctl(ready_db, "submit", "steps", "--spec", GATED, "--id", "g1").returncode == 0
    assert cpctl(ready_db, "wake", "--id", "g1").stdout.strip() == "woke 1 machine(s)"
    assert cpctl(ready_db, "wake", "--key", "uid-9").stdout.strip() == "woke 1 machine(s)"
    assert cpctl(ready_db, "cancel", "g1").returncode == 0
    assert _by(ready_db, "g1") == [("Submitted", ME), ("WakeRequested", ME),
                                   ("WakeRequested", ME), ("Cancelled", ME)]
    table = cpctl(ready_db, "history", "g1", "--wide").stdout
    assert ME in table
    verify = cpctl(ready_db, "replay", "--verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = cpctl(ready_db, "report", "operations", "--by", "requester", "-o", "json")
    assert [(r["requester"], r["count"]) for r in json.loads(report.stdout)] == [(ME, 1)]


def test_the_kubeconfigs_user_is_recorded_when_the_cli_acts_through_one(
        tmp_path: Path) -> None:
    from controlplane.app.requester import cli_requester

    config = {"apiVersion": "v1", "kind": "Config", "current-context": "prod",
              "contexts": [{"name": "prod", "context": {"cluster": "c", "user": "alice-sre"}},
                           {"name": "lab", "context": {"cluster": "c", "user": "bob"}}],
              "users": [{"name": "alice-sre", "user": {}}, {"name": "bob", "user": {}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    assert cli_requester(str(path)) == f"{ME} kube:alice-sre"
    assert cli_requester(str(path), "lab") == f"{ME} kube:bob"
    assert cli_requester(None) == ME
    assert len(cli_requester(None).encode()) <= 128 * 4


def test_serve_refuses_a_non_loopback_address_without_tls(ready_db: str,
                                                           tmp_path: Path) -> None:
    (tmp_path / "token").write_text("x" * 32)
    refused = cpctl(ready_db, "serve", "--listen", "0.0.0.0:0", "--token-file",
                    str(tmp_path / "token"))
    assert_one_line_error(refused, 2, "--listen 0.0.0.0", "--tls-cert", "--insecure")
    half = cpctl(ready_db, "serve", "--listen", "127.0.0.1:0", "--token-file",
                 str(tmp_path / "token"), "--tls-cert", str(tmp_path / "token"))
    assert_one_line_error(half, 2, "--tls-cert and --tls-key go together")


def test_a_token_file_with_a_malformed_line_names_the_line(ready_db: str,
                                                           tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(f"ci-bot: {'a' * 20}\nno separator here\n")
    assert_one_line_error(cpctl(ready_db, "serve", "--token-file", str(tmp_path / "tokens")),
                          2, "line 2", "NAME: TOKEN")


def _serving(db: str, use: Callable[[str], None], *args: str) -> tuple[str, str]:
    """Run ``cpctl serve ARGS``, call ``use`` with the URL it prints, stop it with SIGTERM
    (it must exit 0); its stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli.main", "--db", db, "serve", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        use(proc.stdout.readline().split(" on ")[1].strip().rstrip("/"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        out, err = reap(proc)
    return out, err


def _call(url: str, token: str, context: ssl.SSLContext, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST"
                                     else None, headers={"Authorization": f"Bearer {token}",
                                                         "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        return json.loads(response.read())


def test_https_with_named_tokens_records_the_tokens_name_never_the_token(
        ready_db: str, tmp_path: Path) -> None:
    ca, cert, key = make_certificates(["localhost"], [ipaddress.ip_address("127.0.0.1")],
                                      now=datetime.now(UTC))
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    bot, ops = "b" * 24 + "-ci", "o" * 24 + "-ops"
    (tmp_path / "tokens").write_text(f"# one per client\nci-bot: {bot}\n\nops-team: {ops}\n")
    assert cpctl(ready_db, "submit", "steps", "--spec", GATED, "--id", "g2").returncode == 0
    trusting = ssl.create_default_context(cadata=ca.decode())

    def use(url: str) -> None:
        assert url.startswith("https://127.0.0.1:")
        listed = _call(f"{url}/api/v1/operations", ops, trusting)
        assert any(op["id"] == "g2" for op in listed["operations"])
        _call(f"{url}/api/v1/operations/g2/cancel", bot, trusting, "POST")

    out, err = _serving(ready_db, use, "--listen", "127.0.0.1:0", "--token-file",
                        str(tmp_path / "tokens"), "--tls-cert", str(tmp_path / "tls.crt"),
                        "--tls-key", str(tmp_path / "tls.key"))
    assert _by(ready_db, "g2")[-1] == ("Cancelled", "token:ci-bot")
    assert bot not in out + err
    assert ops not in out + err


def test_insecure_serves_plain_http_off_loopback_and_one_token_is_named_default(
        ready_db: str, tmp_path: Path) -> None:
    token = "t" * 20 + "-single"
    (tmp_path / "token").write_text(token + "\n")
    assert cpctl(ready_db, "submit", "steps", "--spec", GATED, "--id", "g3").returncode == 0
    def use(url: str) -> None:
        # Listening on every address, serve prints one a browser can open (loopback).
        assert url.startswith("http://127.0.0.1:")
        port = url.rpartition(":")[2]
        _call(f"http://127.0.0.1:{port}/api/v1/operations/g3/cancel", token,
              ssl.create_default_context(), "POST")

    out, err = _serving(ready_db, use, "--listen", "0.0.0.0:0", "--insecure",
                        "--token-file", str(tmp_path / "token"))
    assert _by(ready_db, "g3")[-1] == ("Cancelled", "token:default")
    assert token not in out + err
