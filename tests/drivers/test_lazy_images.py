"""The pages a lazy dump leaves to its page server, counted from CRIU's pagemap images.

Pins :func:`drivers.podman.lazy_images.lazy_pages` on images laid out as CRIU 4 writes
them (magics, a ``pagemap_head``, ``pagemap_entry`` messages): only entries flagged
``PE_LAZY`` count; anything else is refused, not counted as zero.
"""

from __future__ import annotations

import struct

import pytest

from drivers.podman.lazy_images import (
    IMG_COMMON_MAGIC,
    PAGEMAP_MAGIC,
    PE_LAZY,
    ImageUnreadable,
    lazy_pages,
)

PE_PRESENT = 1 << 2


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def message(**fields: int) -> bytes:
    numbers = {"pages_id": 1, "vaddr": 1, "nr_pages": 2, "in_parent": 3, "flags": 4}
    body = b"".join(varint(numbers[k] << 3) + varint(v) for k, v in fields.items())
    return struct.pack("<I", len(body)) + body


def image(*entries: bytes) -> bytes:
    return struct.pack("<II", IMG_COMMON_MAGIC, PAGEMAP_MAGIC) + message(pages_id=7) + \
        b"".join(entries)


def test_only_the_entries_flagged_lazy_count() -> None:
    data = image(message(vaddr=0x7F0000000000, nr_pages=16384, flags=PE_LAZY | PE_PRESENT),
                 message(vaddr=0x400000, nr_pages=3, flags=PE_PRESENT),
                 message(vaddr=0x7FFF00000000, nr_pages=9, flags=PE_LAZY | PE_PRESENT))
    assert lazy_pages(data) == 16393


def test_an_image_of_no_entries_leaves_no_pages() -> None:
    assert lazy_pages(image()) == 0


@pytest.mark.parametrize("data", [
    b"", struct.pack("<II", IMG_COMMON_MAGIC, 0x12345678),
    image(message(vaddr=1, nr_pages=2))[:-1],
    image() + b"\x05\x00",
], ids=["empty", "another-image", "cut-short", "dangling-length"])
def test_anything_else_is_refused(data: bytes) -> None:
    with pytest.raises(ImageUnreadable):
        lazy_pages(data)
