"""History's compression dictionary is pinned: rows compressed on 2026-11-26 always decode,
a changed dictionary file stops the codec at first use (and the store at open), and a
database whose rows name an encoding this code does not have is refused before any row.

Every other codec test encodes and decodes in one process, so a retrained dictionary
would pass them all while making every stored row unreadable. The frames in
``fixtures/codec_v1_frames.json`` were written once by the codec of 2026-11-26
(``python -m tests.store.fixtures.codec_v1_frames``) and are never re-recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from sqlalchemy import delete, insert, select, update

from controlplane.store import codec, migrate
from controlplane.store.database import Database, open_database
from controlplane.store.errors import DictionaryChanged, HistoryUnreadable, SchemaNotReady
from controlplane.store.schema import history_encodings
from controlplane.store.session import read_txn, write_txn
from tests.store.fixtures.codec_v1_frames import FRAMES
from tests.store.fixtures.codec_v1_frames import main as record_frames

ROOT = Path(__file__).resolve().parents[2]
#: Dictionary v1's digest, written here by hand: never read from the code under test.
V1_SHA256 = "5e7ad39132b7b71d6a24553c112eda56110f9d4f5d3b76dcf8126f548775455e"
ALIEN = "ab" * 32

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


async def test_a_changed_dictionary_stops_the_store_when_it_opens_the_database(
    db: Database, dictionary_file: Callable[[bytes], Path],
) -> None:
    dictionary_file(_one_byte_changed())
    with pytest.raises(DictionaryChanged):
        await migrate.require_current(db)
    with pytest.raises(DictionaryChanged):
        await migrate.upgrade(db)


async def _recorded(db: Database) -> dict[int, str]:
    async with read_txn(db) as conn:
        rows = await conn.execute(select(history_encodings))
        return {r.format: r.dictionary_sha256 for r in rows}


async def test_a_migrated_database_records_dictionary_v1_by_its_digest(db: Database) -> None:
    assert await _recorded(db) == {0x01: V1_SHA256}
    await migrate.require_current(db)
    await migrate.upgrade(db)  # idempotent
    assert await _recorded(db) == {0x01: V1_SHA256}


async def test_a_database_naming_an_encoding_this_version_lacks_is_refused_with_the_fix(
    db: Database,
) -> None:
    async with write_txn(db) as conn:
        await conn.execute(insert(history_encodings).values(format=0x02,
                                                            dictionary_sha256=ALIEN))
    for opening in (migrate.require_current, migrate.upgrade):
        with pytest.raises(HistoryUnreadable) as caught:
            await opening(db)
        message = str(caught.value)
        assert "history encoding 0x02" in message
        assert f"dictionary sha256 {ALIEN}" in message
        assert "which this version cannot read" in message
        assert "upgrade the control plane" in message
        assert caught.value.exit_code == 3


async def test_a_database_whose_v1_rows_used_another_dictionary_is_refused(
    db: Database,
) -> None:
    async with write_txn(db) as conn:
        await conn.execute(update(history_encodings).values(dictionary_sha256=ALIEN))
    for opening in (migrate.require_current, migrate.upgrade):
        with pytest.raises(HistoryUnreadable, match=f"0x01 and dictionary sha256 {ALIEN}.*"
                                                    f"has sha256 {V1_SHA256}"):
            await opening(db)


async def test_a_database_not_recording_the_written_encoding_is_sent_to_db_upgrade(
    db: Database,
) -> None:
    """Rows must never be written in a format the database does not record: a process
    that writes refuses to start until ``upgrade`` has recorded it."""
    async with write_txn(db) as conn:
        await conn.execute(delete(history_encodings))
    with pytest.raises(SchemaNotReady, match=r"does not record history encoding 0x01.*"
                                            r"cpctl db upgrade") as caught:
        await migrate.require_current(db)
    assert not isinstance(caught.value, HistoryUnreadable)
    await migrate.upgrade(db)
    assert await _recorded(db) == {0x01: V1_SHA256}
    await migrate.require_current(db)


async def test_upgrading_from_0010_records_v1_and_downgrading_drops_it_again(
    db: Database,
) -> None:
    await migrate.downgrade(db, "0010")
    with pytest.raises(SchemaNotReady, match="this code needs"):
        await migrate.require_current(db)
    await migrate.upgrade(db)
    assert await _recorded(db) == {0x01: V1_SHA256}


async def test_a_downgrade_below_0011_is_refused_while_another_encoding_is_recorded(
    db: Database,
) -> None:
    async with write_txn(db) as conn:
        await conn.execute(insert(history_encodings).values(format=0x02,
                                                            dictionary_sha256=ALIEN))
    with pytest.raises(RuntimeError, match=r"0x02.*revision 0010 cannot read"):
        await migrate.downgrade(db, "0010")
    assert await migrate.current_revision(db) == migrate.head_revision()
    assert await _recorded(db) == {0x01: V1_SHA256, 0x02: ALIEN}


def test_a_worker_refuses_to_start_on_a_database_from_a_newer_encoding(
    tmp_path: Path,
) -> None:
    """As an operator sees it: one line naming the encoding and the fix, exit code 3."""
    url = f"sqlite:///{tmp_path / 'newer.db'}"

    async def prepare() -> None:
        db = open_database(url)
        try:
            await migrate.upgrade(db)
            async with write_txn(db) as conn:
                await conn.execute(insert(history_encodings).values(
                    format=0x02, dictionary_sha256=ALIEN))
        finally:
            await db.dispose()

    asyncio.run(prepare())
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli.main", "--db", url, "worker", "--until-done"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 3, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("cpctl: error: ")
    assert "history encoding 0x02" in line
    assert "upgrade the control plane" in line


def test_the_frames_fixture_is_never_re_recorded() -> None:
    before = FRAMES.read_bytes()
    with pytest.raises(SystemExit, match="never re-recorded"):
        record_frames()
    assert FRAMES.read_bytes() == before
