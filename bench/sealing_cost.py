"""What sealing costs a real migration: the agent's path, plain against sealed, same run.

``python -m bench.sealing_cost --sizes 1,64,512 --runs 3`` (``make bench-sealing``; needs
``scripts/ensure-criu`` and Debian's ``docker-registry``). For each size a counter
(:mod:`drivers.podman.workload`) that touched that many MiB runs on node A and is
migrated to node B through Debian's ``docker-registry`` on loopback, exactly along the
node agent's path (:class:`~drivers.agent.criu.CriuDumper` capture, push, source removed,
pull, restore), alternately:

- **plain**: the archive pushed as it is, the manifest unsigned;
- **sealed**: the agent's :class:`~drivers.agent.sealing.Sealing` — the archive encrypted
  for one EC P-256 recipient (ocicrypt's AES-256-CTR + HMAC-SHA256, the key wrapped as
  JWE) and the plain copy removed, the manifest signed before it is tagged; on B the
  signature verified before any pull and each layer unsealed as it arrives.

Steps: capture, seal (sealed only), push (signing included), pull (verifying and
unsealing included), restore; **downtime** is what the process saw (the longest pause
in the restored counter's log, tick interval 50 ms). Every figure is the median of
``--runs`` runs, with min and max; the rows print as they finish and the JSON goes to
``bench/results/sealing_cost.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import write_results
from bench.criu_migration import (
    INTERVAL_MS,
    _downtime,
    _nodes,
    _pod,
    _start_counter,
    _ticks,
    _timed,
    _until,
)
from controlplane.clock import SystemClock
from drivers.agent.criu import CriuDumper
from drivers.agent.dumper import DumpRequest, RestoreRequest
from drivers.agent.sealing import Seal, Sealing, SealingSettings
from drivers.podman.podman import PodmanNode, container_name
from drivers.podman.workload import build_image, ticked_since
from drivers.registry.artifact import Provenance
from drivers.registry.checkpoints import pull_checkpoint, push_checkpoint
from drivers.registry.options import registry_from_options
from drivers.sealing.keys import generate_keypair
from tests.registry.servers import run_registry

STEPS = ("capture", "seal", "push", "pull", "restore")


async def migrate(a: PodmanNode, b: PodmanNode, registry_host: str, image: str, mib: int,
                  work: Path, *, name: str, sealing: Sealing | None,
                  seal: Seal | None) -> dict[str, float]:
    source, target = _pod(name, "node-a", image), _pod(f"{name}-r", "node-b", image)
    source_name = container_name("bench", name, source.uid, "main")
    target_name = container_name("bench", target.name, target.uid, "main")
    await _start_counter(a, source_name, image, mib)
    registry = registry_from_options(layout=None)
    repo = f"{registry_host}/checkpoints"
    times: dict[str, float] = {"seal": 0.0}
    try:
        dumped = await _timed(times, "capture", CriuDumper(a).dump(DumpRequest(
            name, source, source.containers, quiesce=False, saver="", workdir=work)))
        prov = Provenance(checkpoint_id=name, source_uid=source.uid, node="node-a",
                          namespace="bench", pod=name, format=dumped.format, dumper="criu",
                          created=SystemClock().now(), engine=dumped.engine)
        archives, sealed_for, sign = list(dumped.archives), [], None
        if sealing is not None and seal is not None:
            recipients = sealing.recipients(seal)
            archives = await _timed(times, "seal", sealing.seal_archives(archives,
                                                                          recipients))
            sealed_for = sealing.key_ids(recipients)

            async def sign(digest: str) -> None:
                await sealing.sign(registry, repo, digest)
        pushed = await _timed(times, "push", push_checkpoint(
            registry, repo, name, archives, prov, sealed_for=sealed_for, sign=sign))
        await a.remove(source_name)  # a migration deletes the source before restoring

        async def pull() -> Any:
            if sealing is None:
                return await pull_checkpoint(registry, repo, pushed.digest, work / "pulled")
            await sealing.verify(registry, repo, pushed.digest)
            return await pull_checkpoint(registry, repo, pushed.digest, work / "pulled",
                                         unseal=sealing.unsealer(""))
        pulled = await _timed(times, "pull", pull())
        await _timed(times, "restore", CriuDumper(b).restore(RestoreRequest(
            target, pushed.digest, pulled.artifact, pulled.files, loader="")))
        times["bytes"] = float(pushed.archive_bytes)
    finally:
        await registry.close()
        shutil.rmtree(work / "pulled", ignore_errors=True)
    restored = time.time()
    ticks = await _until(lambda: _ticks(b, target_name), lambda t: ticked_since(t, restored))
    times["downtime"] = _downtime(ticks)
    await b.remove(target_name)
    return times


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = [*STEPS, "total", "downtime", "bytes"]
    for r in runs:
        r["total"] = sum(r[s] for s in STEPS)
    return {k: {"median": statistics.median(r[k] for r in runs),
                "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
            for k in keys}


async def run(sizes: list[int], runs: int, folder: Path) -> dict[str, Any]:
    keys = folder / "keys"
    generate_keypair(keys / "signing.pem", keys / "signing.pub")
    generate_keypair(keys / "recipient.pem", keys / "recipient.pub")
    sealing = Sealing.load(SealingSettings(
        signing_key=keys / "signing.pem", trusted_keys=(keys / "signing.pub",),
        decryption_keys=(keys / "recipient.pem",)))
    seal = Seal((f"file:{keys / 'recipient.pub'}",), required=True)
    rows = []
    async with run_registry(folder / "registry") as registry, _nodes(folder) as (builder, a, b):
        image = await build_image(builder, registry.host, folder / "image")
        for mib in sizes:
            measured: dict[str, list[dict[str, float]]] = {"plain": [], "sealed": []}
            for attempt in range(runs):
                for mode in ("plain", "sealed"):  # alternate: drift hits both alike
                    work = folder / f"work-{mib}-{mode}-{attempt}"
                    work.mkdir(parents=True)
                    measured[mode].append(await migrate(
                        a, b, registry.host, image, mib, work, name=f"{mode}-{mib}-{attempt}",
                        sealing=sealing if mode == "sealed" else None,
                        seal=seal if mode == "sealed" else None))
                    shutil.rmtree(work, ignore_errors=True)
            plain, sealed = _summary(measured["plain"]), _summary(measured["sealed"])
            row = {"mib": mib, "runs": runs, "plain": plain, "sealed": sealed,
                   "added_downtime": (sealed["downtime"]["median"] /
                                      plain["downtime"]["median"] - 1)}
            rows.append(row)
            _print_row(row)
    return {"rows": rows, "interval_ms": INTERVAL_MS, "runs": runs}


def _print_row(row: dict[str, Any]) -> None:
    for mode in ("plain", "sealed"):
        r = row[mode]
        print(f"{row['mib']:>5} MiB  {mode:<6} " + "  ".join(
            f"{s} {r[s]['median']:6.2f}s" for s in STEPS)
            + f"  total {r['total']['median']:6.2f}s [{r['total']['min']:.2f}-"
            f"{r['total']['max']:.2f}]  downtime {r['downtime']['median']:6.2f}s "
            f"[{r['downtime']['min']:.2f}-{r['downtime']['max']:.2f}]", flush=True)
    print(f"{row['mib']:>5} MiB  sealing adds {row['added_downtime']:+.1%} downtime "
          f"(median of {row['runs']})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sealing_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,64,512",
                   help="MiB of memory the counter touches, comma-separated (default 1,64,512)")
    p.add_argument("--runs", type=int, default=3, help="runs per size and mode (default 3)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a new one under "
                   "$TMPDIR; needs about 4x the largest size free)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the results here (default bench/results/sealing_cost.json)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="bench-sealing-"))
    try:
        results = asyncio.run(run(sizes, max(1, args.runs), folder))
    finally:
        if args.workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    write_results("sealing_cost", results, args.json)


if __name__ == "__main__":
    main()
