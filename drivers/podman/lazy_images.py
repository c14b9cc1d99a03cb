"""How many pages a lazy dump left to its page server, read from CRIU's pagemap images.

CRIU's page server logs no page it serves, and its statistics start afresh in lazy mode
(:mod:`drivers.podman.lazy_logs`), so the source counts what it will serve from the
images it wrote before its page server listened: every ``pagemap-*.img`` entry flagged
``PE_LAZY`` (criu/include/pagemap.h) is memory only the page server holds. An image is
``IMG_COMMON_MAGIC``, the image's magic, then entries each a little-endian ``u32``
length and a protobuf message (images/pagemap.proto: a ``pagemap_head``, then
``pagemap_entry {vaddr = 1; nr_pages = 2; in_parent = 3; flags = 4}``).

Pure parsing (:func:`lazy_pages`) and a thin reader (:func:`lazy_pages_in`); called by
:mod:`drivers.agent.criu`.
"""

from __future__ import annotations

import struct
from pathlib import Path

IMG_COMMON_MAGIC = 0x54564319
PAGEMAP_MAGIC = 0x56084025
PE_LAZY = 1 << 1


class ImageUnreadable(ValueError):
    """Not a pagemap image CRIU 4 writes."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ImageUnreadable("a varint runs past its message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(message: bytes) -> dict[int, int]:
    """The varint fields of a protobuf message (the only wire type a pagemap entry has)."""
    out, at = {}, 0
    while at < len(message):
        key, at = _varint(message, at)
        if key & 7 != 0:
            raise ImageUnreadable(f"field {key >> 3} has wire type {key & 7}, not a varint")
        out[key >> 3], at = _varint(message, at)
    return out


def lazy_pages(image: bytes) -> int:
    """The pages one ``pagemap-*.img`` leaves to the page server (``PE_LAZY``). Pure."""
    if len(image) < 8 or struct.unpack_from("<II", image) != (IMG_COMMON_MAGIC,
                                                                PAGEMAP_MAGIC):
        raise ImageUnreadable("not a pagemap image (magic)")
    at, entries, pages = 8, 0, 0
    while at < len(image):
        if at + 4 > len(image):
            raise ImageUnreadable("an entry's length is cut short")
        (size,) = struct.unpack_from("<I", image, at)
        message = image[at + 4:at + 4 + size]
        if len(message) != size:
            raise ImageUnreadable("an entry is cut short")
        at += 4 + size
        if entries:  # the first is the pagemap_head
            fields = _fields(message)
            if fields.get(4, 0) & PE_LAZY:
                pages += fields.get(2, 0)
        entries += 1
    return pages


def lazy_pages_in(images: Path) -> int:
    """The pages every process of a lazy dump in ``images`` leaves to the page server
    (blocking: run it in a thread)."""
    return sum(lazy_pages(path.read_bytes()) for path in sorted(images.glob("pagemap-*.img")))
