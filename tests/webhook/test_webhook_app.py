"""The webhook's HTTP surface on loopback: it patches what the lookup says, fails open on
any lookup error or timeout, refuses non-reviews with 400, reports counters, and serves a
renewed certificate without a restart."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from controlplane.api.webhook import (
    STATS_KEY,
    Lookup,
    ServingCertificate,
    make_webhook_app,
    running_webhook,
)
from controlplane.cli.webhook import make_certificates
from controlplane.clock import FakeClock
from controlplane.machines.contract.protocol import RESTORE_GATE
from tests.support.admission_reviews import review


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def mutate(self, body: Any) -> tuple[int, Any]:
        async with self.session.post(f"{self.base}/mutate/pods", json=body) as resp:
            return resp.status, (await resp.json() if resp.status == 200 else None)

    async def health(self) -> dict[str, Any]:
        async with self.session.get(f"{self.base}/healthz") as resp:
            assert resp.status == 200
            body: dict[str, Any] = await resp.json()
            return body


async def serve(lookup: Lookup, *, lookup_timeout: float = 1.0) -> AsyncIterator[Client]:
    app = make_webhook_app(lookup, lookup_timeout=lookup_timeout)
    async with running_webhook(app, host="127.0.0.1", port=0, ssl_context=None) as (h, p), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        assert app[STATS_KEY].reviews == 0
        yield Client(session, f"http://{h}:{p}")


@pytest.fixture
async def gating() -> AsyncIterator[Client]:
    async def lookup(namespace: str, name: str) -> str | None:
        return "mig-1" if (namespace, name) == ("prod", "db-0") else None
    async for client in serve(lookup):
        yield client


async def test_an_awaited_pod_is_patched_with_the_gate(gating: Client) -> None:
    status, body = await gating.mutate(review())
    assert status == 200
    patch = json.loads(base64.b64decode(body["response"]["patch"]))
    assert patch[0]["value"] == [{"name": RESTORE_GATE}]
    assert (await gating.health())["gated"] == 1


async def test_a_pod_no_migration_awaits_is_allowed_unchanged(gating: Client) -> None:
    _, body = await gating.mutate(review(name="db-1"))
    assert body["response"] == {"uid": "req-1", "allowed": True}
    health = await gating.health()
    assert (health["reviews"], health["lookups"], health["gated"]) == (1, 1, 0)


async def test_a_pod_without_a_statefulset_owner_is_not_looked_up(gating: Client) -> None:
    _, body = await gating.mutate(review(owners=[]))
    assert body["response"]["allowed"] is True
    assert (await gating.health())["lookups"] == 0


async def test_a_body_that_is_not_a_review_is_a_400(gating: Client) -> None:
    assert (await gating.mutate([1, 2]))[0] == 400
    assert (await gating.mutate({"kind": "AdmissionReview"}))[0] == 400
    async with gating.session.post(f"{gating.base}/mutate/pods", data=b"{nope") as resp:
        assert resp.status == 400


async def test_a_failing_lookup_fails_open_with_a_warning() -> None:
    async def broken(namespace: str, name: str) -> str | None:
        raise ConnectionRefusedError("database down")
    async for client in serve(broken):
        status, body = await client.mutate(review())
        assert status == 200
        assert body["response"]["allowed"] is True
        assert "patch" not in body["response"]
        assert "ConnectionRefusedError" in body["response"]["warnings"][0]
        assert (await client.health())["failed_open"] == 1


async def test_a_lookup_slower_than_its_timeout_fails_open() -> None:
    """The API server waits 2 s at most (deploy/); the lookup is cut well before, so the
    pod is admitted by our answer, not by the API server giving up on us."""
    never = asyncio.Event()

    async def hanging(namespace: str, name: str) -> str | None:
        await never.wait()
        return "mig-1"
    async for client in serve(hanging, lookup_timeout=0.05):
        _, body = await client.mutate(review())
        assert "patch" not in body["response"]
        assert "timed out" in body["response"]["warnings"][0]
        assert (await client.health())["failed_open"] == 1


def _write_pair(folder: Path, common_name: str) -> None:
    _, cert, key = make_certificates([common_name], [ipaddress.ip_address("127.0.0.1")],
                                     now=FakeClock().now())
    (folder / "tls.crt").write_bytes(cert)
    (folder / "tls.key").write_bytes(key)


async def _served_name(host: str, port: int) -> str:
    """The first DNS name of the certificate a new TLS connection is served."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection(host, port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    cert = x509.load_der_x509_certificate(der)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return str(names.get_values_for_type(x509.DNSName)[0])


async def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(
    tmp_path: Path,
) -> None:
    """cert-manager renews the Secret and the kubelet swaps the mounted files: the
    webhook picks them up; an unchanged or half-written pair changes nothing."""
    _write_pair(tmp_path, "old.example.svc")
    certificate = ServingCertificate(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    assert certificate.reload_if_changed() is False

    async def nobody(namespace: str, name: str) -> str | None:
        return None
    app = make_webhook_app(nobody)
    async with running_webhook(app, host="127.0.0.1", port=0,
                               ssl_context=certificate.context) as (host, port):
        assert await _served_name(host, port) == "old.example.svc"
        renewed = tmp_path / "renewed"
        renewed.mkdir()
        _write_pair(renewed, "new.example.svc")
        os.replace(renewed / "tls.crt", tmp_path / "tls.crt")  # the key not yet
        assert certificate.reload_if_changed() is False
        assert await _served_name(host, port) == "old.example.svc"
        os.replace(renewed / "tls.key", tmp_path / "tls.key")
        assert certificate.reload_if_changed() is True
        assert await _served_name(host, port) == "new.example.svc"
