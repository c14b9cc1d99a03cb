"""Authentication against a real registry: htpasswd (basic) and token (bearer) auth.

Pins: the client answers the registry's challenge (``Basic`` with the configured
credentials; ``Bearer`` by fetching a token for the challenged scope from the realm),
reuses what it learned (no challenge round trip per request, tokens cached per scope),
and reports wrong or missing credentials as ``RegistryUnauthorized`` and a token without
the needed scope as ``RegistryForbidden`` — which the GC action turns into a terminal
failure.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controlplane.engine.observation import Interests, ProbeError, TagView
from controlplane.machines.contract.actions import delete_manifest
from controlplane.worker.errors import TerminalActionError
from drivers.registry import (
    Credentials,
    ManifestActions,
    RegistryClient,
    RegistryObserver,
    RegistrySettings,
)
from drivers.registry.errors import RegistryForbidden, RegistryUnauthorized
from drivers.registry.port import OCI_MANIFEST, Descriptor
from tests.registry.servers import RunningRegistry, TokenServer, bcrypt_htpasswd, run_registry


def client_for(host: str, creds: Credentials | None) -> RegistryClient:
    return RegistryClient(RegistrySettings(
        credentials={host: creds} if creds else {}, backoff_initial=0.01, request_timeout=10))


async def push_small(client: RegistryClient, repo: str, tag: str) -> str:
    config = await client.push_blob(repo, b"{}",
                                    media_type="application/vnd.oci.image.config.v1+json")
    body = (b'{"schemaVersion":2,"mediaType":"%s","config":%s,"layers":[],'
            b'"annotations":{"who":"me"}}' % (OCI_MANIFEST.encode(), _json(config)))
    return await client.push_manifest(repo, body, media_type=OCI_MANIFEST, tag=tag)


def _json(d: Descriptor) -> bytes:
    return json.dumps(d.to_json()).encode()


@pytest.fixture
async def basic_registry(tmp_path: Path) -> AsyncIterator[RunningRegistry]:
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(bcrypt_htpasswd("alice", "s3cret"))
    async with run_registry(tmp_path / "reg", auth={
            "htpasswd": {"realm": "test", "path": str(htpasswd)}}) as server:
        yield server


async def test_basic_auth_answers_the_challenge_once_then_presents_credentials(
        basic_registry: RunningRegistry) -> None:
    host = basic_registry.host
    client = client_for(host, Credentials("alice", "s3cret"))
    try:
        repo = f"{host}/team/app"
        digest = await push_small(client, repo, "v1")
        before = sum(client.transport.sent.values())
        resolved = await client.resolve(repo, "v1")
        assert resolved is not None
        assert resolved.digest == digest
        assert resolved.annotations == {"who": "me"}
        # HEAD + GET by digest, with credentials up front: no 401 round trip any more.
        assert sum(client.transport.sent.values()) - before == 2
    finally:
        await client.close()


@pytest.mark.parametrize("creds", [None, Credentials("alice", "wrong")],
                         ids=["anonymous", "wrong-password"])
async def test_basic_auth_without_valid_credentials_is_unauthorized(
        basic_registry: RunningRegistry, creds: Credentials | None) -> None:
    client = client_for(basic_registry.host, creds)
    try:
        with pytest.raises(RegistryUnauthorized) as caught:
            await client.resolve(f"{basic_registry.host}/team/app", "v1")
        assert caught.value.status == 401
        assert not caught.value.retryable
        seen = await RegistryObserver(client).observe(
            Interests(tags=frozenset({f"{basic_registry.host}/team/app:v1"})))
        fact = seen.tags[f"{basic_registry.host}/team/app:v1"]
        assert isinstance(fact, ProbeError)  # never "absent"
        assert fact.error_class == "Unauthorized"
    finally:
        await client.close()


@pytest.fixture
async def token_registry(tmp_path: Path) -> AsyncIterator[tuple[RunningRegistry, TokenServer]]:
    def no_deletes(user: str, type_: str, name: str, asked: list[str]) -> list[str]:
        return [a for a in asked if a in ("pull", "push")] if user == "bob" else asked

    async with TokenServer(tmp_path / "token", users={"alice": "pw", "bob": "pw"},
                           policy=no_deletes) as tokens, \
            run_registry(tmp_path / "reg", auth=tokens.registry_auth()) as server:
        yield server, tokens


async def test_bearer_auth_fetches_a_token_per_scope_and_reuses_it(
        token_registry: tuple[RunningRegistry, TokenServer]) -> None:
    server, tokens = token_registry
    client = client_for(server.host, Credentials("alice", "pw"))
    try:
        repo = f"{server.host}/team/app"
        digest = await push_small(client, repo, "v1")
        for _ in range(3):
            resolved = await client.resolve(repo, "v1")
            assert resolved is not None
            assert resolved.digest == digest
        seen = await RegistryObserver(client).observe(Interests(tags=frozenset({
            f"{repo}:v1"})))
        assert isinstance(seen.tags[f"{repo}:v1"], TagView)
        # One token per scope (pull, then push for the upload): cached, not per request.
        assert [scope for _, scope in tokens.issued] == [
            "repository:team/app:pull", "repository:team/app:pull,push"]
        await ManifestActions(client).handlers()["DeleteManifest"](
            delete_manifest("k", repository=repo, digest=digest))
        assert tokens.issued[-1] == ("alice", "repository:team/app:delete")
        assert await client.resolve(repo, digest) is None
    finally:
        await client.close()


async def test_bearer_token_without_the_delete_scope_is_forbidden_and_terminal(
        token_registry: tuple[RunningRegistry, TokenServer]) -> None:
    server, _ = token_registry
    client = client_for(server.host, Credentials("bob", "pw"))
    try:
        repo = f"{server.host}/team/app"
        digest = await push_small(client, repo, "v1")
        with pytest.raises(RegistryForbidden):
            await client.delete_manifest(repo, digest)
        with pytest.raises(TerminalActionError) as caught:
            await ManifestActions(client).handlers()["DeleteManifest"](
                delete_manifest("k", repository=repo, digest=digest))
        assert caught.value.error_class == "Forbidden"
        assert await client.resolve(repo, digest) is not None
    finally:
        await client.close()


async def test_token_endpoint_refusing_the_credentials_is_unauthorized(
        token_registry: tuple[RunningRegistry, TokenServer]) -> None:
    server, tokens = token_registry
    client = client_for(server.host, Credentials("alice", "nope"))
    try:
        with pytest.raises(RegistryUnauthorized, match="token endpoint"):
            await client.resolve(f"{server.host}/team/app", "v1")
        assert tokens.refused == 1
    finally:
        await client.close()
