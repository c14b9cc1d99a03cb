"""The handoff's wire format: a sealed stream opens only whole, in order and for the request
it answers; a request verifies only as signed, fresh and once."""

from __future__ import annotations

import json
import os
import re

import pytest

from drivers.agent.handoff import frames
from drivers.agent.handoff.errors import HandoffFailed, HandoffInterrupted
from drivers.agent.handoff.frames import Kind

KEY = bytes(range(32))
SALT = b"s" * frames.SALT_BYTES
NONCE = "ab" * frames.NONCE_BYTES
NOW = 1_800_000_000.0


def stream_key(**changes: str) -> bytes:
    bound = {"checkpoint_id": "c1", "target_node": "node-b", "request_nonce": NONCE} | changes
    return frames.stream_key(KEY, SALT, **bound)


def sealed(*records: tuple[Kind, bytes]) -> list[tuple[bytes, bytes]]:
    sealer = frames.Sealer(stream_key())
    return [sealer.seal(kind, plain) for kind, plain in records]


RECORDS = [(Kind.HEAD, b"{}"), (Kind.DATA, os.urandom(1000)), (Kind.DATA, b"tail"),
           (Kind.FINAL, b"")]


def test_records_open_in_order_with_their_kind_and_bytes() -> None:
    opener = frames.Opener(stream_key())
    assert [opener.open(h, b) for h, b in sealed(*RECORDS)] == RECORDS
    assert opener.ended


def test_a_flipped_ciphertext_bit_fails_authentication_naming_the_record() -> None:
    records = sealed(*RECORDS)
    header, body = records[1]
    tampered = bytearray(body)
    tampered[10] ^= 1
    opener = frames.Opener(stream_key())
    opener.open(*records[0])
    with pytest.raises(HandoffInterrupted, match=r"record 1 \(DATA\) fails authentication"):
        opener.open(header, bytes(tampered))


def test_a_relabelled_record_fails_authentication() -> None:
    """The header is associated data: a DATA record passed off as FINAL does not open."""
    records = sealed(*RECORDS)
    _, body = records[1]
    opener = frames.Opener(stream_key())
    opener.open(*records[0])
    with pytest.raises(HandoffInterrupted, match="fails authentication"):
        opener.open(frames.HEADER.pack(Kind.FINAL, len(body)), body)


@pytest.mark.parametrize(("before", "last"), [([0], 2), ([0, 1], 3)],
                         ids=["record 2 before 1", "record 2 dropped"])
def test_a_reordered_or_dropped_record_fails_authentication(before: list[int],
                                                            last: int) -> None:
    records = sealed(*RECORDS)
    opener = frames.Opener(stream_key())
    for index in before:
        opener.open(*records[index])
    with pytest.raises(HandoffInterrupted, match="fails authentication"):
        opener.open(*records[last])


def test_a_stream_cut_before_its_final_record_has_not_ended() -> None:
    opener = frames.Opener(stream_key())
    for record in sealed(*RECORDS)[:-1]:
        opener.open(*record)
    assert not opener.ended


@pytest.mark.parametrize("other", [{"request_nonce": "cd" * frames.NONCE_BYTES},
                                   {"target_node": "node-c"}, {"checkpoint_id": "c2"}],
                         ids=["another request", "another node", "another checkpoint"])
def test_a_stream_opens_only_for_the_request_it_answers(other: dict[str, str]) -> None:
    opener = frames.Opener(stream_key(**other))
    with pytest.raises(HandoffInterrupted, match=r"record 0 .* fails authentication"):
        opener.open(*sealed(*RECORDS)[0])


def test_the_first_record_must_be_the_head_and_nothing_follows_the_final() -> None:
    records = sealed(*RECORDS)
    with pytest.raises(HandoffInterrupted, match="a stream has one HEAD, first"):
        frames.Opener(stream_key()).open(*sealed((Kind.DATA, b"x"))[0])
    opener = frames.Opener(stream_key())
    for record in records:
        opener.open(*record)
    with pytest.raises(HandoffInterrupted, match="follows the end"):
        opener.open(*records[1])
    sealer = frames.Sealer(stream_key())
    sealer.seal(Kind.ABORT, b"why")
    with pytest.raises(RuntimeError, match="nothing follows"):
        sealer.seal(Kind.DATA, b"more")


@pytest.mark.parametrize("header", [frames.HEADER.pack(9, 100),
                                    frames.HEADER.pack(Kind.DATA, frames.MAX_BODY + 1),
                                    frames.HEADER.pack(Kind.DATA, 3)],
                         ids=["unknown kind", "too long", "shorter than a tag"])
def test_a_corrupt_header_is_refused_before_its_body_is_read(header: bytes) -> None:
    with pytest.raises(HandoffInterrupted, match="corrupt"):
        frames.parse_header(header)


def test_a_body_that_is_not_a_handoff_stream_is_refused_by_its_magic() -> None:
    assert frames.read_prefix(frames.prefix(SALT)) == SALT
    with pytest.raises(HandoffFailed, match="not a handoff/v1 stream"):
        frames.read_prefix(b"HTTP" + SALT)


def test_a_key_shorter_than_32_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 random bytes"):
        frames.request_key(b"short")


def test_head_round_trips_and_unsafe_container_names_are_refused() -> None:
    head = frames.Head("c1", "uid-1", "node-b", (
        frames.Entry("app", 5, "img", "type", {"a": "b"}, "sha256:x"), frames.Entry("db", 0)))
    assert frames.decode_head(frames.encode_head(head)) == head
    for name in ("../etc", ".hidden", "a/b", ""):
        unsafe = frames.Head("c1", "uid-1", "node-b", (frames.Entry(name, 1),))
        with pytest.raises(HandoffFailed, match="cannot take"):
            frames.decode_head(frames.encode_head(unsafe))
    twice = frames.Head("c1", "uid-1", "node-b", (frames.Entry("a", 1), frames.Entry("a", 1)))
    with pytest.raises(HandoffFailed, match="unique"):
        frames.decode_head(frames.encode_head(twice))


def test_the_head_carries_the_dump_format_and_one_without_it_reads_as_unknown() -> None:
    head = frames.Head("c1", "uid-1", "node-b", (frames.Entry("app", 5),), "sim-marker/v1")
    assert frames.decode_head(frames.encode_head(head)).format == "sim-marker/v1"
    older = json.loads(frames.encode_head(head))
    del older["format"]
    assert frames.decode_head(json.dumps(older).encode()).format == ""


# --- requests --------------------------------------------------------------------------------

MAC_KEY = frames.request_key(KEY)
PATH = frames.PATH + "c1"


def signed(**changes: object) -> dict[str, str]:
    fields: dict[str, object] = {"method": "GET", "path": PATH, "node": "node-b",
                                 "timestamp": int(NOW), "nonce": NONCE, "wait": 5.0}
    return frames.sign_request(MAC_KEY, **(fields | changes))  # type: ignore[arg-type]


def verify(headers: dict[str, str], *, method: str = "GET", path: str = PATH,
           now: float = NOW) -> frames.SignedRequest:
    return frames.verify_request(MAC_KEY, method=method, path=path, headers=headers, now=now)


def test_a_signed_request_verifies_with_its_fields() -> None:
    assert verify(signed()) == frames.SignedRequest("node-b", int(NOW), NONCE, 5.0, "")


@pytest.mark.parametrize(("header", "value"), [
    (frames.H_NODE, "node-c"), (frames.H_WAIT, "600.000"), (frames.H_NONCE, "cd" * 16),
    (frames.H_TIME, str(int(NOW) + 1)), (frames.H_TRANSFER, "00")])
def test_a_request_with_a_changed_field_does_not_verify(header: str, value: str) -> None:
    with pytest.raises(frames.NotAuthentic, match="does not verify"):
        verify(signed() | {header: value})


def test_a_request_to_another_path_or_method_or_with_another_key_does_not_verify() -> None:
    with pytest.raises(frames.NotAuthentic, match="does not verify"):
        verify(signed(), path=frames.PATH + "c2")
    with pytest.raises(frames.NotAuthentic, match="does not verify"):
        verify(signed(), method="POST")
    other = frames.sign_request(frames.request_key(b"x" * 32), method="GET", path=PATH,
                                node="node-b", timestamp=int(NOW), nonce=NONCE)
    with pytest.raises(frames.NotAuthentic, match="another handoff key"):
        verify(other)
    with pytest.raises(frames.NotAuthentic, match="no 'HandoffHMAC' Authorization"):
        verify({k: v for k, v in signed().items() if k != "Authorization"})


@pytest.mark.parametrize("skew", [-61, 61])
def test_a_request_more_than_a_minute_off_the_clock_is_refused(skew: int) -> None:
    verify(signed(timestamp=int(NOW) + 60))
    with pytest.raises(frames.NotAuthentic, match=re.escape(f"timestamp is {skew:+d} s")):
        verify(signed(timestamp=int(NOW) + skew))


def test_the_replay_guard_refuses_a_nonce_seen_within_the_window_and_forgets_it_after() -> None:
    guard = frames.ReplayGuard(window=60)
    request = verify(signed())
    guard.admit(request, now=NOW)
    with pytest.raises(frames.NotAuthentic, match="replayed"):
        guard.admit(request, now=NOW + 59)
    guard.admit(request, now=NOW + 61)  # forgotten: verify_request refuses it as stale now


def test_a_full_replay_guard_refuses_rather_than_forgets() -> None:
    guard = frames.ReplayGuard(window=60, capacity=2)
    for n in range(2):
        guard.admit(verify(signed(nonce=f"{n:032x}")), now=NOW)
    with pytest.raises(frames.TooManyNonces):
        guard.admit(verify(signed(nonce=f"{3:032x}")), now=NOW)
