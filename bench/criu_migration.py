"""Migrating a real container: where the time goes, against podman by hand (the floor).

``python -m bench.criu_migration --sizes 1,64,512`` (``make bench-criu``; needs
``scripts/ensure-criu`` and Debian's ``docker-registry``). For each size, a counter
(:mod:`drivers.podman.workload`) that touched that many MiB runs on node A (a podman
root of its own) and is migrated to node B (another root) twice, through Debian's
``docker-registry`` on loopback:

- **ours**: exactly the node agent's path — :class:`~drivers.agent.criu.CriuDumper`
  capture (CRIU checkpoint, ``--leave-running``, archive made portable),
  :func:`~drivers.registry.checkpoints.push_checkpoint` (the CRI-O checkpoint image),
  the source removed (as a migration deletes it), ``pull_checkpoint`` on B, and
  ``CriuDumper.restore``;
- **criu**: CRIU alone through podman (``checkpoint --export``, ``restore --import``
  on B, the archive on local disk): what no registry-backed migration can beat;
- **floor**: the same migration typed by hand — ``podman container checkpoint
  --create-image IMG --leave-running``, ``podman push``, ``podman pull`` on B, ``podman
  container restore IMG`` (the source removed after: podman 4.3's image restore needs the
  source's run directory, see :mod:`drivers.podman.archive`).

Each row gives capture, push, pull and restore seconds, the checkpoint size, and the
**downtime** as the process saw it: the longest pause between two consecutive ticks of
the restored log (the last tick the checkpoint holds → the first tick after the
restore; tick interval 50 ms, so ±0.05 s). ``overhead`` is ours over the floor's total.
The **product** row is one migration of the same counter through the whole product
(``wiring.criu_world``: the API server, runtime-backed nodes, criu agents, the worker):
its phases as ``report_migrations`` records them, and the downtime the process saw — what
the control loop (observe-decide-act rounds, source deletion, the restore pod) adds on
top of the agent's own steps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import write_results
from controlplane.app.operations import submit_operation
from controlplane.clock import SystemClock
from controlplane.engine.jsonvalue import JsonObject
from controlplane.machines.catalog import default_kinds
from controlplane.store import migrate, queries, reports
from controlplane.store.database import open_database
from controlplane.wiring.criu_world import runtime_world
from drivers.agent.criu import CriuDumper
from drivers.agent.dumper import Container, DumpRequest, RestoreRequest, Workload
from drivers.podman.podman import PodmanNode, container_name
from drivers.podman.workload import (
    Tick,
    build_image,
    command,
    parse_ticks,
    resumption,
    ticked_since,
)
from drivers.registry.artifact import Provenance
from drivers.registry.checkpoints import pull_checkpoint, push_checkpoint
from drivers.registry.options import registry_from_options
from tests.registry.servers import run_registry

INTERVAL_MS = 50
STEPS = ("capture", "push", "pull", "restore")


def _pod(name: str, node: str, image: str) -> Workload:
    return Workload("bench", name, f"uid-{name}", node, (Container("main", image),))


async def _timed(into: dict[str, float], step: str, work: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await work
    into[step] = time.perf_counter() - started
    return result


async def _start_counter(node: PodmanNode, name: str, image: str, mib: int) -> None:
    await node.pull(image)
    await node.start(name, image, command=command(mib, INTERVAL_MS))
    await _until(lambda: _ticks(node, name), lambda t: len(t) >= 5)


async def _ticks(node: PodmanNode, name: str) -> list[Tick]:
    return parse_ticks(await node.logs(name))


async def _until(read: Callable[[], Awaitable[list[Tick]]],
                 done: Callable[[list[Tick]], bool], limit: float = 120) -> list[Tick]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ticks = await read()
        if done(ticks):
            return ticks
        await asyncio.sleep(0.05)
    raise TimeoutError("the counter did not tick as expected")


def _downtime(ticks: list[Tick]) -> float:
    found = resumption(ticks)
    if found is None:
        raise AssertionError(f"the restored counter lost its state: {[t.count for t in ticks]}")
    return found.downtime


async def ours(a: PodmanNode, b: PodmanNode, registry_host: str, image: str, mib: int,
               work: Path) -> dict[str, float]:
    name = f"ours-{mib}"
    source, target = _pod(name, "node-a", image), _pod(f"{name}-restored", "node-b", image)
    source_name = container_name("bench", name, source.uid, "main")
    target_name = container_name("bench", target.name, target.uid, "main")
    await _start_counter(a, source_name, image, mib)
    registry = registry_from_options(layout=None)
    times: dict[str, float] = {}
    try:
        dumped = await _timed(times, "capture", CriuDumper(a).dump(DumpRequest(
            name, source, source.containers, quiesce=False, saver="", workdir=work)))
        prov = Provenance(checkpoint_id=name, source_uid=source.uid, node="node-a",
                          namespace="bench", pod=name, format=dumped.format, dumper="criu",
                          created=SystemClock().now(), engine=dumped.engine)
        repo = f"{registry_host}/checkpoints"
        pushed = await _timed(times, "push", push_checkpoint(registry, repo, name,
                                                             dumped.archives, prov))
        await a.remove(source_name)  # a migration deletes the source before restoring
        pulled = await _timed(times, "pull", pull_checkpoint(registry, repo, pushed.digest,
                                                             work / "pulled"))
        await _timed(times, "restore", CriuDumper(b).restore(RestoreRequest(
            target, pushed.digest, pulled.artifact, pulled.files, loader="")))
        times["bytes"] = float(pushed.archive_bytes)
    finally:
        await registry.close()
    restored = time.time()
    ticks = await _until(lambda: _ticks(b, target_name), lambda t: ticked_since(t, restored))
    times["downtime"] = _downtime(ticks)
    await b.remove(target_name)
    return times


async def floor(a: PodmanNode, b: PodmanNode, registry_host: str, image: str,
                mib: int) -> dict[str, float]:
    name = f"floor-{mib}"
    reference = f"{registry_host}/floor/{name}:1"
    await _start_counter(a, name, image, mib)
    times: dict[str, float] = {}
    await _timed(times, "capture", a.run("container", "checkpoint", name, "--create-image",
                                         reference, "--leave-running"))
    await _timed(times, "push", a.run("push", "--quiet", "--tls-verify=false", reference))
    await _timed(times, "pull", b.run("pull", "--quiet", "--tls-verify=false", reference))
    await _timed(times, "restore", b.run("container", "restore", "--name", name, reference))
    size = (await a.run("image", "inspect", reference, "--format", "{{.Size}}")).strip()
    times["bytes"] = float(size or 0)
    source = await _ticks(a, name)
    await a.remove(name)
    # A checkpoint image holds no log: the restored log starts at N+1, the source's has N.
    ticks = await _until(lambda: _ticks(b, name), lambda t: len(t) >= 3)
    first = ticks[0]
    [last] = [t for t in source if t.count == first.count - 1]
    if [t.count for t in ticks] != list(range(first.count, first.count + len(ticks))):
        raise AssertionError(f"the restored counter lost its state: {ticks[:5]}")
    times["downtime"] = first.at - last.at
    await b.remove(name)
    return times


async def criu_only(a: PodmanNode, b: PodmanNode, image: str, mib: int,
                    work: Path) -> dict[str, float]:
    """The irreducible part: CRIU's dump and restore through podman, the archive handed
    over on local disk (no registry, no packaging)."""
    name = f"local-{mib}"
    archive = work / f"{name}.tar"
    await _start_counter(a, name, image, mib)
    await b.pull(image)
    times: dict[str, float] = {"push": 0.0, "pull": 0.0}
    await _timed(times, "capture", a.run("container", "checkpoint", name, "--export",
                                         str(archive), "--compress", "none",
                                         "--leave-running"))
    # --name: a new container ID (runc's state under /run/runc is shared by every root).
    await _timed(times, "restore", b.run("container", "restore", "--import", str(archive),
                                         "--name", f"{name}-restored"))
    times["bytes"] = float(archive.stat().st_size)
    restored = time.time()
    await a.remove(name)
    ticks = await _until(lambda: _ticks(b, f"{name}-restored"),
                         lambda t: ticked_since(t, restored))
    times["downtime"] = _downtime(ticks)
    await b.remove(f"{name}-restored")
    archive.unlink()
    return times


async def product_migration(root: Path, mib: int) -> dict[str, float]:
    """One migration through the whole product (``wiring.criu_world``: API server, kubelet
    role with runtime nodes, criu agents, worker, registry): the downtime the process saw
    and the migration's phases as ``report_migrations`` records them."""
    db = open_database(f"sqlite:///{root / 'cp.db'}")
    await migrate.upgrade(db)
    clock = SystemClock()
    try:
        async with runtime_world(db, root, clock, nodes=("node-1", "node-2")) as world:
            world.create_counter("default", "app", "node-1", mib)
            pod = await _until_pod(world, lambda p: (p.get("status") or {}).get("phase")
                                   == "Running")
            await _until(lambda: world.ticks(pod), lambda t: len(t) >= 5)
            spec: JsonObject = {"pod": {"namespace": "default", "name": "app",
                            "uid": pod["metadata"]["uid"]},
                    "source_node": "node-1", "target_node": "node-2",
                    "template": {"metadata": {"labels": {}},
                                 "spec": {"containers": pod["spec"]["containers"]}},
                    "class": {"repository": world.repository("checkpoints/bench")}}
            outcome = await submit_operation(db, default_kinds(), world.submission_observer,
                                             kind="migration", spec=spec,
                                             machine_id=f"bench-{mib}", now=clock.now())
            world.worker.nudge()
            deadline = time.monotonic() + 600
            while not (await queries.get_machine(db, outcome.machine_id)).terminal:
                if time.monotonic() > deadline:
                    raise TimeoutError("the migration did not finish within 600 s")
                await asyncio.sleep(0.05)
            record = await queries.get_machine(db, outcome.machine_id)
            if record.phase != "Succeeded":
                raise AssertionError(f"the migration ended {record.phase}")
            finished = time.time()
            moved = await _until_pod(world, lambda p: p["spec"].get("nodeName") == "node-2")
            ticks = await _until(lambda: world.ticks(moved),
                                 lambda t: ticked_since(t, finished))
            [phases] = await reports.migration_phases(db)
            times = {p.removesuffix("_seconds"): float(phases[p] or 0)
                     for p in reports.MIGRATION_PHASES}
            times["downtime"] = _downtime(ticks)
            times["bytes"] = float(phases.get("size_bytes") or 0)
            return times
    finally:
        await db.dispose()


async def _until_pod(world: Any, ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for pod in world.cluster.store.peek("pods"):
            if ok(pod):
                return dict(pod)
        await asyncio.sleep(0.05)
    raise TimeoutError("no such pod")


def _total(row: dict[str, float]) -> float:
    return sum(row[s] for s in STEPS)


@contextlib.asynccontextmanager
async def _nodes(folder: Path) -> AsyncIterator[tuple[PodmanNode, PodmanNode, PodmanNode]]:
    nodes = (PodmanNode(folder / "builder"), PodmanNode(folder / "a"), PodmanNode(folder / "b"))
    try:
        yield nodes
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                await node.run("system", "reset", "--force")
            shutil.rmtree(node.runroot, ignore_errors=True)


async def run(sizes: list[int], folder: Path) -> dict[str, Any]:
    rows = []
    async with run_registry(folder / "registry") as registry, _nodes(folder) as (builder, a, b):
        image = await build_image(builder, registry.host, folder / "image")
        for mib in sizes:
            work = folder / f"work-{mib}"
            work.mkdir(parents=True, exist_ok=True)
            mine = await ours(a, b, registry.host, image, mib, work)
            base = await floor(a, b, registry.host, image, mib)
            local = await criu_only(a, b, image, mib, work)
            shutil.rmtree(work, ignore_errors=True)
            whole = await product_migration(folder / f"product-{mib}", mib)
            rows.append({"mib": mib, "ours": mine, "floor": base, "criu": local,
                         "product": whole, "overhead": _total(mine) / _total(base) - 1})
            _print_row(rows[-1])
    return {"rows": rows, "interval_ms": INTERVAL_MS}


def _print_row(row: dict[str, Any]) -> None:
    for who in ("ours", "floor", "criu"):
        r = row[who]
        print(f"{row['mib']:>5} MiB  {who:<5}  " + "  ".join(f"{s} {r[s]:6.2f}s" for s in STEPS)
              + f"  total {_total(r):6.2f}s  downtime {r['downtime']:6.2f}s"
              f"  size {r['bytes'] / 2**20:7.1f} MiB", flush=True)
    p = row["product"]
    print(f"{row['mib']:>5} MiB  product: migration phases " + "  ".join(
        f"{k} {p[k]:.2f}s" for k in ("queued", "checkpoint", "delete", "restore", "gc"))
        + f"  downtime {p['downtime']:.2f}s", flush=True)
    print(f"{row['mib']:>5} MiB  overhead of ours over the floor: {row['overhead']:+.1%}",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.criu_migration", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,64,512",
                   help="MiB of memory the counter touches, comma-separated (default "
                        "1,64,512)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a new one "
                   "under $TMPDIR; needs about 4x the largest size free)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the results here (default bench/results/criu_migration.json)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="bench-criu-"))
    try:
        results = asyncio.run(run(sizes, folder))
    finally:
        if args.workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    write_results("criu_migration", results, args.json)


if __name__ == "__main__":
    main()
