"""The workload image for real checkpoints: a counter whose state lives only in memory.

``counter MIB INTERVAL_MS [SEED [DIRTY_MIB_PER_S]]`` allocates ``MIB`` MiB, writes every page
of it, then ticks forever: each tick rewrites the next ``DIRTY_MIB_PER_S * INTERVAL_MS /
1000`` MiB of it (the same pattern again, cycling through the memory: the process keeps
dirtying pages at a steady, stated rate, as a live workload does, so a checkpoint is never
of idle memory), adds one to a counter held in memory and prints
``<count> <unix time with ns> <ok|corrupt>`` (``corrupt`` when a page lost its pattern).
Nothing is on disk, so after a restore the count continues at the checkpointed value +
1 only if CRIU carried the process's memory across, and the page check says the touched
memory came with it. The printed clock gives the freeze-to-running downtime as the
process saw it (:func:`downtime_seconds`).

:func:`build_image` compiles it statically (the machine's gcc and libc), puts it beside
Debian's ``busybox-static`` in a root filesystem, imports that as an image and pushes it
to a registry: no external registry is involved. Used by the tests, ``cpctl demo
--runtime criu`` and ``bench/criu_migration.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.podman.podman import PodmanNode, RuntimeFailed, container_name

BUSYBOX = Path("/bin/busybox")
IMAGE_NAME = "workloads/counter"
IMAGE_TAG = "v1"

COUNTER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    long mib = argc > 1 ? atol(argv[1]) : 0;
    long ms = argc > 2 ? atol(argv[2]) : 100;
    int seed = argc > 3 ? atoi(argv[3]) & 0xff : 0;
    long dirty = argc > 4 ? atol(argv[4]) : 0;
    size_t size = (size_t)mib << 20;
    size_t per_tick = (size_t)((dirty << 20) / 1000 * ms) & ~(size_t)4095, next = 0;
    unsigned char *mem = size ? malloc(size) : NULL;
    if (size && !mem) { fprintf(stderr, "cannot allocate %ld MiB\n", mib); return 1; }
    for (size_t i = 0; i < size; i += 4096) memset(mem + i, (int)(((i >> 12) & 0xff) ^ seed), 4096);
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L}, now;
    unsigned long count = 0;
    for (;;) {
        for (size_t done = 0; size && done < per_tick; done += 4096, next = (next + 4096) % size)
            memset(mem + next, (int)(((next >> 12) & 0xff) ^ seed), 4096);
        int ok = 1;
        for (size_t i = 0; i < size; i += 4096)
            if (mem[i] != (unsigned char)(((i >> 12) & 0xff) ^ seed)) { ok = 0; break; }
        count++;
        clock_gettime(CLOCK_REALTIME, &now);
        printf("%lu %ld.%09ld %s\n", count, (long)now.tv_sec, now.tv_nsec, ok ? "ok" : "corrupt");
        fflush(stdout);
        nanosleep(&pause, NULL);
    }
}
"""


@dataclass(frozen=True)
class Tick:
    count: int
    at: float
    ok: bool


def ticked_since(ticks: list[Tick], moment: float, count: int = 3) -> bool:
    """At least ``count`` ticks printed after ``moment`` (Unix time, the same clock the
    counter prints): a restored process has shown it runs, not only its archived log."""
    return sum(1 for t in ticks if t.at > moment) >= count


def parse_ticks(log: str) -> list[Tick]:
    """The counter's lines in a container log (other lines are ignored)."""
    ticks = []
    for line in log.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].isdigit():
            ticks.append(Tick(int(parts[0]), float(parts[1]), parts[2] == "ok"))
    return ticks


@dataclass(frozen=True)
class Resumption:
    """Where a restored counter's log shows it resumed."""

    checkpointed: int  # N: the count the checkpoint held; the restored process went on at N+1
    downtime: float  # seconds from tick N (before the checkpoint) to tick N+1 (restored)


def resumption(ticks: list[Tick]) -> Resumption | None:
    """How the log of a restored counter reads as one process resumed once; ``None`` when
    it does not (a count from 1 again, a gap, a corrupt page, no restore in it).

    The restored container's log starts with the source's log as the checkpoint archive
    holds it. Checkpointing ``--leave-running``, the source may print a few more ticks
    before the archive copies its log, so the log may count ``1..N+k`` and then go on
    from ``N+1``: the one place a count may step back, to a count the log had already
    printed the predecessor of. Without such a step, the restore is the longest pause.
    """
    if len(ticks) < 2 or not all(t.ok for t in ticks) or ticks[0].count != 1:
        return None
    counts = [t.count for t in ticks]
    breaks = [i for i in range(1, len(counts)) if counts[i] != counts[i - 1] + 1]
    if not breaks:
        gaps = [(b.at - a.at, a) for a, b in itertools.pairwise(ticks)]
        gap, before = max(gaps, key=lambda g: g[0])
        return Resumption(before.count, gap)
    if len(breaks) > 1:
        return None
    i = breaks[0]
    resumed = counts[i]
    suffix = counts[i:]
    if not 2 <= resumed <= counts[i - 1] or suffix != list(range(resumed, resumed + len(suffix))):
        return None
    return Resumption(resumed - 1, ticks[i].at - ticks[resumed - 2].at)


async def pod_ticks(runtime: PodmanNode, pod: Mapping[str, Any],
                    container: str = "main") -> list[Tick]:
    """The counter's ticks as ``pod``'s container logged them on its node's runtime."""
    m = pod["metadata"]
    name = container_name(m["namespace"], m["name"], m["uid"], container)
    return parse_ticks(await runtime.logs(name))


def build_rootfs(folder: Path) -> Path:
    """Compile the counter and lay out a root filesystem tarball; its path."""
    if not BUSYBOX.exists():
        raise RuntimeFailed(f"{BUSYBOX} is missing", hint="apt-get install busybox-static "
                            "(scripts/ensure-criu installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "counter.c"
    source.write_text(COUNTER_C)
    binary = folder / "counter"
    done = subprocess.run(["gcc", "-static", "-O2", "-o", str(binary), str(source)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeFailed(f"gcc could not build the counter: {done.stderr.strip()[:500]}",
                            hint="install gcc and libc6-dev")
    tarball = folder / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:
        for directory in ("bin", "tmp", "proc", "sys", "dev", "etc"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if directory == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        tar.add(binary, "bin/counter")
        for applet in ("sh", "sleep", "cat", "echo", "ls", "true"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
    return tarball


async def build_image(builder: PodmanNode, registry_host: str, folder: Path) -> str:
    """Build the counter image with ``builder`` and push it to ``registry_host``; the
    reference pods name (``<host>/workloads/counter:v1``)."""
    tarball = await asyncio.to_thread(build_rootfs, folder)
    local = f"localhost/{IMAGE_NAME}:{IMAGE_TAG}"
    await builder.load_rootfs(tarball, local)
    reference = f"{registry_host}/{IMAGE_NAME}:{IMAGE_TAG}"
    await builder.push(local, reference)
    return reference


def command(mib: int = 0, interval_ms: int = 100, seed: int = 0,
            dirty_mib_per_s: int = 0) -> list[str]:
    """The container command of a counter touching ``mib`` MiB (page ``k`` filled with
    ``(k & 0xff) ^ seed``: see :func:`memory_marker`) and rewriting ``dirty_mib_per_s``
    MiB of it every second, a tick's share at a time."""
    tail = [str(seed), str(dirty_mib_per_s)] if dirty_mib_per_s else [str(seed)] if seed \
        else []
    return ["/bin/counter", str(mib), str(interval_ms), *tail]


def memory_marker(seed: int) -> bytes:
    """Bytes that exist only in the memory of a counter started with an odd ``seed`` (and
    in plain copies of it: dumps, checkpoint archives): the end of page 0x9c and the start
    of page 0x9d, filled with ``0x9c ^ seed`` then ``0x9d ^ seed``. An odd seed makes the
    pair descend, which no seed-0 counter's memory holds (its pages ascend), nor its
    argv, log or image: only the running process computes it."""
    if seed % 2 == 0:
        raise ValueError("an odd seed: an even one gives the ascending pairs of seed 0")
    return bytes([0x9c ^ seed]) * 2048 + bytes([0x9d ^ seed]) * 2048
