"""The reference measurement (``bench.reference_log``) measures what it says: at a tiny size,
every event written through the eventsourcing library is read back from its log, every
aggregate is reconstructed to its full version, and the library runs with snapshotting,
cipher and compression off whatever the process environment says. Never timings: rates
are only checked to be positive."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import db_name, drop_database, fresh_database
from bench.reference_log import ReferenceLog, library_env, make_payload, measure_reference

ROOT = Path(__file__).resolve().parents[2]
# Its own prefix: a benchmark's cp_bench_eslog (or another suite's databases) is never touched.
PREFIX = f"cp_smoke_ref_{os.getpid()}"
pytestmark = pytest.mark.postgres


@pytest.fixture
def own_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("BENCH_DB_PREFIX", PREFIX)
    name = db_name("eslog")
    yield name
    asyncio.run(drop_database(name))


def test_every_event_written_is_read_back_and_every_aggregate_folds_to_its_version(
    own_database: str,
) -> None:
    r = measure_reference(600, events_per_aggregate=12, payload_bytes=288)
    assert r["database"] == own_database
    assert r["library"].startswith("eventsourcing ")
    assert (r["events"], r["aggregates"]) == (600, 50)
    assert r["log"]["rows"] == 600
    assert r["read_log_events"] == 600
    assert r["read_decode_events"] == 600
    assert r["reconstruct_scope"] == "all"
    assert r["reconstructed_aggregates"] == 50
    assert r["reconstructed_events"] == 600  # the sum of the versions: 12 each
    assert r["reconstruct_version_mismatches"] == 0
    for rate in ("write_events_per_s", "read_log_events_per_s", "read_decode_events_per_s",
                 "reconstruct_events_per_s", "reconstruct_aggregates_per_s"):
        assert r[rate] > 0, rate


def test_a_page_smaller_than_the_log_still_reads_it_to_the_end(own_database: str) -> None:
    """Paging is exact at every size, the last page full or short: none is missed or
    read twice (600 events: pages of 7 end short, pages of 100 end full)."""
    r = measure_reference(600, events_per_aggregate=12, page_size=7,
                          compare_page_sizes=(100, 600, 10_000), reconstruct_sample=10)
    assert r["read_log_events"] == r["read_decode_events"] == 600
    assert set(r["read_log_events_per_s_by_page_size"]) == {"100", "600", "10000"}
    assert r["reconstruct_scope"] == "1 in 5 aggregates"  # the sample is said, not hidden
    assert r["reconstructed_aggregates"] == 10
    assert r["reconstructed_events"] == 120


def test_reuse_reads_the_log_an_earlier_run_wrote_and_writes_nothing(own_database: str) -> None:
    """``--reuse`` (bench.replay --reuse): the second run finds the 240 events, reads and
    reconstructs all of them, and says it wrote nothing; a bigger request writes afresh."""
    first = measure_reference(240, events_per_aggregate=12)
    again = measure_reference(240, events_per_aggregate=12, reuse=True, reconstruct_too=False)
    assert (first["reused"], again["reused"]) == (False, True)
    assert again["write_s"] is None
    assert again["write_events_per_s"] is None
    assert again["read_log_events"] == again["events"] == 240
    assert again["reconstruct_scope"] == "none"
    assert again["reconstruct_events_per_s"] is None
    bigger = measure_reference(360, events_per_aggregate=12, reuse=True)
    assert not bigger["reused"]
    assert bigger["read_log_events"] == bigger["reconstructed_events"] == 360


def test_an_uneven_history_ends_with_a_short_aggregate(own_database: str) -> None:
    r = measure_reference(100, events_per_aggregate=12)
    assert (r["events"], r["aggregates"]) == (100, 9)  # 8 of 12 and one of 4
    assert r["read_log_events"] == r["reconstructed_events"] == 100
    assert r["reconstruct_version_mismatches"] == 0


def test_the_library_runs_without_snapshots_cipher_or_compressor_whatever_the_environment(
    own_database: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Application merges os.environ into its configuration: the keys passed win."""
    monkeypatch.setenv("IS_SNAPSHOTTING_ENABLED", "y")
    monkeypatch.setenv("COMPRESSOR_TOPIC", "zlib")
    monkeypatch.setenv("CIPHER_KEY", "not-a-key")
    asyncio.run(fresh_database(own_database))
    app = ReferenceLog(env=library_env(own_database))
    try:
        assert app.snapshots is None
        assert app.mapper.compressor is None
        assert app.mapper.cipher is None
        assert app.repository.cache is None  # every get reads the database
    finally:
        app.close()


def test_payload_is_the_requested_size_of_compact_json() -> None:
    for size in (288, 1000):
        assert len(json.dumps(make_payload(1234, 5, size), separators=(",", ":"))) == size


@pytest.mark.slow
def test_command_line_prints_a_table_and_the_json_it_writes(
    own_database: str, tmp_path: Path,
) -> None:
    out = tmp_path / "reference_log.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.reference_log", "--events", "240", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "BENCH_DB_PREFIX": PREFIX}, capture_output=True,
        text=True, timeout=100, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("reference_log: eventsourcing ")
    results = json.loads(out.read_text())
    assert json.loads(lines[-1]) == results
    assert results["read_log_events"] == results["events"] == 240
