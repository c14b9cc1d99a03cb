"""History's compression dictionary is pinned: rows compressed on 2026-11-26 always decode,
and a changed dictionary file stops the codec at first use.

Every other codec test encodes and decodes in one process, so a retrained dictionary
would pass them all while making every stored row unreadable. The frames in
``fixtures/codec_v1_frames.json`` were written once by the codec of 2026-11-26
(``python -m tests.store.fixtures.codec_v1_frames``) and are never re-recorded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard

from controlplane.store import codec
from controlplane.store.errors import DictionaryChanged
from tests.store.fixtures.codec_v1_frames import FRAMES
from tests.store.fixtures.codec_v1_frames import main as record_frames

#: Dictionary v1's digest, written here by hand: never read from the code under test.
V1_SHA256 = "5e7ad39132b7b71d6a24553c112eda56110f9d4f5d3b76dcf8126f548775455e"

RECORDED: dict[str, Any] = json.loads(FRAMES.read_text(encoding="utf-8"))
IDS = [f["what"] for f in RECORDED["frames"]]


def test_dictionary_v1_is_the_file_its_pinned_digest_names() -> None:
    assert hashlib.sha256(codec.DICTIONARY_V1.read_bytes()).hexdigest() == V1_SHA256
    assert codec.DICTIONARY_V1_SHA256 == V1_SHA256
    assert codec.READS == {0x01: V1_SHA256}
    assert RECORDED["dictionary_sha256"] == V1_SHA256


def test_the_recorded_frames_cover_facts_decision_inputs_and_states() -> None:
    whats = " | ".join(IDS)
    for kind in ("facts", "observation decision input", "command decision input", "state"):
        assert kind in whats


@pytest.mark.parametrize("frame", RECORDED["frames"], ids=IDS)
def test_a_frame_recorded_on_2026_11_26_decodes_to_its_value(frame: dict[str, Any]) -> None:
    blob = bytes.fromhex(frame["hex"])
    assert codec.decode(blob) == frame["value"]
    assert codec.from_columns(None, blob) == frame["value"]
    # The frame's own header, independent of the zstd version: format 0x01, then a frame
    # that carries its content size and neither a checksum nor a dictionary id.
    params = zstandard.get_frame_parameters(blob[1:])
    assert blob[0] == 0x01
    assert (params.content_size, params.has_checksum, params.dict_id) == (
        len(orjson.dumps(frame["value"])), False, 0)


@pytest.mark.parametrize("frame", RECORDED["frames"], ids=IDS)
def test_todays_codec_writes_the_bytes_recorded_on_2026_11_26(frame: dict[str, Any]) -> None:
    """Byte equality notices a change of level or frame parameters that decoding alone
    would not. zstd promises to read every frame ever written, not to write the same bytes
    in every release: if only the library moved, the test above still passes and stored
    rows are safe."""
    now = ".".join(map(str, zstandard.ZSTD_VERSION))
    assert codec.encode(frame["value"]).hex() == frame["hex"], (
        f"the codec no longer writes the frame recorded for {frame['what']!r}. Recorded "
        f"with zstandard {RECORDED['zstandard']} (libzstd {RECORDED['libzstd']}), now "
        f"{zstandard.__version__} (libzstd {now}). If the library changed, stored rows are "
        "safe as long as every recorded frame still decodes: add a second fixture for the "
        "new version, never replace this one. If the level or the frame parameters "
        "changed, that is a new format byte, not an edit of 0x01.")


@pytest.fixture
def dictionary_file(monkeypatch: pytest.MonkeyPatch,
                    tmp_path: Path) -> Iterator[Callable[[bytes], Path]]:
    """Point the codec at a copy of the dictionary holding other bytes; the cached
    dictionary and (de)compressors are dropped before and after."""

    def change(data: bytes) -> Path:
        path = tmp_path / "history_v1.zdict"
        path.write_bytes(data)
        monkeypatch.setattr(codec, "DICTIONARY_V1", path)
        _clear_codec_caches()
        return path

    yield change
    _clear_codec_caches()  # before monkeypatch restores the path: the next use reloads it


def _clear_codec_caches() -> None:
    for cached in (codec._dictionary, codec._compressor, codec._decompressor):
        cached.cache_clear()


def _one_byte_changed() -> bytes:
    data = bytearray(codec.DICTIONARY_V1.read_bytes())
    data[-1] ^= 0x01
    return bytes(data)


def _retrained() -> bytes:
    samples: list[bytes | bytearray | memoryview] = [
        orjson.dumps({"pod": f"ns/p{i}", "phase": "Running", "n": i}) for i in range(400)]
    return zstandard.train_dictionary(2048, samples).as_bytes()


@pytest.mark.parametrize("changed", [_one_byte_changed, _retrained],
                         ids=["one byte changed", "retrained"])
def test_a_changed_dictionary_file_is_refused_at_first_use_naming_the_file_and_digests(
    dictionary_file: Callable[[bytes], Path], changed: Callable[[], bytes],
) -> None:
    data = changed()
    path = dictionary_file(data)
    for use in (lambda: codec.encode({"pod": "ns/p"}),
                lambda: codec.decode(bytes.fromhex(RECORDED["frames"][0]["hex"])),
                codec.check_dictionaries):
        with pytest.raises(DictionaryChanged) as caught:
            use()
        message = str(caught.value)
        assert str(path) in message
        assert V1_SHA256 in message
        assert hashlib.sha256(data).hexdigest() in message
        assert "the file was changed" in message
        assert "new format byte" in message


def test_the_frames_fixture_is_never_re_recorded() -> None:
    before = FRAMES.read_bytes()
    with pytest.raises(SystemExit, match="never re-recorded"):
        record_frames()
    assert FRAMES.read_bytes() == before
