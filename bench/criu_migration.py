"""Migrating a real container: the product's downtime over CRIU alone's, in the same run.

``python -m bench.criu_migration --sizes 1,64,512,2048 --runs 3`` (``make bench-criu``;
needs ``scripts/ensure-criu`` and Debian's ``docker-registry``). For each size a counter
(:mod:`drivers.podman.workload`) that touched that many MiB, and keeps rewriting
``--dirty-mib-per-s`` MiB of it every second (default 4; a tick's share each tick), moves
from node A to node B (a podman root each) along every path below, ``--runs`` times, the
paths in turn within each run so drift hits them alike:

- **CRIU alone** (the floor): ``podman container checkpoint --export --leave-running``,
  the archive handed over on local disk, ``restore --import`` on B. No registry, no
  packaging: what any migration of this process must at least pay.
- **product (MODE)**, one row per way in :data:`PRODUCT_MODES`: one migration through
  the whole product (``wiring.criu_world``: API server, runtime-backed nodes, criu agents,
  the worker, its own registry), a fresh world each run; its phases as
  ``report_migrations`` records them. ``stop-and-copy`` goes through the registry (push,
  then the source deleted, then pull and restore); ``stop-and-copy, streamed`` (class
  ``transfer: stream``) restores on B from A's agent's stream while the registry copy is
  pushed beside it, and deletes the source after; ``lazy`` (``spec.mode: lazy``)
  restores on B at once from A's dump without its memory and fetches the pages from A's
  page server on fault (``fs.pipe-max-size`` is raised for the run and put back).
- **ours**: the node agent's steps without the control loop —
  :class:`~drivers.agent.criu.CriuDumper` capture, ``push_checkpoint``, the source removed,
  ``pull_checkpoint`` on B, ``CriuDumper.restore``.
- **reference: podman by hand via a registry**: ``checkpoint --create-image
  --leave-running``, ``podman push``, ``podman pull`` on B, ``container restore IMAGE``.

**Downtime** is what the process saw: the longest pause between two consecutive ticks of
the restored counter's log (the last tick the checkpoint holds → the first after the
restore), ±one tick interval (50 ms on every path). **Total** is capture + push + pull +
restore for the hand-driven paths, submission → Succeeded (``report_operations``) for the
product. Every figure is the median of ``--runs`` runs with [min-max]; the headline is
the product's downtime over CRIU alone's, a ratio of the two medians. The JSON
(``bench/results/criu_migration.json``) keeps every run. ``bench.sealing_cost`` imports
the counter helpers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import shutil
import statistics
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
from controlplane.store.records import RecordedEvent
from controlplane.wiring.criu_world import RuntimeWorld, runtime_world
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
from tests.criu.pipe_limit import pipe_limit_raised
from tests.registry.servers import run_registry

INTERVAL_MS = 50
DIRTY_MIB_PER_S = 4
STEPS = ("capture", "push", "pull", "restore")
PHASES = tuple(p.removesuffix("_seconds") for p in reports.MIGRATION_PHASES)
#: The ways the product migration runs, a row each: another is one more entry here and in
#: :data:`PRODUCT_SPECS`.
PRODUCT_MODES: tuple[str, ...] = ("stop-and-copy", "stop-and-copy, streamed", "lazy")
#: What each way adds to the migration: its ``spec.mode`` ("": the default, sent as no
#: mode at all) and its class settings (``transfer: stream``: the target's agent restores
#: from the source agent's stream, the registry copy pushed beside it).
PRODUCT_SPECS: dict[str, tuple[str, JsonObject]] = {
    "stop-and-copy": ("", {}),
    "stop-and-copy, streamed": ("", {"transfer": "stream"}),
    "lazy": ("lazy", {}),
}
CRIU_ALONE, OURS, REFERENCE = "criu_alone", "ours", "reference"
LABELS = {CRIU_ALONE: "CRIU alone (local disk)",
          OURS: "ours (agent path, no control loop)",
          REFERENCE: "reference: podman by hand via a registry"}


def product_key(mode: str) -> str:
    return f"product:{mode}"


def _labels() -> dict[str, str]:
    """Every row's key and label, in the order the table prints them."""
    products = {product_key(m): f"product ({m})" for m in PRODUCT_MODES}
    return {CRIU_ALONE: LABELS[CRIU_ALONE], **products,
            OURS: LABELS[OURS], REFERENCE: LABELS[REFERENCE]}


def _pod(name: str, node: str, image: str) -> Workload:
    return Workload("bench", name, f"uid-{name}", node, (Container("main", image),))


async def _timed(into: dict[str, float], step: str, work: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await work
    into[step] = time.perf_counter() - started
    return result


async def _start_counter(node: PodmanNode, name: str, image: str, mib: int, *,
                         dirty_mib_per_s: int = 0) -> None:
    await node.pull(image)
    await node.start(name, image, command=command(mib, INTERVAL_MS,
                                                  dirty_mib_per_s=dirty_mib_per_s))
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


def _tick_seconds(ticks: list[Tick]) -> float:
    """The median time between ticks: above the interval when a tick's own work (dirtying
    its share, checking every page) takes long, so the rate it dirties at is lower."""
    gaps = [b.at - a.at for a, b in itertools.pairwise(ticks) if b.at > a.at]
    return statistics.median(gaps)


def _seen(times: dict[str, float], ticks: list[Tick], downtime: float) -> dict[str, float]:
    times["downtime"] = downtime
    times["tick_s"] = _tick_seconds(ticks)
    return times


async def criu_only(a: PodmanNode, b: PodmanNode, image: str, mib: int, dirty: int,
                    work: Path, tag: str) -> dict[str, float]:
    """The floor: CRIU's dump and restore through podman, the archive handed over on local
    disk (no registry, no packaging)."""
    name = f"local-{tag}"
    archive = work / f"{name}.tar"
    await _start_counter(a, name, image, mib, dirty_mib_per_s=dirty)
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
    await b.remove(f"{name}-restored")
    archive.unlink()
    return _seen(times, ticks, _downtime(ticks))


async def ours(a: PodmanNode, b: PodmanNode, registry_host: str, image: str, mib: int,
               dirty: int, work: Path, tag: str) -> dict[str, float]:
    name = f"ours-{tag}"
    source, target = _pod(name, "node-a", image), _pod(f"{name}-restored", "node-b", image)
    source_name = container_name("bench", name, source.uid, "main")
    target_name = container_name("bench", target.name, target.uid, "main")
    await _start_counter(a, source_name, image, mib, dirty_mib_per_s=dirty)
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
    await b.remove(target_name)
    return _seen(times, ticks, _downtime(ticks))


async def reference(a: PodmanNode, b: PodmanNode, registry_host: str, image: str, mib: int,
                    dirty: int, tag: str) -> dict[str, float]:
    """podman by hand through a registry (the source removed after: podman 4.3's image
    restore needs the source's run directory, see :mod:`drivers.podman.archive`)."""
    name = f"byhand-{tag}"
    image_ref = f"{registry_host}/byhand/{name}:1"
    await _start_counter(a, name, image, mib, dirty_mib_per_s=dirty)
    times: dict[str, float] = {}
    await _timed(times, "capture", a.run("container", "checkpoint", name, "--create-image",
                                         image_ref, "--leave-running"))
    await _timed(times, "push", a.run("push", "--quiet", "--tls-verify=false", image_ref))
    await _timed(times, "pull", b.run("pull", "--quiet", "--tls-verify=false", image_ref))
    await _timed(times, "restore", b.run("container", "restore", "--name", name, image_ref))
    size = (await a.run("image", "inspect", image_ref, "--format", "{{.Size}}")).strip()
    times["bytes"] = float(size or 0)
    source = await _ticks(a, name)
    await a.remove(name)
    # A checkpoint image holds no log: the restored log starts at N+1, the source's has N.
    ticks = await _until(lambda: _ticks(b, name), lambda t: len(t) >= 3)
    first = ticks[0]
    [last] = [t for t in source if t.count == first.count - 1]
    if [t.count for t in ticks] != list(range(first.count, first.count + len(ticks))):
        raise AssertionError(f"the restored counter lost its state: {ticks[:5]}")
    await b.remove(name)
    for node in (a, b):  # a checkpoint image per node per run: gigabytes at the top size
        await node.run("image", "rm", "--force", image_ref)
    return _seen(times, ticks, first.at - last.at)


async def product_migration(root: Path, mib: int, dirty: int,
                            mode: str) -> dict[str, float]:
    """One migration in ``mode`` through the whole product (``wiring.criu_world``): the
    downtime the process saw, the phases ``report_migrations`` records and the
    submission-to-finish time ``report_operations`` records."""
    db = open_database(f"sqlite:///{root / 'cp.db'}")
    await migrate.upgrade(db)
    clock = SystemClock()
    try:
        async with runtime_world(db, root, clock, nodes=("node-1", "node-2")) as world:
            # Not world.create_counter: it ticks every 100 ms, and the product's downtime
            # must be read at the same resolution as the floor's it is divided by.
            world.cluster.create_pod("default", "app", node="node-1", image=world.image,
                                     command=command(mib, INTERVAL_MS,
                                                     dirty_mib_per_s=dirty))
            pod = await _until_pod(world, lambda p: (p.get("status") or {}).get("phase")
                                   == "Running")
            await _until(lambda: world.ticks(pod), lambda t: len(t) >= 5)
            spec: JsonObject = {"pod": {"namespace": "default", "name": "app",
                                        "uid": pod["metadata"]["uid"]},
                                "source_node": "node-1", "target_node": "node-2",
                                "template": {"metadata": {"labels": {}},
                                             "spec": {"containers":
                                                      pod["spec"]["containers"]}},
                                "class": {"repository": world.repository("checkpoints/bench"),
                                          **PRODUCT_SPECS[mode][1]}}
            if PRODUCT_SPECS[mode][0]:
                spec["mode"] = PRODUCT_SPECS[mode][0]
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
            [(_, total)] = await reports.finished_durations(db)
            history = await queries.history(db, outcome.machine_id)
            if PRODUCT_SPECS[mode] == ("", {}):
                times = {p: float(phases[f"{p}_seconds"] or 0) for p in PHASES}
            else:  # report_migrations' phases follow the registry order: read the history
                times = _milestones(history)
            times["total"] = total
            times["bytes"] = float(phases.get("size_bytes") or 0)
            if not times["bytes"]:  # lazy: no artifact; the pages the target fetched
                moved_pages = [e.data for e in history if e.type == "PagesTransferred"]
                sizes = [d.get("bytes") for d in moved_pages]
                times["bytes"] = float(sum(b for b in sizes if isinstance(b, int)))
            return _seen(times, ticks, _downtime(ticks))
    finally:
        await db.dispose()


#: The events a streamed or lazy migration is timed by, each as seconds after ``Started``.
MILESTONES = {"RestoreVerified": "target_verified", "ArtifactVerified": "artifact_verified",
              "PagesTransferred": "pages_in", "SourceDeleted": "source_deleted"}


def _milestones(history: list[RecordedEvent]) -> dict[str, float]:
    """Seconds from ``Started`` to each milestone the history has (``report_migrations``
    measures the registry order, where the restore follows the source's deletion)."""
    start = next(e.recorded_at for e in history if e.type == "Started")
    return {MILESTONES[e.type]: (e.recorded_at - start).total_seconds() for e in history
            if e.type in MILESTONES}


async def _until_pod(world: RuntimeWorld,
                     ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for pod in world.cluster.store.peek("pods"):
            if ok(pod):
                return dict(pod)
        await asyncio.sleep(0.05)
    raise TimeoutError("no such pod")


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


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {k: {"median": statistics.median(r[k] for r in runs),
                "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
            for k in runs[0]}


def _row(mib: int, measured: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    for key in (CRIU_ALONE, OURS, REFERENCE):
        for r in measured[key]:
            r["total"] = sum(r[s] for s in STEPS)
    paths: dict[str, dict[str, Any]] = {
        key: {"label": label, "runs": measured[key], "summary": _summary(measured[key])}
        for key, label in _labels().items()}
    floor = paths[CRIU_ALONE]["summary"]["downtime"]["median"]
    over = {key: p["summary"]["downtime"]["median"] / floor
            for key, p in paths.items() if key != CRIU_ALONE}
    return {"mib": mib, "paths": paths, "downtime_over_criu_alone": over,
            "headline": {product_key(m): over[product_key(m)] for m in PRODUCT_MODES}}


async def run(sizes: list[int], runs: int, dirty: int, folder: Path) -> dict[str, Any]:
    with pipe_limit_raised():  # CRIU's lazy page server needs a 4 MiB pipe
        return await _run(sizes, runs, dirty, folder)


async def _run(sizes: list[int], runs: int, dirty: int, folder: Path) -> dict[str, Any]:
    rows = []
    async with run_registry(folder / "registry") as registry, _nodes(folder) as (builder, a, b):
        image = await build_image(builder, registry.host, folder / "image")
        for mib in sizes:
            measured: dict[str, list[dict[str, float]]] = {key: [] for key in _labels()}
            for attempt in range(runs):
                tag, work = f"{mib}-{attempt}", folder / f"work-{mib}-{attempt}"
                work.mkdir(parents=True)
                measured[CRIU_ALONE].append(await criu_only(a, b, image, mib, dirty, work,
                                                            tag))
                for mode in PRODUCT_MODES:
                    root = folder / f"product-{tag}-{mode.replace(', ', '-')}"
                    measured[product_key(mode)].append(
                        await product_migration(root, mib, dirty, mode))
                    shutil.rmtree(root, ignore_errors=True)
                measured[OURS].append(await ours(a, b, registry.host, image, mib, dirty,
                                                 work, tag))
                measured[REFERENCE].append(await reference(a, b, registry.host, image, mib,
                                                           dirty, tag))
                shutil.rmtree(work, ignore_errors=True)
            rows.append(_row(mib, measured))
            _print_row(rows[-1], runs, dirty)
    return {"rows": rows, "runs": runs, "interval_ms": INTERVAL_MS, "dirty_mib_per_s": dirty,
            "product_modes": list(PRODUCT_MODES),
            "headline": "product downtime / CRIU alone downtime: ratio of the medians"}


def _figure(s: dict[str, float]) -> str:
    return f"{s['median']:6.2f} [{s['min']:.2f}-{s['max']:.2f}]"


def _print_row(row: dict[str, Any], runs: int, dirty: int) -> None:
    mib = row["mib"]
    print(f"\n{mib} MiB touched, dirtied at {dirty} MiB/s, ticks every {INTERVAL_MS} ms; "
          f"seconds, median [min-max] of {runs} run(s)", flush=True)
    print(f"  {'path':<42} {'downtime':<22} {'x floor':>7}  {'total':<22} {'size MiB':>8}  "
          "steps (medians)")
    for key, p in row["paths"].items():
        s = p["summary"]
        steps = (PHASES if key == product_key("stop-and-copy") else
                 [m for m in MILESTONES.values() if m in s] if key.startswith("product:")
                 else STEPS)
        ratio = row["downtime_over_criu_alone"].get(key, 1.0)
        print(f"  {p['label']:<42} {_figure(s['downtime']):<22} {ratio:7.2f}  "
              f"{_figure(s['total']):<22} {s['bytes']['median'] / 2**20:8.1f}  "
              + " ".join(f"{k} {s[k]['median']:.2f}" for k in steps), flush=True)
    tick = row["paths"][CRIU_ALONE]["summary"]["tick_s"]["median"]
    print(f"  ticks came every {tick * 1000:.0f} ms (median, CRIU alone's): about "
          f"{dirty * INTERVAL_MS / 1000 / tick:.1f} MiB/s dirtied", flush=True)
    for key, ratio in row["headline"].items():
        print(f"  HEADLINE {mib} MiB: {row['paths'][key]['label']} / CRIU alone downtime = "
              f"{ratio:.2f}x (ratio of medians)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.criu_migration", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,64,512,2048",
                   help="MiB of memory the counter touches, comma-separated (default "
                        "1,64,512,2048)")
    p.add_argument("--runs", type=int, default=3,
                   help="runs per size and path; figures are their median (default 3)")
    p.add_argument("--dirty-mib-per-s", type=int, default=DIRTY_MIB_PER_S,
                   help=f"MiB the counter rewrites every second while it runs, on every "
                        f"path (default {DIRTY_MIB_PER_S})")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a new one "
                   "under $TMPDIR; needs about 6x the largest size free)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the results here (default bench/results/criu_migration.json)")
    args = p.parse_args()
    if args.runs < 1:
        p.error(f"--runs must be at least 1 (got {args.runs}): every figure is a median")
    if args.dirty_mib_per_s < 0:
        p.error(f"--dirty-mib-per-s must be 0 or more (got {args.dirty_mib_per_s})")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="bench-criu-"))
    try:
        results = asyncio.run(run(sizes, args.runs, args.dirty_mib_per_s, folder))
    finally:
        if args.workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    write_results("criu_migration", results, args.json)


if __name__ == "__main__":
    main()
