"""The compact encoding of history's JSON: zstd with a dictionary trained on our own rows.

Facts, decision inputs and states repeat the same keys and values from row to row (the
pod an observation saw, the manifest's annotations, the class inside every state); each
row on its own is too small for PostgreSQL's TOAST compression (which starts at ~2 KB)
or for plain zstd to find the repeats. A dictionary trained on those rows gives the
compressor the repeats up front: on ``bench.scale``'s rows a decision input goes from 871
to ~100 bytes, a migration's state from 3.5 KB to ~500 bytes, in a few microseconds.

A value is stored as one format byte followed by its payload:

- ``0x01``: a zstd frame (content size written, no checksum, no dictionary id) compressed
  at level 3 with dictionary v1 (``history_v1.zdict`` next to this module; its origin is
  in ``bench/train_history_dictionary.py``).

A dictionary never changes once rows use it: a better one will be v2 under a new format
byte, and every stored value stays readable. That is checked, not hoped for. Each
dictionary's SHA-256 is pinned here (:data:`READS`) and verified when it is first loaded
(:class:`~controlplane.store.errors.DictionaryChanged`); every database records the
formats and digests its rows may use (``history_encodings``, see ``store.encodings``),
which the store compares with :data:`READS` when it opens one; and
``tests/store/fixtures/codec_v1_frames.json`` holds frames written on 2026-11-26 that
must always decode (``tests/store/test_codec_pinning.py``).

Small values (``{}``, a short fact) are not worth a frame: :func:`column_pair` keeps
them in the plain JSON column.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import zstandard

from controlplane.store.errors import DictionaryChanged, HistoryUnreadable

FORMAT_ZSTD_V1 = 0x01
DICTIONARY_V1 = Path(__file__).with_name("history_v1.zdict")
#: The SHA-256 of dictionary v1's bytes as they were when the first row used them.
DICTIONARY_V1_SHA256 = "5e7ad39132b7b71d6a24553c112eda56110f9d4f5d3b76dcf8126f548775455e"
#: Every format this code reads, with the digest of its dictionary.
READS: dict[int, str] = {FORMAT_ZSTD_V1: DICTIONARY_V1_SHA256}
#: The format :func:`encode` and :func:`column_pair` write.
WRITES = FORMAT_ZSTD_V1
# Under this many bytes of JSON the frame and format byte cost more than they save.
SMALL_JSON = 32
_LEVEL = 3  # level 9 saves ~5 % more at 4-6x the CPU (measured on bench.scale's rows)


def check_dictionaries() -> None:
    """Load every dictionary now, raising :class:`DictionaryChanged` if a file is not the
    one pinned. The store calls this when it opens a database, so a broken install stops
    at start rather than at the first row it reads or writes."""
    _dictionary()


@cache
def _dictionary() -> zstandard.ZstdCompressionDict:
    raw = DICTIONARY_V1.read_bytes()
    found = hashlib.sha256(raw).hexdigest()
    if found != DICTIONARY_V1_SHA256:
        raise DictionaryChanged(
            f"the history dictionary {DICTIONARY_V1} has sha256 {found}, expected "
            f"{DICTIONARY_V1_SHA256}: the file was changed, and every history row "
            f"compressed with dictionary v1 (format {FORMAT_ZSTD_V1:#04x}) needs its exact "
            "bytes",
            hint="restore the file as released (git checkout -- "
                 "controlplane/store/history_v1.zdict, or reinstall); dictionaries never "
                 "change: a retrained one is a new file under a new format byte, v1 kept",
        )
    data = zstandard.ZstdCompressionDict(raw)
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
    """The JSON value :func:`encode` stored. A format byte this code does not know is
    :class:`HistoryUnreadable` (exit code 3, not an internal error): the row was written
    by a newer version, which a read-only verb meets without the open-time check."""
    if not blob:
        raise ValueError("empty compressed value")
    if blob[0] != FORMAT_ZSTD_V1:
        raise HistoryUnreadable(f"unknown history encoding {blob[0]:#04x}: written by a newer "
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
