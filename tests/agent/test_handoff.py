"""A checkpoint handoff over real loopback sockets: the target gets the archives whole and
private, or a ``HandoffFailed`` naming why and no file at all; only the node an offer names,
holding the shared key, with a fresh request, ever gets a byte."""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from drivers.agent.handoff import (
    HandoffFailed,
    HandoffInterrupted,
    HandoffRefused,
    HandoffServer,
    Received,
    fetch_checkpoint,
    frames,
)
from drivers.registry.checkpoints import Archive
from tests.support.waiting import eventually

KEY = bytes(range(32))
TARGET = "node-b"


@pytest.fixture
async def server() -> AsyncIterator[HandoffServer]:
    async with HandoffServer(KEY, "127.0.0.1", default_wait=5.0) as running:
        yield running


def archive(tmp_path: Path, container: str, data: bytes) -> Archive:
    path = tmp_path / "source" / f"{container}.tar"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return Archive(container, path, f"registry.local/{container}:1")


def sparse(tmp_path: Path, mib: int) -> Archive:
    """A large archive that costs no disk: a hole reads as zeros."""
    path = tmp_path / "source" / "big.tar"
    path.parent.mkdir(exist_ok=True)
    with path.open("wb") as out:
        out.truncate(mib << 20)
    return Archive("big", path)


async def fetch(server: HandoffServer, dest: Path, *, key: bytes = KEY, node: str = TARGET,
                checkpoint_id: str = "c1", within: float = 10.0,
                wait: float | None = None) -> Received:
    return await fetch_checkpoint(server.address, checkpoint_id, key=key, target_node=node,
                                  dest=dest, timeout=within, wait=wait)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_fetch_brings_the_archives_byte_identical_private_and_with_their_digests(
        server: HandoffServer, tmp_path: Path) -> None:
    """Two archives (one spanning several records, the last one partial) arrive as the
    source holds them, in a 0700 directory as 0600 files; the offer learns of it."""
    big, small = os.urandom(3 * frames.CHUNK + 12345), os.urandom(1000)
    archives = [archive(tmp_path, "app", big), archive(tmp_path, "sidecar", small)]
    offer = server.offer("c1", archives, source_uid="uid-source", target_node=TARGET)

    received = await fetch(server, tmp_path / "dest")

    assert received.source_uid == "uid-source"
    assert [(a.container, a.size, a.image) for a in received.archives] == [
        ("app", len(big), "registry.local/app:1"), ("sidecar", len(small),
                                                    "registry.local/sidecar:1")]
    assert received.paths["app"].read_bytes() == big
    assert received.paths["sidecar"].read_bytes() == small
    digests = [f"sha256:{hashlib.sha256(data).hexdigest()}" for data in (big, small)]
    assert [a.digest for a in received.archives] == digests
    assert mode(tmp_path / "dest") == 0o700
    assert [mode(path) for path in received.paths.values()] == [0o600, 0o600]
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["app.tar", "sidecar.tar"]
    assert received.acknowledged
    delivery = await offer.delivered()
    assert (delivery.target_node, delivery.size, delivery.digests) == (
        TARGET, len(big) + len(small), tuple(digests))


async def test_an_empty_archive_arrives_empty(server: HandoffServer, tmp_path: Path) -> None:
    server.offer("c1", [archive(tmp_path, "empty", b""), archive(tmp_path, "one", b"1")],
                 source_uid="u", target_node=TARGET)
    received = await fetch(server, tmp_path / "dest")
    assert [(a.size, a.path.read_bytes()) for a in received.archives] == [(0, b""), (1, b"1")]
    assert received.archives[0].digest == f"sha256:{hashlib.sha256(b'').hexdigest()}"


async def test_a_fetch_before_the_offer_waits_for_it_then_streams(
        server: HandoffServer, tmp_path: Path) -> None:
    fetching = asyncio.create_task(fetch(server, tmp_path / "dest"))
    await eventually(lambda: server.waiting("c1") == 1, what="the fetch held for the offer")
    assert not fetching.done()
    server.offer("c1", [archive(tmp_path, "app", b"dumped")], source_uid="u",
                 target_node=TARGET)
    received = await fetching
    assert received.paths["app"].read_bytes() == b"dumped"
    assert server.waiting("c1") == 0


async def test_withdrawing_fails_the_waiting_fetch_with_the_reason_and_leaves_nothing(
        server: HandoffServer, tmp_path: Path) -> None:
    fetching = asyncio.create_task(fetch(server, tmp_path / "dest"))
    await eventually(lambda: server.waiting("c1") == 1, what="the fetch held for the offer")
    server.withdraw("c1", "DumpFailed: criu exited 1")
    with pytest.raises(HandoffRefused, match=r"withdrawn .*DumpFailed: criu exited 1") as failed:
        await fetching
    assert failed.value.status == 410
    assert not failed.value.retryable
    assert not (tmp_path / "dest").exists()
    with pytest.raises(HandoffRefused, match="DumpFailed: criu exited 1"):  # and later ones
        await fetch(server, tmp_path / "dest")


async def test_withdrawing_mid_stream_fails_the_fetch_with_the_reason_and_leaves_nothing(
        server: HandoffServer, tmp_path: Path) -> None:
    """The source ends the stream with an authenticated ABORT carrying its reason: the
    target is told why, not just that the stream broke."""
    offer = server.offer("c1", [sparse(tmp_path, 128)], source_uid="u", target_node=TARGET)

    def withdraw_once_bytes_arrive(arrived: int, total: int) -> None:
        if offer.withdrawn is None:
            server.withdraw("c1", "the migration was cancelled")

    with pytest.raises(HandoffRefused, match="stopped streaming checkpoint c1: the source "
                       "agent withdrew it: the migration was cancelled"):
        await fetch_checkpoint(server.address, "c1", key=KEY, target_node=TARGET,
                               dest=tmp_path / "dest", timeout=30,
                               progress=withdraw_once_bytes_arrive)
    assert not (tmp_path / "dest").exists()


async def test_withdrawing_an_offer_fails_its_delivered_wait(
        server: HandoffServer, tmp_path: Path) -> None:
    offer = server.offer("c1", [archive(tmp_path, "app", b"x")], source_uid="u",
                         target_node=TARGET)
    server.withdraw("c1", "the migration was cancelled")
    with pytest.raises(HandoffRefused, match="withdrawn before node-b had it: the migration"):
        await offer.delivered()


async def test_a_checkpoint_not_offered_within_the_wait_is_refused(
        server: HandoffServer, tmp_path: Path) -> None:
    with pytest.raises(HandoffRefused, match="c1 was not offered on this node within 0 s:"):
        await fetch(server, tmp_path / "dest", wait=0)
    assert not (tmp_path / "dest").exists()


async def test_a_fetch_with_another_key_fails_naming_authentication(
        server: HandoffServer, tmp_path: Path) -> None:
    server.offer("c1", [archive(tmp_path, "app", b"secret memory")], source_uid="u",
                 target_node=TARGET)
    with pytest.raises(HandoffRefused, match=r"authentication failed.*another handoff key"
                       ) as failed:
        await fetch(server, tmp_path / "dest", key=b"k" * 32)
    assert failed.value.status == 401
    assert "--handoff-key" in failed.value.reason
    assert not (tmp_path / "dest").exists()


async def test_a_node_the_checkpoint_is_not_offered_to_is_refused(
        server: HandoffServer, tmp_path: Path) -> None:
    server.offer("c1", [archive(tmp_path, "app", b"x")], source_uid="u", target_node=TARGET)
    with pytest.raises(HandoffRefused, match="offered to node node-b, not to node-c") as failed:
        await fetch(server, tmp_path / "dest", node="node-c")
    assert failed.value.status == 403
    assert (await fetch(server, tmp_path / "dest")).paths["app"].read_bytes() == b"x"


async def test_a_replayed_or_stale_request_is_refused(server: HandoffServer) -> None:
    """The same signed request twice: the second is refused, even though its signature
    verifies; so is one signed two minutes ago."""
    path = frames.PATH + "c1"

    def headers(timestamp: float) -> dict[str, str]:
        return frames.sign_request(frames.request_key(KEY), method="GET", path=path,
                                   node=TARGET, timestamp=int(timestamp),
                                   nonce=os.urandom(16).hex(), wait=0)

    once = headers(time.time())
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{server.address}{path}", headers=once) as first:
            assert first.status == 404  # authentic; nothing offered
        async with session.get(f"http://{server.address}{path}", headers=once) as again:
            assert (again.status, await again.text()) == (
                401, "authentication failed: the request's nonce was seen already: a replayed "
                "request (each request needs a fresh nonce)")
        async with session.get(f"http://{server.address}{path}",
                               headers=headers(time.time() - 120)) as stale:
            assert stale.status == 401
            assert "clocks disagree" in await stale.text()


async def test_a_second_concurrent_fetch_is_refused_and_a_retry_after_a_broken_one_succeeds(
        server: HandoffServer, tmp_path: Path) -> None:
    """A fetch holding the offer (its reader stalls, so the source is mid-stream) makes a
    second one fail with 409; once the first breaks off, the offer is free again."""
    offer = server.offer("c1", [sparse(tmp_path, 64)], source_uid="u", target_node=TARGET)
    path = frames.PATH + "c1"
    first_headers = frames.sign_request(frames.request_key(KEY), method="GET", path=path,
                                        node=TARGET, timestamp=int(time.time()),
                                        nonce=os.urandom(16).hex())
    async with aiohttp.ClientSession() as session:
        first = await session.get(f"http://{server.address}{path}", headers=first_headers)
        try:
            assert first.status == 200
            assert offer.streaming
            with pytest.raises(HandoffInterrupted, match="streaming to node-b already"
                               ) as failed:
                await fetch(server, tmp_path / "second")
            assert (failed.value.status, failed.value.retryable) == (409, True)
            assert not (tmp_path / "second").exists()
        finally:
            first.close()  # breaks the first stream off mid-way
    await eventually(lambda: not offer.streaming, what="the source to see the first fetch end")
    assert not offer.is_delivered
    received = await fetch(server, tmp_path / "retry", within=60)
    assert received.archives[0].size == 64 << 20
    assert received.archives[0].digest == \
        f"sha256:{hashlib.sha256(bytes(64 << 20)).hexdigest()}"
    assert offer.is_delivered


async def test_an_unreachable_source_fails_naming_it(tmp_path: Path) -> None:
    async with HandoffServer(KEY) as gone:
        address = gone.address
    with pytest.raises(HandoffInterrupted, match=f"connecting to the source agent at {address}"
                       ) as failed:
        await fetch_checkpoint(address, "c1", key=KEY, target_node=TARGET,
                               dest=tmp_path / "dest", timeout=5)
    assert failed.value.retryable
    assert not (tmp_path / "dest").exists()


async def test_a_fetch_that_runs_out_of_time_names_what_it_was_waiting_for_and_lets_go(
        server: HandoffServer, tmp_path: Path) -> None:
    """The asker hung up, so the source stops holding its request: the offer that comes
    later is not claimed by it, and the next fetch streams."""
    with pytest.raises(HandoffInterrupted, match=r"timed out after 0\.2 s, while waiting for the "
                       r"source agent .* to offer checkpoint c1"):
        await fetch(server, tmp_path / "dest", within=0.2, wait=30)
    assert not (tmp_path / "dest").exists()
    await eventually(lambda: server.waiting("c1") == 0, limit_seconds=10,  # it held for 30
                     what="the source to let go of the request")
    server.offer("c1", [archive(tmp_path, "app", b"x")], source_uid="u", target_node=TARGET)
    assert (await fetch(server, tmp_path / "dest")).paths["app"].read_bytes() == b"x"


async def test_a_destination_that_is_not_empty_is_refused_and_left_alone(
        server: HandoffServer, tmp_path: Path) -> None:
    server.offer("c1", [archive(tmp_path, "app", b"x")], source_uid="u", target_node=TARGET)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "earlier").write_text("kept")
    with pytest.raises(HandoffFailed, match="not an empty directory") as failed:
        await fetch(server, dest)
    assert type(failed.value) is HandoffFailed  # neither refused by the source nor retryable
    assert [p.name for p in dest.iterdir()] == ["earlier"]


async def test_a_source_that_stops_answers_its_held_requests_at_once(tmp_path: Path) -> None:
    """Not at its shutdown timeout: the held request is told why, and nothing is left."""
    async with HandoffServer(KEY, shutdown_timeout=30) as stopping:
        fetching = asyncio.create_task(fetch(stopping, tmp_path / "dest"))
        await eventually(lambda: stopping.waiting("c1") == 1, what="the fetch held")
    with pytest.raises(HandoffRefused, match="handoff server stopped"):
        await asyncio.wait_for(fetching, 10)
    assert not (tmp_path / "dest").exists()


async def test_an_offer_whose_archive_is_gone_is_refused_naming_it(
        server: HandoffServer, tmp_path: Path) -> None:
    gone = archive(tmp_path, "app", b"x")
    gone.path.unlink()
    server.offer("c1", [gone], source_uid="u", target_node=TARGET)
    with pytest.raises(HandoffRefused, match="cannot read checkpoint c1's archives") as failed:
        await fetch(server, tmp_path / "dest")
    assert failed.value.status == 500
    assert not (tmp_path / "dest").exists()
