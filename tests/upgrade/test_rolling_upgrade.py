"""Rolling upgrade from the previous release with operations in flight (docs/install.md,
"Upgrading"), on PostgreSQL and the simulated cluster.

The previous release is the commit ``CHANGELOG.md`` names, checked out into a directory
of its own and run from there (``tests/upgrade/previous_release.py``). The procedure,
step by step as docs/install.md gives it:

1. the previous release's schema (its own ``cpctl db upgrade``) and two of its workers;
   migrations and a drain submitted with its own ``cpctl``, and running;
2. this tree's ``cpctl db upgrade`` to head while those workers run and the operations
   are in flight;
3. two workers of this tree started beside the old ones, and more migrations submitted
   with this tree's ``cpctl``;
4. the old workers stopped (SIGTERM: they finish their step and hand their leases over);
5. the rollback ("Rolling back"): a second drain started by this tree; the schema
   downgraded to the previous release's head by this tree's code while its workers run
   and the drain is in flight; this tree's workers stopped; the previous release's
   started, to finish the drain.

Invariants: the old workers kept working across the schema change (they recorded
events after it) and stopped cleanly; every operation ends as it would have without the
upgrade (every migration and the drain Succeeded); nothing is lost or duplicated (each
workload carried by exactly one Running pod, every history gap-free, the source deleted
only after its artifact was verified and the artifact only after a verified restore:
``tests.reliability.campaign.check_invariants``); no worker of either release crashed a
step or left a machine it could not read; ``cpctl replay --verify`` exits 0 (this
tree's after the upgrade, the previous release's after the rollback). The same holds
after the rollback, whose drain was decided on before and after the downgrade.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from controlplane.store.migrate import head_revision
from drivers.agent.dumper import DumpRequest
from tests.reliability.campaign import (
    NS,
    PG_ADMIN_URL,
    STARTED,
    CampaignConfig,
    _decoded,
    campaign_database,
    check_invariants,
    open_world,
)
from tests.support.waiting import eventually
from tests.upgrade.previous_release import (
    ROOT,
    check_out,
    environment,
    imported_from,
    releases,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SEED = 40
#: Pods on node-1 and node-2 (moved between them by migrations), and on node-3, which is
#: drained one child at a time: its first capture is held until the schema changed (and
#: node-2's, drained back, until the downgrade).
PODS_PER_NODE = 4
DRAINED_PODS = 8
CRASH = "machine step crashed"
LEFT = "machine left to a newer worker"


class Workers:
    """``cpctl worker`` processes of one release (``tree``: its code), logging JSON."""

    def __init__(self, tree: Path, db_url: str, args: list[str], logs: Path, name: str) -> None:
        self.tree, self.db_url, self.args, self.logs, self.name = tree, db_url, args, logs, name
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_files: list[Path] = []

    def start(self, count: int) -> None:
        for i in range(count):
            worker_id = f"{self.name}-{i}"
            log = self.logs / f"{worker_id}.log"
            self.log_files.append(log)
            with log.open("wb") as err:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "controlplane.cli.main", "--db", self.db_url,
                     "--log-format", "json", "--log-level", "info", "worker",
                     "--worker-id", worker_id, "--lease-seconds", "10", "--poll-seconds",
                     "0.05", "--concurrency", "16", *self.args],
                    cwd=self.tree, env=environment(self.tree), stdout=subprocess.DEVNULL,
                    stderr=err, stdin=subprocess.DEVNULL))

    def alive(self) -> None:
        for proc, log in zip(self.procs, self.log_files, strict=True):
            if proc.poll() is not None:
                raise AssertionError(f"{log.stem} exited by itself with {proc.returncode}: "
                                     + log.read_text(errors="replace")[-3000:])

    def stop(self, timeout: float = 60) -> list[int]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes

    def lines(self, text: str) -> list[str]:
        return [line for log in self.log_files
                for line in log.read_text(errors="replace").splitlines() if text in line]


def cpctl(tree: Path, db_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "controlplane.cli.main", "--db", db_url,
                             *args], cwd=tree, env=environment(tree), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


async def finished(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Each command's stdout's last line (an operation id); fails on a non-zero exit.
    Waited for in a thread: the simulated API server they talk to runs on this loop."""
    out = []
    for proc in procs:
        stdout, stderr = await asyncio.to_thread(proc.communicate, timeout=120)
        assert proc.returncode == 0, f"{proc.args!r}: exit {proc.returncode}: {stderr}"
        out.append((stdout.strip().splitlines() or [""])[-1].strip())
    return out


@pytest.fixture
def previous(tmp_path: Path) -> Path:
    current, before = releases()[:2]
    assert current.version != before.version
    tree = check_out(before, tmp_path / f"release-{before.version}")
    where = imported_from(tree)
    assert all(path.startswith(str(tree)) for path in where.values()), where
    return tree


async def _query(db_url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url, timeout=10)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


def _settled(db_url: str, workers: Workers) -> Callable[[], Awaitable[bool]]:
    """Every machine terminal, its outbox performed and its lease released."""
    async def check() -> bool:
        workers.alive()
        rows = await _query(db_url, "SELECT count(*) FROM machines WHERE NOT terminal "
                            "OR lease_owner IS NOT NULL OR next_wake_at IS NOT NULL")
        return bool(rows[0][0] == 0)
    return check


async def _evidence(db_url: str) -> tuple[list[dict[str, Any]],
                                          dict[str, list[asyncpg.Record]]]:
    machines = [_decoded(r) for r in await _query(
        db_url, "SELECT id, kind, phase, terminal, state, state_z FROM machines")]
    events = await _query(db_url, "SELECT machine_id, seq, type, data, worker_id, "
                          "recorded_at FROM events ORDER BY machine_id, seq")
    histories: dict[str, list[asyncpg.Record]] = {}
    for e in events:
        histories.setdefault(e["machine_id"], []).append(e)
    return machines, histories


def _why_not(machines: list[dict[str, Any]],
             histories: dict[str, list[asyncpg.Record]]) -> str:
    """The machines that did not succeed, each with its history (types, data, worker)."""
    return "\n".join(
        f"{m['id']} {m['kind']} {m['phase']}: " + "; ".join(
            f"{e['type']} {e['data']} by {e['worker_id']}" for e in histories[m["id"]])
        for m in machines if m["phase"] != "Succeeded")


async def _replay_verify(tree: Path, db_url: str) -> None:
    replay = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "controlplane.cli.main", "--db", db_url, "replay", "--verify"],
        cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, check=False)
    assert replay.returncode == 0, f"{tree}: {replay.stdout}{replay.stderr}"


#: The downgrade docs/install.md gives ("Rolling back"), word for word.
DOWNGRADE = """import asyncio, os
from controlplane.store import migrate
from controlplane.store.database import open_database
async def main():
    db = open_database(os.environ["CONTROLPLANE_DATABASE_URL"])
    try:
        await migrate.downgrade(db, os.environ["REVISION"])
    finally:
        await db.dispose()
asyncio.run(main())"""


@pytest.mark.timeout(300)
async def test_a_rolling_upgrade_from_the_previous_release_loses_and_repeats_nothing(
        previous: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    cfg = CampaignConfig(workloads=2 * PODS_PER_NODE + DRAINED_PODS, nodes=3, seed=SEED,
                         kills=False, workers=0)
    deleted: list[tuple[str, str]] = []
    # A drain's captures wait on their node's gate while it is held: the first drain's
    # (node-3) until the schema is upgraded, the second's (node-2) until the downgrade
    # and this tree's stop are done, so each drain is certainly in flight across its
    # schema change, however fast the rest runs.
    held: dict[str, asyncio.Event] = {}

    async def hold_the_drain(request: DumpRequest) -> None:
        gate = held.get(request.workload.node)
        if gate is not None:
            await gate.wait()
    async with campaign_database(PG_ADMIN_URL) as db_url, \
            open_world(cfg, tmp_path, deleted, before_dump=hold_the_drain) as world:
        old = Workers(previous, db_url, world.worker_args, tmp_path, "old")
        new = Workers(ROOT, db_url, world.worker_args, tmp_path, "new")
        rolled: list[Workers] = []
        try:
            # 1. The previous release: its schema, its workers, its operations.
            await finished([cpctl(previous, db_url, "db", "upgrade")])
            [[before]] = await _query(db_url, "SELECT version_num FROM alembic_version")
            assert before != head_revision(), "the previous release is at this tree's head"
            n1, n2, n3 = world.cluster.node_names
            placed = [n1] * PODS_PER_NODE + [n2] * PODS_PER_NODE + [n3] * DRAINED_PODS
            names: dict[str, list[str]] = {n1: [], n2: [], n3: []}
            for i, node in enumerate(placed):
                world.cluster.create_pod(NS, f"w{i:03d}", node=node, cpu="100m",
                                         memory="64Mi", marker=f"w{i:03d}=seed{SEED}")
                names[node].append(f"w{i:03d}")
            held[n3] = asyncio.Event()
            await world.cluster.wait_for(
                lambda: all((world.cluster.pod(NS, f"w{i:03d}") or {}).get("status", {})
                            .get("phase") == "Running" for i in range(cfg.workloads)),
                limit_seconds=60, what="workload pods running")
            old.start(2)
            repo = "localhost:5000/checkpoints/upgrade"
            kube = world.worker_args  # the cluster, the registry, the admission limits
            first_wave = [(names[n1][k], n2) for k in range(3)] + \
                [(names[n2][k], n1) for k in range(3)]
            await finished(
                [cpctl(previous, db_url, "drain", n3, "--to", n1, "--to", n2,
                       "--max-parallel", "1", "--repository", repo, *kube)]
                + [cpctl(previous, db_url, "migrate", f"{NS}/{pod}", "--to", target,
                         "--repository", repo, *kube) for pod, target in first_wave])
            [[drain_id]] = await _query(db_url, "SELECT id FROM machines WHERE kind = 'drain'")

            async def under_way() -> bool:
                old.alive()
                rows = await _query(db_url, "SELECT count(*) FROM machines WHERE version > 1")
                return bool(rows[0][0] >= 1 + len(first_wave))
            await eventually(under_way, limit_seconds=60, every=0.05,
                             what="the old workers deciding on every operation")

            # 2. This tree's schema upgrade, while the old workers run.
            upgrade_at = time.monotonic()
            await finished([cpctl(ROOT, db_url, "db", "upgrade")])
            upgraded = await _query(db_url, "SELECT version_num, now() FROM alembic_version")
            [[after, upgraded_at]] = upgraded
            assert after == head_revision()
            in_flight = await _query(db_url, "SELECT id FROM machines WHERE NOT terminal")
            assert any(r["id"] == drain_id for r in in_flight), \
                "the drain ended before the upgrade: nothing was in flight"
            held[n3].set()
            old.alive()

            # 3. This tree's workers beside the old ones.
            new.start(2)

            def new_started() -> bool:
                old.alive()
                new.alive()
                return len(new.lines(STARTED)) == 2
            await eventually(new_started, limit_seconds=60, every=0.05,
                             what="this tree's workers claiming")

            # 4. The old workers stop; operations of this tree's own go to its workers.
            assert await asyncio.to_thread(old.stop) == [0, 0], old.lines("error")[-5:]
            second_wave = [(names[n1][3], n2), (names[n2][3], n1)]
            await finished([cpctl(ROOT, db_url, "migrate", f"{NS}/{pod}", "--to", target,
                                  "--repository", repo, *kube)
                            for pod, target in second_wave])

            await eventually(_settled(db_url, new), limit_seconds=150, every=0.2,
                             what="every operation settled")

            # Evidence.
            machines, histories = await _evidence(db_url)
            events = [e for history in histories.values() for e in history]
            outcomes = {m["id"]: (m["kind"], m["phase"]) for m in machines}
            assert all(phase == "Succeeded" for _, phase in outcomes.values()), \
                _why_not(machines, histories)
            kinds = sorted(kind for kind, _ in outcomes.values())
            # The migrations asked for, the drain and its children (a pod of node-3 each).
            asked = len(first_wave) + len(second_wave)
            assert kinds == ["drain"] + ["migration"] * (asked + DRAINED_PODS), kinds
            assert await check_invariants(machines, histories, world, deleted, cfg) == []
            # The old workers worked on the upgraded schema, the new ones beside them.
            old_after = [e for e in events if e["worker_id"].startswith("old-")
                         and e["recorded_at"] > upgraded_at]
            assert old_after, "the old workers recorded nothing after the schema upgrade"
            # The drain was in flight across the upgrade: decided on before and after it.
            drain = histories[drain_id]
            assert drain[1]["recorded_at"] < upgraded_at < drain[-1]["recorded_at"]
            assert any(e["worker_id"].startswith("new-") for e in events)
            for workers in (old, new):
                assert workers.lines(CRASH) == []
                assert workers.lines(LEFT) == []
            # 0.1.0 and this tree write the same formats: nothing is left to either.
            await _replay_verify(ROOT, db_url)
            upgraded_in = time.monotonic() - started

            # 5. Rollback with an operation in flight (docs/install.md, "Rolling back"):
            #    the schema first, downgraded by this tree's code while its workers run,
            #    then the previous release's workers, then this tree's stop.
            held[n2] = asyncio.Event()
            await finished([cpctl(ROOT, db_url, "drain", n2, "--to", n1, "--max-parallel", "1",
                                  "--repository", repo, *kube)])
            [[drain_back]] = await _query(db_url, "SELECT id FROM machines WHERE kind = 'drain' "
                                          "AND id <> $1", drain_id)

            async def drain_back_under_way() -> bool:
                new.alive()
                rows = await _query(db_url, "SELECT count(*) FROM machines "
                                    "WHERE kind = 'migration' AND id LIKE $1 || '%'", drain_back)
                return bool(rows[0][0] >= 1)
            await eventually(drain_back_under_way, limit_seconds=60, every=0.05,
                             what="the second drain's first child")
            downgrade = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", DOWNGRADE], cwd=ROOT,
                env={**environment(ROOT), "CONTROLPLANE_DATABASE_URL": db_url,
                     "REVISION": before},
                capture_output=True, text=True, timeout=120, check=False)
            assert downgrade.returncode == 0, downgrade.stdout + downgrade.stderr
            [[back_at, rolled_back_at]] = await _query(
                db_url, "SELECT version_num, now() FROM alembic_version")
            assert back_at == before
            [[ended]] = await _query(db_url, "SELECT terminal FROM machines WHERE id = $1",
                                     drain_back)
            assert not ended, "the second drain ended before the downgrade"
            # This tree's workers stop before the previous release's start: the harsher of
            # the two orders a rollout may take (nothing claims for a moment), and the one
            # that leaves the drain to the previous release for certain.
            assert await asyncio.to_thread(new.stop) == [0, 0], new.lines("error")[-5:]
            [[ended]] = await _query(db_url, "SELECT terminal FROM machines WHERE id = $1",
                                     drain_back)
            assert not ended, "the second drain ended before this tree's workers stopped"
            held[n2].set()
            back = Workers(previous, db_url, world.worker_args, tmp_path, "back")
            rolled.append(back)
            back.start(2)
            await eventually(_settled(db_url, back), limit_seconds=150, every=0.2,
                             what="every operation settled after the rollback")
            # Both may not be up yet (the other one settled it all): a SIGTERM before a
            # worker's handlers are installed kills it (-15) instead of draining it.
            await eventually(lambda: len(back.lines(STARTED)) == 2, limit_seconds=60,
                             every=0.05, what="both rolled-back workers started")
            assert await asyncio.to_thread(back.stop) == [0, 0]

            machines, histories = await _evidence(db_url)
            assert all(m["phase"] == "Succeeded" for m in machines), \
                _why_not(machines, histories)
            assert [m["kind"] for m in machines].count("drain") == 2
            assert await check_invariants(machines, histories, world, deleted, cfg) == []
            drain = histories[drain_back]
            assert drain[1]["recorded_at"] < rolled_back_at < drain[-1]["recorded_at"]
            assert any(e["worker_id"].startswith("back-") and e["recorded_at"] > rolled_back_at
                       for e in histories[drain_back])
            assert back.lines(CRASH) == []
            # The previous release reads the whole history, what this tree wrote included.
            await _replay_verify(previous, db_url)
            print(json.dumps({"seconds": round(time.monotonic() - started, 1),
                              "upgrade_after_s": round(upgrade_at - started, 1),
                              "upgraded_and_settled_s": round(upgraded_in, 1),
                              "operations": len(machines),
                              "old_events_after_upgrade": len(old_after),
                              "in_flight_at_upgrade": len(in_flight)}))
        finally:
            for workers in (old, new, *rolled):
                await asyncio.to_thread(workers.stop)


def test_the_downgrade_this_test_runs_is_the_one_the_install_guide_gives() -> None:
    guide = [line.strip() for line in (ROOT / "docs" / "install.md").read_text().splitlines()]
    ours = [line.strip() for line in DOWNGRADE.splitlines()]
    ours[0] = "REVISION=0011 python -c '" + ours[0]
    ours[-1] += "'"
    assert any(guide[i:i + len(ours)] == ours for i in range(len(guide))), \
        "docs/install.md's downgrade snippet differs from tests/upgrade's DOWNGRADE"
