"""The compact encoding of history's JSON: zstd with a dictionary trained on our own rows.

Facts, decision inputs and states repeat the same keys and values from row to row (the
pod an observation saw, the manifest's annotations, the class inside every state); each
row on its own is too small for PostgreSQL's TOAST compression (which starts at ~2 KB)
or for plain zstd to find the repeats. A dictionary trained on those rows gives the
compressor the repeats up front: on ``bench.scale``'s rows a decision input goes from 871
to ~100 bytes, a migration's state from 3.5 KB to ~500 bytes, in a few microseconds.

A value is stored as one format byte followed by its payload:

- ``0x01``: a zstd frame (content size written, no checksum, no dictionary id) compressed
  with dictionary v1 (``history_v1.zdict`` next to this module; its origin is in
  ``bench/train_history_dictionary.py``). Dictionary v1 never changes: a better one
  will be v2 under a new format byte, and every stored value stays readable.

Small values (``{}``, a short fact) are not worth a frame: :func:`column_pair` keeps
them in the plain JSON column.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import orjson
import zstandard

FORMAT_ZSTD_V1 = 0x01
DICTIONARY_V1 = Path(__file__).with_name("history_v1.zdict")
# Under this many bytes of JSON the frame and format byte cost more than they save.
SMALL_JSON = 32
_LEVEL = 3  # level 9 saves ~5 % more at 4-6x the CPU (measured on bench.scale's rows)


@cache
def _dictionary() -> zstandard.ZstdCompressionDict:
    data = zstandard.ZstdCompressionDict(DICTIONARY_V1.read_bytes())
    data.precompute_compress(level=_LEVEL)
    return data


@cache
def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=_LEVEL, dict_data=_dictionary(),
                                    write_checksum=False, write_content_size=True,
                                    write_dict_id=False)


@cache
def _decompressor() -> zstandard.ZstdDecompressor:
    return zstandard.ZstdDecompressor(dict_data=_dictionary())


def _dumps(value: Any) -> bytes:
    # Non-string keys become strings, as in the JSON columns (``database.json_dumps``).
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


def _frame(raw: bytes) -> bytes:
    return _FORMAT_V1 + _compressor().compress(raw)


_FORMAT_V1 = bytes((FORMAT_ZSTD_V1,))


def encode(value: Any) -> bytes:
    """``value`` (JSON-serialisable) as a format byte + zstd frame."""
    return _frame(_dumps(value))


def decode(blob: bytes) -> Any:
    """The JSON value :func:`encode` stored (a format byte this code does not know is an
    error: the row was written by a newer version)."""
    if not blob:
        raise ValueError("empty compressed value")
    if blob[0] != FORMAT_ZSTD_V1:
        raise ValueError(f"unknown history encoding {blob[0]:#04x}: written by a newer "
                         "version of the control plane; upgrade this one to read it")
    return orjson.loads(_decompressor().decompress(memoryview(blob)[1:]))


def column_pair(value: Any) -> tuple[Any, bytes | None]:
    """What to store in a (JSON column, compressed column) pair: the JSON itself when it
    is small, else JSON null and the compressed value."""
    raw = _dumps(value)
    if len(raw) >= SMALL_JSON:
        return None, _frame(raw)
    return value, None


def from_columns(plain: Any, compressed: bytes | None) -> Any:
    """The value of a (JSON column, compressed column) pair, whichever holds it."""
    return decode(compressed) if compressed is not None else plain
