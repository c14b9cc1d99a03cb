"""The soak's rolling upgrade: a campaign that starts on the previous release and ends on this tree.

:class:`UpgradingCampaign` is :class:`~tests.reliability.campaign.Campaign` with the
procedure of docs/install.md ("Upgrading") in its middle, kills and faults going on
throughout:

1. the previous release (``CHANGELOG.md``; checked out by
   :mod:`tests.upgrade.previous_release`) migrates its schema to its own head with its own
   ``cpctl db upgrade``, and its workers are the campaign's first fleet;
2. once ``upgrade_at`` of the migrations have finished, this tree's ``cpctl db upgrade``
   runs while those workers work (a restarted old worker now exits 3 on the schema, as
   an old replica waits in ``Init``: it stays down);
3. this tree's workers start beside the old ones;
4. the old ones are stopped (SIGTERM) and the chaos task kills this tree's from then on.

Its own checks, beside the campaign's: the schema upgrade exits 0 and reaches this tree's
head; every old worker stopped by SIGTERM exits 0; every machine an old worker left to a
newer one (``machine left to a newer worker``) or could not step (``machine step
crashed``) was finished by this tree's workers. It adds figures: when the upgrade ran,
how long each step took, and the outcomes before, across and after it.

Used by ``python -m tests.reliability.campaign --upgrade-from previous`` (the soak's
default, ``make soak``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from controlplane.store.database import Database
from controlplane.store.migrate import head_revision
from tests.reliability.campaign import (
    ROOT,
    STARTED,
    Campaign,
    CampaignConfig,
    Disturber,
    Fleet,
    Poller,
    World,
)
from tests.support.waiting import eventually
from tests.upgrade.previous_release import (
    Release,
    check_out,
    environment,
    imported_from,
    releases,
)

OLD = "old-"  # the prefix of the previous release's worker ids (and log files)
LEFT, CRASH = "machine left to a newer worker", "machine step crashed"
REFUSED = "is at schema"  # SchemaNotReady's message: a worker whose code is behind


@dataclass
class UpgradeFigures:
    """What the upgrade step measured (seconds from the campaign's start)."""

    release: str = ""
    commit: str = ""
    from_revision: str = ""
    to_revision: str = ""
    at_seconds: float = 0.0
    trigger: str = ""  # "count": upgrade_at of the migrations had ended; "time": of the cap
    finished_before: int = 0  # migrations finished when the schema upgrade started
    in_flight: int = 0  # operations not terminal then
    schema_upgrade_seconds: float = 0.0  # this tree's `cpctl db upgrade`, start to exit
    db_current_seconds: float = 0.0  # `cpctl db current` just after: start-up and connect
    new_workers_up_seconds: float = 0.0  # from the schema's commit to all three logging in
    old_stop_seconds: float = 0.0  # SIGTERM to the last old worker's exit
    old_exit_codes: dict[int, int] = field(default_factory=dict)
    old_alive_at_stop: int = 0  # the others were killed after the schema moved: refused
    old_stopped_starting: int = 0  # SIGTERM met a restarted one before it logged in (-15)
    refused_restarts: int = 0  # old workers restarted by chaos after the schema moved
    switched_at_seconds: float = 0.0
    error: str = ""


def _release_of(worker_id: str) -> str | None:
    """"old" or "new" for a fleet's worker (``[old-]w<slot>g<generation>``), else None."""
    name = worker_id.removeprefix(OLD)
    if not re.fullmatch(r"w\d+g\d+", name):
        return None
    return "old" if name != worker_id else "new"


def pick(which: str) -> tuple[Release, Release]:
    """(this tree's release, the one to upgrade from): ``previous`` or a version."""
    listed = releases()
    current = listed[0]
    if which == "previous":
        return current, listed[1]
    found = [r for r in listed if r.version == which and r.commit]
    if not found:
        raise SystemExit(f"--upgrade-from {which}: CHANGELOG.md lists "
                         f"{', '.join(r.version for r in listed if r.commit)}")
    return current, found[0]


def _cpctl(tree: Path, db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", db_url, *args],
                          cwd=tree, env=environment(tree), capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL, check=False)


class UpgradingCampaign(Campaign):
    def __init__(self, cfg: CampaignConfig, workdir: Path,
                 disturbers: Sequence[Disturber] = (),
                 database_up: asyncio.Event | None = None) -> None:
        super().__init__(cfg, workdir, disturbers, database_up)
        assert cfg.upgrade_from is not None
        self.current, self.release = pick(cfg.upgrade_from)
        self.tree = workdir / f"release-{self.release.version}"
        self.figures = UpgradeFigures(release=self.release.version,
                                      commit=self.release.commit or "")
        self.t0 = time.monotonic()
        self.t_upgrade: float | None = None  # when the schema upgrade started
        self.t_switch: float | None = None  # when the old workers had stopped

    def _since(self, t: float) -> float:
        return round(t - self.t0, 1)

    async def prepare_schema(self, db: Database, db_url: str) -> None:
        """The previous release's tree, and its own ``cpctl db upgrade`` to its head."""
        self.t0 = time.monotonic()
        await asyncio.to_thread(check_out, self.release, self.tree)
        where = await asyncio.to_thread(imported_from, self.tree)
        assert all(path.startswith(str(self.tree)) for path in where.values()), where
        done = await asyncio.to_thread(_cpctl, self.tree, db_url, "db", "upgrade")
        assert done.returncode == 0, f"{self.release.version}'s db upgrade: {done.stderr}"
        self.figures.from_revision = await self._revision(db_url)
        assert self.figures.from_revision != head_revision(), \
            f"{self.release.version} is at this tree's head: there is nothing to upgrade"

    @staticmethod
    async def _revision(db_url: str) -> str:
        conn = await asyncpg.connect(db_url, timeout=10)
        try:
            return str(await conn.fetchval("SELECT version_num FROM alembic_version"))
        finally:
            await conn.close()

    def first_fleet(self, db_url: str, world: World) -> Fleet:
        return Fleet(db_url, self.workdir, world.worker_args, self.cfg.lease_seconds,
                     tree=self.tree, env=environment(self.tree), prefix=OLD)

    def steps(self, db_url: str, world: World,
              stop: asyncio.Event) -> list[Coroutine[Any, Any, None]]:
        return [self.upgrade(db_url, world, stop)]

    async def upgrade(self, db_url: str, world: World, stop: asyncio.Event) -> None:
        """docs/install.md's steps 2-4, once ``upgrade_at`` of the migrations finished."""
        f = self.figures
        while not stop.is_set():
            trigger = self.cfg.share_reached(self.cfg.upgrade_at,
                                             sum(self.result.outcomes.values()),
                                             time.monotonic() - self.started)
            if trigger:
                f.trigger = trigger
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await stop.wait()  # polls the campaign's progress
        if stop.is_set():
            f.error = "the campaign ended before the upgrade's turn"
            return
        if self.database_up is not None:
            await self.database_up.wait()
        self.t_upgrade = time.monotonic()
        f.at_seconds = self._since(self.t_upgrade)
        f.finished_before = sum(self.result.outcomes.values())
        pg = Poller(db_url)
        try:
            rows = await pg.fetch("SELECT count(*) AS n FROM machines WHERE NOT terminal")
        finally:
            await pg.close()
        f.in_flight = rows[0]["n"] if rows else -1
        # 2. This tree's schema upgrade while the old workers run (and are killed): from
        # its commit on, an old worker the chaos restarts exits 3 and stays down.
        old = self.fleets.current
        old.schema_ahead = True
        done = await asyncio.to_thread(_cpctl, ROOT, db_url, "db", "upgrade")
        upgraded = time.monotonic()
        f.schema_upgrade_seconds = round(upgraded - self.t_upgrade, 2)
        if done.returncode != 0:
            f.error = f"cpctl db upgrade exit {done.returncode}: {done.stderr[-500:]}"
            raise AssertionError(f.error)
        f.to_revision = await self._revision(db_url)
        probe = time.monotonic()
        await asyncio.to_thread(_cpctl, ROOT, db_url, "db", "current")
        f.db_current_seconds = round(time.monotonic() - probe, 2)
        assert f.to_revision == head_revision(), (f.to_revision, head_revision())
        # 3. This tree's workers beside the old ones (not killed until the old are gone).
        new = Fleet(db_url, self.workdir, old.args, self.cfg.lease_seconds)
        self.fleets.all.append(new)
        for slot in range(self.cfg.workers):
            new.start(slot)
        await eventually(lambda: all(new.started(slot) for slot in range(self.cfg.workers)),
                         limit_seconds=120, every=0.1,
                         what="this tree's workers started")
        f.new_workers_up_seconds = round(time.monotonic() - upgraded, 2)
        # 4. The old workers stop; the kills go on against the new ones.
        async with self.fleets.lock:
            old.retired = True
            refused = {slot for slot, proc in old.procs.items() if proc.poll() == 3}
            f.old_alive_at_stop = sum(proc.poll() is None for proc in old.procs.values())
            stopping = time.monotonic()
            f.old_exit_codes = await asyncio.to_thread(old.stop, 90)
            f.old_stop_seconds = round(time.monotonic() - stopping, 2)
            self.fleets.current = new
        self.t_switch = time.monotonic()
        f.switched_at_seconds = self._since(self.t_switch)
        f.refused_restarts = sum(REFUSED in log.read_text(errors="replace")
                                 for log in old.logs)
        # A worker the chaos had just restarted may meet SIGTERM while it still imports:
        # it dies of it (-15), holding nothing yet. One that had started must exit 0.
        starting = {slot for slot, code in f.old_exit_codes.items()
                    if code == -signal.SIGTERM
                    and STARTED not in old.current_log[slot].read_text(errors="replace")}
        f.old_stopped_starting = len(starting)
        bad = {slot: code for slot, code in f.old_exit_codes.items()
               if code != 0 and slot not in refused | starting}
        print("upgrade: " + json.dumps(asdict(f)), flush=True)
        if bad:
            self.result.violations.append(f"old workers did not stop cleanly on SIGTERM: {bad}")

    async def check(self, db_url: str, world: World) -> None:
        await super().check(db_url, world)
        pg = await asyncpg.connect(db_url, timeout=10)
        try:
            machines = {r["id"]: (r["kind"], r["phase"], r["terminal"]) for r in await pg.fetch(
                "SELECT id, kind, phase, terminal FROM machines")}
            events = await pg.fetch("SELECT machine_id, worker_id FROM events "
                                    "ORDER BY machine_id, seq")
        finally:
            await pg.close()
        deciders: dict[str, set[str]] = defaultdict(set)
        last: dict[str, str] = {}
        for e in events:
            release = _release_of(e["worker_id"])
            if release:  # not the operator's submission
                deciders[e["machine_id"]].add(release)
                last[e["machine_id"]] = e["worker_id"]
        lines = self.result.upgrade_lines
        f = self.figures
        lines += [
            f"upgrade from {f.release} ({f.commit}, schema {f.from_revision}) to "
            f"{self.current.version} (schema {f.to_revision or '-'}) at {f.at_seconds}s "
            f"(by {f.trigger}), "
            f"after {f.finished_before} migrations finished, {f.in_flight} operations in "
            f"flight" + (f"; ERROR {f.error}" if f.error else ""),
            f"  schema upgrade {f.schema_upgrade_seconds}s (cpctl db current just after: "
            f"{f.db_current_seconds}s); new workers up {f.new_workers_up_seconds}s after it",
            f"  old workers: {f.old_alive_at_stop} alive at the stop ({f.old_stopped_starting} "
            f"of them still starting), SIGTERM to exit {f.old_stop_seconds}s, exit codes "
            f"{sorted(f.old_exit_codes.values())}; restarts refused by the schema "
            f"{f.refused_restarts}; fleets switched at {f.switched_at_seconds}s"]
        # The outcomes before, across and after the upgrade, by when the campaign saw each
        # migration end and by whose workers recorded its events.
        when: dict[str, Counter[str]] = defaultdict(Counter)
        for mid, (ended, phase) in self.ended_at.items():
            if self.t_upgrade is None or ended < self.t_upgrade:
                when["ended before the schema upgrade"][phase] += 1
            elif self.t_switch is None or ended < self.t_switch:
                when["ended between it and the old workers' stop"][phase] += 1
            elif self.submitted_at[mid] < self.t_switch:
                when["submitted before the stop, ended after"][phase] += 1
            else:
                when["submitted after the old workers' stop"][phase] += 1
        by: dict[str, Counter[str]] = defaultdict(Counter)
        for mid, (kind, phase, _) in machines.items():
            who = " and ".join(sorted(deciders.get(mid, {"none"})))
            by[f"{kind}s decided by {who}"][phase] += 1
        for title, counts in (*when.items(), *sorted(by.items())):
            lines.append(f"{title}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        # Machines an old worker left or crashed on: each must be finished, by new workers.
        for what in (LEFT, CRASH):
            old_ids = self._machines_in_logs(what, old=True)
            new_ids = self._machines_in_logs(what, old=False)
            unfinished = sorted(m for m in old_ids if not machines.get(m, ("", "", False))[2])
            by_new = sum(1 for m in old_ids if not last.get(m, OLD).startswith(OLD))
            lines.append(f"'{what}': old workers {len(old_ids)} machines ({by_new} ended by "
                         f"new workers, {len(unfinished)} unfinished); new workers "
                         f"{len(new_ids)} machines")
            if unfinished:
                self.result.violations.append(f"machines an old worker logged '{what}' "
                                              f"for never ended: {unfinished[:10]}")
            if what == LEFT and by_new < len(old_ids):
                self.result.violations.append(
                    f"{len(old_ids) - by_new} machines left to a newer worker were last "
                    "decided by an old one")
        (self.workdir / "upgrade.json").write_text(json.dumps(
            {**asdict(self.figures), "outcomes": {k: dict(v) for k, v in when.items()},
             "by_release": {k: dict(v) for k, v in by.items()}}, indent=2))

    def _machines_in_logs(self, what: str, *, old: bool) -> set[str]:
        ids: set[str] = set()
        for fleet in self.fleets.all:
            if (fleet.prefix == OLD) != old:
                continue
            for log in fleet.logs:
                for line in log.read_text(errors="replace").splitlines():
                    if what in line:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            ids.add(str(json.loads(line)["machine_id"]))
        return ids
