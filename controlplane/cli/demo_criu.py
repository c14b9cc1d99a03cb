"""``cpctl demo --runtime criu``: a real process migrated and suspended/resumed with CRIU.

The world is ``wiring.criu_world``: the simulated API server, emulated nodes running real
containers (podman + runc, a storage root each), Debian's ``docker-registry`` on
loopback, a ``criu`` node agent per node, and the product. The workload is a counter
holding its count and touched pages only in memory. The demo migrates one counter
node-1 -> node-2 and suspends another and resumes it on node-2, and each time shows, from
the process's own log, the count the checkpoint held, that it went on at that count + 1
(not 1, no gap) and the freeze-to-running downtime it saw; then the same history,
reports and replay as the plain demo. Exits non-zero if any of that does not hold.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from controlplane.cli.context import clock
from controlplane.cli.demo import NS, Demo, _fresh_directory, _replay, say
from controlplane.store import migrate
from controlplane.store.database import open_database

MIB = {"app": 64, "sandbox": 16}


async def criu_demo(args: argparse.Namespace) -> int:
    from controlplane.wiring.criu_world import runtime_world  # the drivers, only for the demo

    started = time.monotonic()
    root = Path.cwd() / args.workdir
    _fresh_directory(root)
    db = open_database(f"sqlite:///{root / 'controlplane.db'}")
    try:
        await migrate.upgrade(db)
        say(f"real runtime: SQLite {root / 'controlplane.db'}, emulated nodes running real "
            f"containers (podman + runc + CRIU) under {root / 'nodes'}, docker-registry on "
            "loopback, a criu node agent per node; building the counter image")
        async with runtime_world(db, root, clock) as world:
            say(f"image {world.image} built and pushed")
            await CriuDemo(db, world, started).run()
        ok = await _replay(db)
    finally:
        await db.dispose()
    say(f"done in {time.monotonic() - started:.1f}s")
    return 0 if ok else 5


class CriuDemo(Demo):
    """The demo's steps on real containers."""

    async def run(self) -> None:
        cluster = self.world.cluster
        for name, node in (("app", "node-1"), ("sandbox", "node-3")):
            self.world.create_counter(NS, name, node, MIB[name])
        for name in ("app", "sandbox"):
            await cluster.wait_for(lambda n=name: self._phase(n) == "Running",
                                   what=f"{NS}/{name} running", limit_seconds=120)
        say(f"counters app (node-1, {MIB['app']} MiB touched) and sandbox (node-3, "
            f"{MIB['sandbox']} MiB) run as real containers; their counts live only in memory")
        before = {name: await self._ticking(self._pod(name)) for name in ("app", "sandbox")}

        mig, moved = await self.migrate_app()
        await self._went_on(moved, before["app"], f"app now runs on node-2 as "
                            f"{moved['metadata']['name']}")

        template = self._template("sandbox")
        sus = await self.submit("suspend", {"pod": self._ref("sandbox"),
                                            "template": template, "class": self.klass})
        record = await self.follow(sus, "suspend sandbox")
        self.expect(record.phase == "Suspended", f"suspend ended {record.phase}")
        # Suspended means the delete is issued; the node still stops the container.
        await cluster.wait_for(lambda: cluster.pod(NS, "sandbox") is None,
                               what=f"{NS}/sandbox deleted", limit_seconds=60)
        res = await self.submit("resume", {
            "namespace": NS, "name": "sandbox", "node": "node-2", "template": template,
            "candidates": [await self._candidate(sus)], "class": self.klass})
        record = await self.follow(res, "resume sandbox on node-2")
        self.expect(record.phase == "Resumed", f"resume ended {record.phase}")
        await self._went_on(self._restored("sandbox"), before["sandbox"],
                            "sandbox resumed on node-2")
        await self.report(mig, checkpoints=2)

    async def _ticking(self, pod: dict[str, Any]) -> int:
        ticks = await self._wait_ticks(pod, 5)
        return len(ticks)

    async def _wait_ticks(self, pod: dict[str, Any], at_least: int) -> list[Any]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ticks: list[Any] = await self.world.ticks(pod)
            if len(ticks) >= at_least:
                return ticks
            await asyncio.sleep(0.1)
        self.expect(False, f"{pod['metadata']['name']} did not tick {at_least} times")
        return []

    async def _went_on(self, pod: dict[str, Any], seen: int, what: str) -> None:
        # The restored log starts with the archived one, which may be long already: wait
        # for ticks the restored process printed itself.
        since = clock.now().timestamp()
        deadline = time.monotonic() + 60
        ticks: list[Any] = []
        while time.monotonic() < deadline:
            ticks = await self.world.ticks(pod)
            if sum(1 for t in ticks if t.at > since) >= 3:
                break
            await asyncio.sleep(0.1)
        found = self.world.resumption(ticks)
        self.expect(found is not None and found.checkpointed >= seen,
                    f"{pod['metadata']['name']}'s log does not read as the checkpointed "
                    f"process going on: {[t.count for t in ticks][:40]}")
        say(f"{what}: its count was {found.checkpointed} at the checkpoint and went on at "
            f"{found.checkpointed + 1} (not 1, no gap), every page intact; "
            f"{found.downtime:.2f}s from its last tick before the checkpoint to its first "
            "after the restore")
