"""Migrating on real nodes (kubelet v1.36 + CRI-O 1.36): downtime and phases, beside the floor.

``python -m bench.realnode_downtime --sizes 1,64,512 --runs 3`` (``make bench-realnode``;
needs ``scripts/ensure-envtest``, ``ensure-criu`` and ``ensure-realnode`` evaluated).
It starts the product world of ``tests/realnode`` once (an envtest API server, two real
nodes ``node-a``/``node-b``, the loopback registry, the scheduler and controller manager,
our node agents with the kubelet dumper, a ``cpctl worker``: imported from the tests, as
``bench.criu_migration`` imports the registry the tests use), then for each size a
busybox shell that holds that many MiB in a variable (``head -c N /dev/zero | tr``; its
RSS checked in the container's memory cgroup) and ticks ``<count> <token>`` every 50 ms
is moved from ``node-a`` to ``node-b``, ``--runs`` times each way, the two ways in turn:

- **product**: ``cpctl migrate NS/POD --to node-b --wait``; its phases from ``cpctl
  history ID -o json`` (the times the events were recorded): queued (submitted → capture
  requested), capture (→ artifact verified: the agent's freeze, the kubelet checkpoint,
  the image pushed, the registry read back), delete (→ source deleted), schedule
  (→ restore pod requested), restore (→ restore verified: scheduled, CRI-O pulls and
  restores, the agent resumes it);
- **floor**, by hand in the same world: the kubelet checkpoint API, the archive pushed as
  a checkpoint image (``push_checkpoint_image``), a pod on ``node-b`` (``spec.nodeName``,
  base image pre-pulled) with that image until ``Running``. It deletes nothing first and
  freezes nothing: the same steps typed by hand.

**Downtime** is what the process saw, read from the restored container's own log with
the runtime's timestamps (``/containerLogs?timestamps=true``; CRI-O puts the archived
log first): from the last tick the checkpoint holds (count n) to the restored process's
first tick (count n+1), within one tick's interval (50 ms asked; ~70 ms seen on a
loaded host: the shell forks ``sleep`` each time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bench.common import ROOT, write_results
from controlplane.machines.stages.capture import ArtifactVerified, CaptureRequested
from controlplane.machines.stages.restore import RestorePodRequested, RestoreVerified
from controlplane.machines.stages.source import SourceDeleted
from drivers.agent.stopper import container_cgroup
from tests.realnode.product import ProductWorld, open_product_world
from tests.support.waiting import wait_for

INTERVAL = "0.05"
MIB = 2**20
MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")  # this host: cgroup v1, memory on its own
#: (phase, the event that ends it); each phase starts where the one before ended, the
#: first at the operation's first event (its submission).
PRODUCT_PHASES = (("queued", CaptureRequested.NAME), ("capture", ArtifactVerified.NAME),
                  ("delete", SourceDeleted.NAME), ("schedule", RestorePodRequested.NAME),
                  ("restore", RestoreVerified.NAME))
FLOOR_PHASES = ("checkpoint", "push", "restore")


def memory_counter(mib: int) -> list[str]:
    """A shell holding ``mib`` MiB in a variable (every page written: ``a``s, not zeros),
    then printing ``<count> <token>`` every ``INTERVAL`` s, count and token only in its
    memory. busybox has no python; ``head | tr`` into ``$( )`` is the plain way, and the
    shell's RSS settles at the size (the cgroup reading below checks it)."""
    return ["/bin/sh", "-c", f"x=$(head -c {mib * MIB} /dev/zero | tr '\\0' a); "
            "echo filled ${#x}; t=$RANDOM$RANDOM; i=0; "
            f'while true; do i=$((i+1)); echo "$i $t"; sleep {INTERVAL}; done']


@dataclass(frozen=True)
class Tick:
    at: float  # epoch seconds, as the runtime logged the line
    count: int
    token: str


def timed_ticks(w: ProductWorld, pod: str, node: str) -> list[Tick]:
    body = w.real.kubelet(node, "GET", f"/containerLogs/{w.namespace}/{pod}/main"
                          "?timestamps=true").decode(errors="replace")
    out = []
    for line in body.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            stamp = datetime.fromisoformat(parts[0][:26].rstrip("Z") + "+00:00")
            out.append(Tick(stamp.timestamp(), int(parts[1]), parts[2]))
    return out


def resumption(log: list[Tick]) -> tuple[Tick, Tick, int]:
    """(the last tick the checkpoint holds, the restored process's first, how many lines
    the source printed after the dump: 0 when it was frozen) in a restored log.

    The log is the archived one, then the restored process's own lines: the restart is
    where the count goes back (the source ran on after the dump, so the archive has a few
    more lines), else the longest silence (a frozen source). Raises unless it reads as
    one life (one token) that went on once, with no gap."""
    if len({t.token for t in log}) != 1:
        raise AssertionError(f"more than one life in the restored log: {log[:3]}...")
    back = [i for i in range(1, len(log)) if log[i].count != log[i - 1].count + 1]
    if len(back) > 1:
        raise AssertionError(f"the count broke more than once: {[t.count for t in log]}")
    first = back[0] if back else max(range(1, len(log)),
                                     key=lambda i: log[i].at - log[i - 1].at)
    resumed = log[first]
    held = [i for i in range(first) if log[i].count == resumed.count - 1]
    if not held:
        raise AssertionError(f"resumed at {resumed.count}, which the archive does not "
                             f"lead to: {[t.count for t in log]}")
    counts = [t.count for t in log[first:]]
    if counts != list(range(resumed.count, resumed.count + len(counts))):
        raise AssertionError(f"repeat or gap after the restore: {counts}")
    return log[held[-1]], resumed, first - held[-1] - 1


def rss_bytes(w: ProductWorld, pod: str) -> int:
    """The container's anonymous memory (``total_rss`` of its memory cgroup)."""
    found = w.real.pod(pod)
    assert found is not None, pod
    [status] = found["status"]["containerStatuses"]
    cgroup = container_cgroup(status["containerID"], MEMORY_CGROUPS)
    assert cgroup is not None, f"no memory cgroup for {pod}"
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    return int(stat["total_rss"])


def start_counter(w: ProductWorld, name: str, mib: int) -> int:
    """The memory counter on ``node-a`` once it ticks; its RSS in bytes."""
    w.real.create_pod(name, "node-a", command=memory_counter(mib))
    w.real.wait_running(name, limit=120)
    # A 512 MiB fill takes ~25 s in busybox sh (it reads the pipe into $( ) slowly).
    wait_for(lambda: len(timed_ticks(w, name, "node-a")) >= 5, f"{name} ticking", 300)
    rss = rss_bytes(w, name)
    if rss < mib * MIB:
        raise AssertionError(f"{name} holds {rss} B, less than {mib} MiB")
    return rss


def restored_log(w: ProductWorld, name: str, node: str) -> list[Tick]:
    """The restored container's log once its process has ticked 10 times of its own."""
    def enough() -> list[Tick] | None:
        log = timed_ticks(w, name, node)
        try:
            _, resumed, _ = resumption(log)
        except (AssertionError, ValueError):
            return None
        return log if log[-1].count >= resumed.count + 10 else None
    return wait_for(enough, f"{name} counting on on {node}", 120)


def cpctl(w: ProductWorld, *args: str, cluster: bool = True) -> str:
    """A cpctl verb (our own call, not ``w.ok``: a 512 MiB migration may need more than
    its 180 s limit)."""
    extra = w.cluster_args() if cluster else []
    done = subprocess.run([sys.executable, "-m", "controlplane.cli.main", "--db", w.db,
                           *args, *extra], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise AssertionError(f"cpctl {' '.join(args)}: {done.stdout}{done.stderr}")
    return done.stdout


def product_phases(events: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's seconds from the history's recorded times (first occurrence of each
    event: a reissued capture counts from the first request)."""
    at: dict[str, float] = {}
    for e in events:
        at.setdefault(e["type"], datetime.fromisoformat(e["recorded_at"]).timestamp())
    start = datetime.fromisoformat(events[0]["recorded_at"]).timestamp()
    out, begin = {}, start
    for phase, ends in PRODUCT_PHASES:
        if ends not in at:
            raise AssertionError(f"no {ends} in the history: {sorted(at)}")
        out[phase] = at[ends] - begin
        begin = at[ends]
    out["submitted_to_verified"] = begin - start
    out["submitted_at"] = start
    verified = next(e for e in events if e["type"] == ArtifactVerified.NAME)
    out["artifact_bytes"] = float(verified["data"].get("size_bytes") or 0)
    return out


def product_run(w: ProductWorld, mib: int, run: int) -> dict[str, Any]:
    name = f"bench-p{mib}-{run}"
    rss = start_counter(w, name, mib)
    load = os.getloadavg()[0]
    startup = time.time()
    cpctl(w, "list", cluster=False)  # what a verb's start costs on this host now
    startup = time.time() - startup
    started = time.time()
    out = cpctl(w, "migrate", f"{w.namespace}/{name}", "--to", "node-b", "--repository",
                w.repository, "--wait", "--wait-seconds", "600")
    wall = time.time() - started
    if f"migrate {w.namespace}/{name}: Succeeded" not in out:
        raise AssertionError(out)
    operation = out.splitlines()[0].strip()
    events = json.loads(cpctl(w, "history", operation, "-o", "json", cluster=False))
    phases = product_phases(events)
    submitted = phases.pop("submitted_at")
    last, resumed, ran_on = resumption(restored_log(w, name, "node-b"))
    row = {"mib": mib, "run": run, "operation": operation, **phases,
           "cpctl_startup": startup, "cpctl_to_submitted": submitted - started,
           "cpctl_wall": wall, "load_1min": load, "downtime": resumed.at - last.at,
           "last_tick": last.count, "source_ran_on_lines": ran_on,
           "rss_source": rss, "rss_restored": rss_bytes(w, name),
           "events": [(e["type"], e["recorded_at"]) for e in events]}
    w.real.delete_pod(name)
    return row


def floor_run(w: ProductWorld, mib: int, run: int) -> dict[str, Any]:
    name, real = f"bench-f{mib}-{run}", w.real
    restored = f"{name}-r"
    rss = start_counter(w, name, mib)
    real.pull("node-b", real.image)  # CRI-O restores onto the base image; it never pulls it
    load = os.getloadavg()[0]
    t0 = time.time()
    archive = real.checkpoint(name, node="node-a")
    t1 = time.time()
    image = real.push_checkpoint_image(archive, repository="checkpoints/floor", tag=name)
    t2 = time.time()
    real.create_pod(restored, "node-b", image=image)
    real.wait_running(restored, limit=600)
    t3 = time.time()
    size = archive.stat().st_size
    archive.unlink()
    real.delete_pod(name)
    last, resumed, ran_on = resumption(restored_log(w, restored, "node-b"))
    row = {"mib": mib, "run": run, "checkpoint": t1 - t0, "push": t2 - t1,
           "restore": t3 - t2, "total": t3 - t0, "downtime": resumed.at - last.at,
           "load_1min": load, "last_tick": last.count, "source_ran_on_lines": ran_on,
           "archive_bytes": size, "rss_source": rss,
           "rss_restored": rss_bytes(w, restored)}
    real.delete_pod(restored)
    return row


def medians(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in keys}


PRODUCT_KEYS = (*(p for p, _ in PRODUCT_PHASES), "submitted_to_verified", "cpctl_startup",
                "cpctl_to_submitted", "cpctl_wall", "downtime")
FLOOR_KEYS = (*FLOOR_PHASES, "total", "downtime")


def print_size(mib: int, product: list[dict[str, Any]], floor: list[dict[str, Any]]) -> None:
    p, f = medians(product, PRODUCT_KEYS), medians(floor, FLOOR_KEYS)
    print(f"{mib:>4} MiB product (median of {len(product)}): " + "  ".join(
        f"{k} {p[k]:.2f}" for k in PRODUCT_KEYS), flush=True)
    print(f"{mib:>4} MiB floor   (median of {len(floor)}): " + "  ".join(
        f"{k} {f[k]:.2f}" for k in FLOOR_KEYS), flush=True)


def versions(w: ProductWorld) -> dict[str, str]:
    node = w.real.kube.request("GET", "/api/v1/nodes/node-a")
    info = node["status"]["nodeInfo"]
    criu = subprocess.run(["criu", "--version"], capture_output=True, text=True, timeout=30)
    return {"kubelet": info["kubeletVersion"], "runtime": info["containerRuntimeVersion"],
            "kernel_reported_by_node": info["kernelVersion"],
            "criu": criu.stdout.split("\n")[0].strip()}


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    return {"cores": os.cpu_count(), "kernel": platform.release(),
            "memory_mib": int(meminfo[1]) // 1024, "python": platform.python_version()}


def code() -> dict[str, Any]:
    """The commit measured, and the paths that differed from it (others work in the same
    checkout: the agents and the worker run what the tree held when the world started)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "controlplane", "drivers",
                               "tests/realnode", "tests/support").splitlines()}


@contextlib.contextmanager
def product_world(folder: Path) -> Iterator[ProductWorld]:
    try:
        with open_product_world(folder) as w:
            yield w
    except pytest.skip.Exception as exc:  # the world says how to enable real nodes
        raise SystemExit(f"bench.realnode_downtime: {exc}") from None


def run(sizes: list[int], runs: int, folder: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "code": code(),
                               "interval_s": float(INTERVAL), "runs": runs, "sizes": {}}
    started = time.time()
    with product_world(folder) as w:
        results["versions"] = versions(w)
        for mib in sizes:
            product, floor = [], []
            for i in range(runs):  # in turn, so both ways see the same host
                product.append(product_run(w, mib, i))
                floor.append(floor_run(w, mib, i))
                print(f"{mib:>4} MiB run {i}: product downtime {product[-1]['downtime']:.2f}"
                      f" s, floor downtime {floor[-1]['downtime']:.2f} s", flush=True)
            print_size(mib, product, floor)
            results["sizes"][str(mib)] = {
                "product": {"median": medians(product, PRODUCT_KEYS), "runs": product},
                "floor": {"median": medians(floor, FLOOR_KEYS), "runs": floor}}
    results["seconds"] = time.time() - started
    return results


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.realnode_downtime", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,64,512",
                   help="MiB the counter holds, comma-separated (default 1,64,512)")
    p.add_argument("--runs", type=int, default=3, help="runs per size and way (default 3)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a new one "
                   "under $TMPDIR; the registry and nodes keep ~2x runs x size per size)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the results here (default bench/results/realnode_downtime"
                        ".json)")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="bench-realnode-"))
    try:
        results = run(sizes, args.runs, folder)
    finally:
        if args.workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    write_results("realnode_downtime", results, args.json)


if __name__ == "__main__":
    main()
