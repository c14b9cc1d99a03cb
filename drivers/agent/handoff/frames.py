"""The handoff's wire format, pure: request signatures, stream keys, sealed records.

No I/O here; time, nonces and salts come in as arguments. Used by
:mod:`~drivers.agent.handoff.server` and :mod:`~drivers.agent.handoff.client`.

**Request** ``GET /handoff/v1/checkpoints/<id>`` (and ``POST .../delivered``, the
acknowledgement) carries ``X-Handoff-Node`` (the asking node), ``-Time`` (Unix seconds),
``-Nonce`` (16 random bytes, hex), ``-Wait`` (seconds the source may hold the request for
an offer), ``-Transfer`` (the acknowledged stream's salt) and ``Authorization: HandoffHMAC
<hex>``: HMAC-SHA256 over those fields, the method and the path, keyed by
HKDF(shared key, info ``handoff/v1 request``).

**Response body**: ``HOF1`` + a 32-byte random salt, then records ``kind (1 byte) |
length (4 bytes, big-endian) | AES-256-GCM ciphertext + 16-byte tag``. The key is
HKDF-SHA256(shared key, salt, info = checkpoint, asking node and the request's nonce), so a
stream opens only for the request it answers; record *n* has the nonce *n* (96 bits) and
its 5-byte header as associated data, so a record altered, dropped, reordered or
relabelled fails its tag. Records: one ``HEAD`` (JSON: the archives and their sizes),
``DATA`` (at most :data:`CHUNK` plain bytes, the archives in order), then ``FINAL`` (the
SHA-256 of each archive's bytes) or ``ABORT`` (the source's reason). A stream that ends
without either was truncated.
"""

from __future__ import annotations

import heapq
import hmac
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from hashlib import sha256
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from drivers.agent.handoff.errors import HandoffFailed, HandoffInterrupted

VERSION = "handoff/v1"
PATH = "/handoff/v1/checkpoints/"
MEDIA_TYPE = "application/vnd.controlplane.handoff.v1"
MAGIC = b"HOF1"
SALT_BYTES = 32
NONCE_BYTES = 16  # of a request's nonce
CHUNK = 1 << 20  # plain bytes in a DATA record, at most
TAG_BYTES = 16
HEADER = struct.Struct(">BI")
MAX_BODY = CHUNK + TAG_BYTES
DIGEST_BYTES = 32
MIN_KEY_BYTES = 32
WINDOW = 60.0  # seconds a request's timestamp may differ from the server's clock
# Checkpoint ids, node and container names: also path segments and file names.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
HEX = re.compile(r"[0-9a-f]+")

H_NODE, H_TIME, H_NONCE = "X-Handoff-Node", "X-Handoff-Time", "X-Handoff-Nonce"
H_WAIT, H_TRANSFER, SCHEME = "X-Handoff-Wait", "X-Handoff-Transfer", "HandoffHMAC"


class Kind(IntEnum):
    HEAD = 1
    DATA = 2
    FINAL = 3
    ABORT = 4


ENDS = (Kind.FINAL, Kind.ABORT)


def check_name(value: str, *, what: str) -> str:
    if not NAME.fullmatch(value):
        raise ValueError(f"{what} {value[:80]!r} is not a name the handoff carries (letters, "
                         "digits, '.', '_', '-'; at most 253)")
    return value


# --- keys --------------------------------------------------------------------------------


def _hkdf(shared: bytes, *, salt: bytes | None, info: bytes) -> bytes:
    if len(shared) < MIN_KEY_BYTES:
        raise ValueError(f"the handoff key is {len(shared)} bytes; it must be at least "
                         f"{MIN_KEY_BYTES} random bytes (head -c 32 /dev/urandom)")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(shared)


def request_key(shared: bytes) -> bytes:
    """The key of request signatures (never the stream's)."""
    return _hkdf(shared, salt=None, info=f"{VERSION} request".encode())


def stream_key(shared: bytes, salt: bytes, *, checkpoint_id: str, target_node: str,
               request_nonce: str) -> bytes:
    """The AES-256-GCM key of one response, bound to the request it answers."""
    info = "\0".join((f"{VERSION} stream", checkpoint_id, target_node, request_nonce))
    return _hkdf(shared, salt=salt, info=info.encode())


# --- requests ----------------------------------------------------------------------------


class NotAuthentic(Exception):
    """A request answered 401; the message says which check failed."""


class TooManyNonces(Exception):
    """The replay guard is full: answered 503 (never by forgetting a nonce early)."""


@dataclass(frozen=True)
class SignedRequest:
    node: str
    timestamp: int
    nonce: str
    wait: float | None  # None: the server's default
    transfer: str  # the acknowledged stream's salt (hex), or empty


def _signature(mac_key: bytes, method: str, path: str, fields: Sequence[str]) -> str:
    text = "\n".join((VERSION, method, path, *fields))
    return hmac.new(mac_key, text.encode(), sha256).hexdigest()


def sign_request(mac_key: bytes, *, method: str, path: str, node: str, timestamp: int,
                 nonce: str, wait: float | None = None, transfer: str = "") -> dict[str, str]:
    """The headers that authenticate one request."""
    check_name(node, what="the node")
    if "\n" in path or not HEX.fullmatch(nonce) or (transfer and not HEX.fullmatch(transfer)):
        raise ValueError("a handoff request's path has no newline; nonce and transfer are hex")
    wait_text = "" if wait is None else f"{max(wait, 0.0):.3f}"
    fields = (node, str(timestamp), nonce, wait_text, transfer)
    headers = {H_NODE: node, H_TIME: str(timestamp), H_NONCE: nonce,
               "Authorization": f"{SCHEME} {_signature(mac_key, method, path, fields)}"}
    if wait_text:
        headers[H_WAIT] = wait_text
    if transfer:
        headers[H_TRANSFER] = transfer
    return headers


def verify_request(mac_key: bytes, *, method: str, path: str, headers: Mapping[str, str],
                   now: float, window: float = WINDOW) -> SignedRequest:
    """The request's signed fields; ``NotAuthentic`` naming the check that failed.
    (Replays are the caller's :class:`ReplayGuard`'s to refuse.)"""
    scheme, _, given = headers.get("Authorization", "").partition(" ")
    if scheme != SCHEME or not given:
        raise NotAuthentic(f"the request carries no '{SCHEME}' Authorization header")
    fields = tuple(headers.get(name, "") for name in (H_NODE, H_TIME, H_NONCE, H_WAIT,
                                                      H_TRANSFER))
    expected = _signature(mac_key, method, path, fields)
    if not hmac.compare_digest(expected.encode(), given.strip().encode("utf-8", "replace")):
        raise NotAuthentic("the request's signature does not verify: the asking agent holds "
                           "another handoff key than this one")
    node, time_text, nonce, wait_text, transfer = fields
    # Signed by a key holder from here on; still malformed fields are refused.
    try:
        timestamp = int(time_text)
        wait = float(wait_text) if wait_text else None
    except ValueError as exc:
        raise NotAuthentic(f"a signed header is malformed: {exc}") from exc
    if not NAME.fullmatch(node) or len(nonce) != 2 * NONCE_BYTES or not HEX.fullmatch(nonce) \
            or (wait is not None and not wait >= 0) or (transfer and not HEX.fullmatch(transfer)):
        raise NotAuthentic("a signed header is malformed (node, nonce, wait or transfer)")
    skew = timestamp - now
    if abs(skew) > window:
        raise NotAuthentic(f"the request's timestamp is {skew:+.0f} s from this node's clock "
                           f"(at most ±{window:.0f} s): the nodes' clocks disagree, or the "
                           "request is an old one replayed")
    return SignedRequest(node, timestamp, nonce, wait, transfer)


class ReplayGuard:
    """The nonces of the requests admitted within the window: a second request with one is
    refused. A nonce is kept until its timestamp leaves the window, after which the request
    is refused as stale anyway."""

    def __init__(self, *, window: float = WINDOW, capacity: int = 1 << 16) -> None:
        self.window, self.capacity = window, capacity
        self._expiry: list[tuple[float, str]] = []
        self._seen: set[str] = set()

    def admit(self, request: SignedRequest, *, now: float) -> None:
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiry)[1])
        if request.nonce in self._seen:
            raise NotAuthentic("the request's nonce was seen already: a replayed request "
                               "(each request needs a fresh nonce)")
        if len(self._seen) >= self.capacity:
            raise TooManyNonces(f"more than {self.capacity} requests within {self.window:.0f}"
                                " s: try again shortly")
        self._seen.add(request.nonce)
        heapq.heappush(self._expiry, (request.timestamp + self.window, request.nonce))


# --- records -----------------------------------------------------------------------------


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


def prefix(salt: bytes) -> bytes:
    """The body's plain start: the magic and the salt of the stream key."""
    assert len(salt) == SALT_BYTES
    return MAGIC + salt


def read_prefix(data: bytes) -> bytes:
    """The salt; ``HandoffFailed`` if the body is not a handoff stream of this version."""
    if len(data) != len(MAGIC) + SALT_BYTES or not data.startswith(MAGIC):
        raise HandoffFailed(f"the answer does not begin with {MAGIC!r}: not a {VERSION} "
                            "stream", hint="run the same agent version on both nodes")
    return data[len(MAGIC):]


class Sealer:
    """Seals one response's records, in order (one producer at a time)."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._count = 0
        self.ended = False

    def seal(self, kind: Kind, plain: bytes | bytearray | memoryview) -> tuple[bytes, bytes]:
        """The record's header and body (two buffers: joining them would copy the body)."""
        if self.ended:
            raise RuntimeError("the stream has ended: nothing follows FINAL or ABORT")
        if len(plain) > CHUNK:
            raise ValueError(f"a record holds at most {CHUNK} bytes, not {len(plain)}")
        header = HEADER.pack(kind, len(plain) + TAG_BYTES)
        body = self._aead.encrypt(_nonce(self._count), plain, header)
        self._count += 1
        self.ended = kind in ENDS
        return header, body


def parse_header(header: bytes) -> tuple[Kind, int]:
    """A record's kind and body length, bounds checked (before the body is read)."""
    value, length = HEADER.unpack(header)
    try:
        kind = Kind(value)
    except ValueError:
        raise HandoffInterrupted(f"a record of unknown kind {value}: the stream is "
                                 "corrupt") from None
    if not TAG_BYTES <= length <= MAX_BODY:
        raise HandoffInterrupted(f"a record of {length} bytes (at most {MAX_BODY}): the "
                                 "stream is corrupt")
    return kind, length


class Opener:
    """Opens one response's records, in order; any failure is ``HandoffInterrupted``."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._count = 0
        self.ended = False

    def open(self, header: bytes, body: bytes) -> tuple[Kind, bytes]:
        kind, length = parse_header(header)
        if self.ended:
            raise HandoffInterrupted("a record follows the end of the stream")
        if len(body) != length:
            raise HandoffInterrupted(f"record {self._count} is {len(body)} bytes, its header "
                                     f"says {length}")
        if (self._count == 0) != (kind is Kind.HEAD):
            raise HandoffInterrupted(f"record {self._count} is {kind.name}: a stream has one "
                                     "HEAD, first")
        try:
            plain = self._aead.decrypt(_nonce(self._count), body, header)
        except InvalidTag:
            raise HandoffInterrupted(
                f"record {self._count} ({kind.name}) fails authentication: it was altered, "
                "dropped or reordered on the way, or sealed with another key",
                hint="retry; if it persists, check the network path between the nodes"
            ) from None
        self._count += 1
        self.ended = kind in ENDS
        return kind, plain


# --- what the records hold ------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One archive as the HEAD announces it."""

    container: str
    size: int
    image: str = ""
    media_type: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    diff_id: str = ""


@dataclass(frozen=True)
class Head:
    checkpoint_id: str
    source_uid: str
    target_node: str
    entries: tuple[Entry, ...]
    #: The dumper's archive format (``sim-marker/v1``): what the target's dumper restores
    #: from; empty when the source did not say (a stream of this version without it).
    format: str = ""

    @property
    def total(self) -> int:
        return sum(entry.size for entry in self.entries)


def encode_head(head: Head) -> bytes:
    data = json.dumps({
        "checkpoint": head.checkpoint_id, "source_uid": head.source_uid,
        "target_node": head.target_node, "format": head.format,
        "archives": [{"container": e.container, "size": e.size, "image": e.image,
                      "media_type": e.media_type, "annotations": dict(e.annotations),
                      "diff_id": e.diff_id} for e in head.entries],
    }, separators=(",", ":")).encode()
    if len(data) > CHUNK:
        raise ValueError(f"the checkpoint's description is {len(data)} bytes (at most {CHUNK})")
    return data


def _strings(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def decode_head(plain: bytes) -> Head:
    """The HEAD's content; ``HandoffFailed`` if it is not one this version reads."""
    try:
        data = json.loads(plain)
        entries = tuple(
            Entry(a["container"], a["size"], a["image"], a["media_type"], a["annotations"],
                  a["diff_id"]) for a in data["archives"])
        head = Head(data["checkpoint"], data["source_uid"], data["target_node"], entries,
                    data.get("format", ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise HandoffFailed(f"the stream's HEAD is not one {VERSION} reads ({exc})",
                            hint="run the same agent version on both nodes") from exc
    names = [e.container for e in entries]
    if not all(isinstance(v, str) for v in (head.checkpoint_id, head.source_uid,
                                            head.target_node, head.format)) or \
            not all(isinstance(n, str) and NAME.fullmatch(n) for n in names) or \
            len(set(names)) != len(names) or \
            not all(type(e.size) is int and e.size >= 0 and _strings(e.annotations) and
                    isinstance(e.image, str) and isinstance(e.media_type, str) and
                    isinstance(e.diff_id, str) for e in entries):
        raise HandoffFailed("the stream's HEAD names an archive this agent cannot take "
                            "(container names must be unique file-safe names, sizes whole)",
                            hint="run the same agent version on both nodes")
    return head


def encode_final(digests: Sequence[bytes]) -> bytes:
    assert all(len(d) == DIGEST_BYTES for d in digests)
    return b"".join(digests)


def decode_final(plain: bytes, count: int) -> list[bytes]:
    if len(plain) != DIGEST_BYTES * count:
        raise HandoffInterrupted(f"the FINAL record holds {len(plain)} bytes, not "
                                 f"{count} digests")
    return [plain[i:i + DIGEST_BYTES] for i in range(0, len(plain), DIGEST_BYTES)]
