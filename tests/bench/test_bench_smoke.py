"""The benchmarks still run: each scenario at a tiny size, its JSON checked for the
figures it must report and for the invariants (every migration succeeded, no repeated
side effect, replay found no mismatch) — never for timings, which are not pass/fail.

`make bench-smoke` runs this module (marker ``bench_smoke``), `make test` does not: it
checks the benchmarks' harnesses (169 s of test time in a full run), and the product
paths they drive run in the suite's own tests (tests/reliability, tests/replay,
tests/criu)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = f"cp_smoke_{os.getpid()}"
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.bench_smoke]


async def _drop_all() -> None:
    conn = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/postgres", timeout=10)
    try:
        for name in await conn.fetch("SELECT datname FROM pg_database WHERE datname LIKE $1",
                                     f"{PREFIX}%"):
            await conn.execute(f'DROP DATABASE IF EXISTS "{name["datname"]}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="module", autouse=True)
def _own_databases() -> Iterator[None]:
    yield
    asyncio.run(_drop_all())


def bench(tmp_path: Path, module: str, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{module}.json"
    env = {**os.environ, "BENCH_DB_PREFIX": PREFIX, "BENCH_FLOOR_COMMITS": "50"}
    done = subprocess.run([sys.executable, "-m", f"bench.{module}", *args, "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=100,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    results: dict[str, Any] = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == results  # the JSON line
    return results


def test_scale_reports_per_migration_costs_and_every_migration_succeeds(
    tmp_path: Path,
) -> None:
    r = bench(tmp_path, "scale", "--migrations", "12", "--nodes", "4")
    assert r["succeeded"] == 12
    assert r["worker_error"] == ""
    for key in ("floor_c1_per_s", "floor_c32_per_s", "wall_s", "transitions_per_s",
                "api_requests_per_migration", "api_per_migration_by_verb",
                "registry_requests_per_migration", "rss_peak_bytes",
                "db_rows_per_migration", "db_bytes_per_migration"):
        assert key in r, key
    assert r["api_per_migration_by_verb"]["create"] >= 1  # at least the restored pod
    assert r["pods_running_after"] == 12
    # CPU per process while the worker ran: every part of the world is accounted.
    assert set(r["run_cpu_s"]) == {"control_plane", "sim", "agents", "postgres"}
    assert r["run_cpu_s"]["control_plane"] > 0
    assert r["cpu_ms_per_migration"] > 0
    # Every restore's delay from the pod's creation to its agent acting is collected.
    delay = r["agent_restore_delay"]
    assert delay["count"] == 12 == r["agents"]["restores"]
    assert 0 <= delay["p50_s"] <= delay["p99_s"] <= delay["max_s"]


def test_recovery_resumes_every_migration_without_repeating_a_side_effect(
    tmp_path: Path,
) -> None:
    r = bench(tmp_path, "recovery", "--migrations", "12", "--nodes", "4", "--workers", "1",
              "--lease-seconds", "2")
    assert r["phases"] == {"migration:Succeeded": 12}
    assert r["resumed"] == r["in_flight_at_kill"]
    assert r["once_events_repeated"] == {}
    assert r["agents"]["captures"] == 12
    assert r["agents"]["restores"] == 12
    assert r["markers_preserved"]
    assert "all_resumed_s_after_expiry" in r


def test_replay_rebuilds_cloned_real_histories_without_a_mismatch(tmp_path: Path) -> None:
    r = bench(tmp_path, "replay", "--events", "600", "--template", "4", "--verify",
              "--reference", "full")
    assert r["events"] >= 600
    assert r["mismatches"] == 0
    assert r["events_per_s"] > 0
    assert r["read_events_per_s"] > 0
    assert r["jobs"] == 1  # what cpctl replay picks for a history this small
    assert set(r["cpu_s"]) == {"replay", "postgres"}
    assert r["cpu_s"]["replay"] > 0
    # The clones (ids, and the restored pod names hashed from them) are faithful: every
    # recorded decision of every clone re-runs to the same events.
    assert r["machines"] > 4
    assert r["verify"]["mismatches"] == 0
    assert r["verify"]["decisions"] > r["machines"]
    # The same-run reference: the library wrote as many events as the rebuild folded, read
    # all of them back from its log, and reconstructed every aggregate to its version.
    ref = r["reference"]
    assert ref["events"] == ref["read_log_events"] == r["events"]
    assert ref["reconstructed_events"] == r["events"]
    assert ref["reconstruct_version_mismatches"] == 0
    # The per-event split runs on the history the replay benchmark left, over all of it.
    split = bench(tmp_path, "replay_split", "--parts", "1")
    assert (split["machines"], split["events"]) == (r["machines"], r["events"])
    assert split["mismatches"] == 0
    assert set(split["us_per_event"]) == {"read", "read_postgres", "fold", "compare",
                                          "initial_state"}
    assert set(split["ceiling_events_per_s"]) == {"read", "read_postgres", "fold", "compare",
                                                  "whole"}
    # The whole is its parts: the read on both sides, the fold (initial_state in it), the
    # compare; no part's ceiling is below the whole's.
    parts = split["us_per_event"]
    whole = parts["read"] + parts["read_postgres"] + parts["fold"] + parts["compare"]
    assert split["us_per_event_whole"] == pytest.approx(whole, abs=0.02)
    measured = [c for c in split["ceiling_events_per_s"].values() if c is not None]
    assert min(measured) == split["ceiling_events_per_s"]["whole"]
    # The storage what-if copies the same history as jsonb and as json, reads both back
    # to the same values, and drops its copies.
    storage = bench(tmp_path, "replay_storage", "--parts", "1", "--rounds", "1")
    assert storage["events"] == r["events"]
    assert storage["same_values"] is True
    assert set(storage["types"]) == {"jsonb", "json"}
    assert asyncio.run(_scratch_tables()) == []


async def _scratch_tables() -> list[str]:
    conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:5432/{PREFIX}_replay",
                                 timeout=10)
    try:
        return [r["tablename"] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'whatif%'")]
    finally:
        await conn.close()


def test_engine_benchmark_reports_throughput_and_exact_recovery(tmp_path: Path) -> None:
    r = bench(tmp_path, "engine_throughput", "--machines", "40", "--machines-serial", "8",
              "--recovery", "6", "--lease-seconds", "2")
    assert r["engine_c32"]["transitions"] == 40 * 6
    assert r["engine_c1"]["transitions"] == 8 * 6
    assert r["recovery"]["resumed"] == 6
    assert r["recovery"]["histories_exact"]


def test_history_growth_prunes_a_year_to_its_policy_with_the_reports_unchanged(
        tmp_path: Path) -> None:
    r = bench(tmp_path, "history_growth", "--sizes", "40", "--template", "4", "--days", "90",
              "--keep-days", "30")
    [run] = r["sizes"]
    kept, live = run["kept_all"], run["after_prune_live"]
    assert kept["tables"]["machines"]["rows"] == 40
    assert kept["tables"]["events"]["rows"] == 40 * 12  # a migration is 12 events
    # About two thirds of 90 days lie beyond 30: those operations keep only a summary.
    assert 20 <= run["pruned"]["summarized"] <= 30
    assert live["tables"]["operation_summaries"]["rows"] == run["pruned"]["summarized"]
    assert live["tables"]["machines"]["rows"] == 40 - run["pruned"]["summarized"]
    assert live["bytes_per_migration"] < kept["bytes_per_migration"]
    assert run["reports_equal"] is True


def test_partitions_compares_the_engine_and_the_probes_on_both_layouts(
        tmp_path: Path) -> None:
    r = bench(tmp_path, "partitions", "--rounds", "1", "--machines", "32",
              "--machines-serial", "4", "--events", "24000", "--samples", "5")
    engine = r["engine"]["ratio_partitioned_over_plain"]
    assert set(engine) == {"c1_transitions_per_s", "c32_transitions_per_s",
                           "history_events_per_s"}
    assert all(ratio["median"] > 0 for ratio in engine.values())
    probes = r["scale"]["p50_ratio_partitioned_over_plain"]
    assert probes
    assert all(ratio > 0 for ratio in probes.values())
    assert r["scale"]["load"]["events"] >= 24000


def test_growth_prints_ratios_and_the_idle_tick(tmp_path: Path) -> None:
    r = bench(tmp_path, "growth", "--sizes", "4,8", "--nodes", "4", "--history-events", "600")
    assert [run["succeeded"] for run in r["runs"]] == [4, 8]
    assert set(r["ratios_to_smallest"]) == {"4", "8"}
    assert r["ratios_to_smallest"]["4"]["api_requests_per_migration"] == 1.0
    assert r["idle"]["history_events"] >= 600
    assert r["idle"]["idle_tick_ratio"] > 0


def test_kube_api_counts_and_times_every_verb_per_migration_on_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator half (the real half is the same code on another world, and without
    KUBEBUILDER_ASSETS says why it skipped): every migration succeeded, the worker's and
    the submission's requests are counted apart, every counted verb has a latency, and
    the anchor gives the ceiling."""
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    r = bench(tmp_path, "kube_api", "--migrations", "8", "--nodes", "3", "--anchor", "64")
    assert "KUBEBUILDER_ASSETS" in r["backends"]["real"]["skipped"]
    sim = r["backends"]["sim"]
    assert sim["succeeded"] == 8
    assert sim["phases"] == {"migration:Succeeded": 8}
    assert sim["worker_error"] == ""
    assert sim["pods_running_after"] == 8
    by_verb = sim["api_per_migration_by_verb"]
    assert by_verb["create"] >= 1  # at least the restored pod
    assert by_verb["delete"] >= 1  # the source pod
    assert sim["submission_api_per_migration_by_verb"]["get"] >= 1  # the pod, read fresh
    # Every verb the worker sent has its latency over as many requests as were counted.
    assert set(sim["latency_by_verb"]) == set(by_verb)
    for verb, q in sim["latency_by_verb"].items():
        assert q["n"] == round(by_verb[verb] * 8)
        assert 0 < q["p50_ms"] <= q["p99_ms"]
    assert sim["writes_per_migration"] >= 2
    assert sim["migrations_per_s"] > 0
    assert sim["anchor"]["writes"] == 64
    assert sim["anchor"]["n"] == 64
    assert sim["ceiling_migrations_per_s"] > 0
    assert sim["of_ceiling"] > 0


def test_criu_migration_divides_the_products_downtime_by_criu_alone_measured_alongside(
        tmp_path: Path) -> None:
    """One run at 1 MiB: every path moved a process that went on (its restored log says
    so, or the run fails), each row gives downtime and total as median [min-max] over the
    runs it keeps, the product's row is per mode, and the headline divides the product's
    downtime by CRIU alone's."""
    from tests.criu.world import require_runtime
    require_runtime()
    results = bench(tmp_path, "criu_migration", "--sizes", "1", "--runs", "1")
    assert results["runs"] == 1
    assert results["dirty_mib_per_s"] == 4
    [row] = results["rows"]
    assert row["mib"] == 1
    paths = row["paths"]
    assert set(paths) == {"criu_alone", "product:stop-and-copy",
                          "product:stop-and-copy, streamed", "product:lazy", "ours",
                          "reference"}
    assert paths["reference"]["label"].startswith("reference: podman by hand")
    for path in paths.values():
        [one] = path["runs"]
        assert {"downtime", "total", "bytes", "tick_s"} <= set(one)
        assert one["bytes"] > 1 << 20  # the touched MiB is in the checkpoint
        for figure in ("downtime", "total"):
            s = path["summary"][figure]
            assert s["min"] <= s["median"] <= s["max"]
    for way in ("criu_alone", "ours", "reference"):
        assert {"capture", "push", "pull", "restore"} <= set(paths[way]["runs"][0])
    assert {"checkpoint", "restore"} <= set(paths["product:stop-and-copy"]["runs"][0])
    floor = paths["criu_alone"]["summary"]["downtime"]["median"]
    product = paths["product:stop-and-copy"]["summary"]["downtime"]["median"]
    streamed = paths["product:stop-and-copy, streamed"]["summary"]["downtime"]["median"]
    lazy = paths["product:lazy"]["summary"]["downtime"]["median"]
    assert row["headline"] == {"product:stop-and-copy": pytest.approx(product / floor),
                               "product:stop-and-copy, streamed":
                                   pytest.approx(streamed / floor),
                               "product:lazy": pytest.approx(lazy / floor)}
