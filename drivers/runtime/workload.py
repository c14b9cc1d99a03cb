"""The workload image for real checkpoints: a counter whose state lives only in memory.

``counter MIB INTERVAL_MS`` allocates ``MIB`` MiB, writes every page of it, then ticks
forever: each tick adds one to a counter held in memory and prints
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
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from drivers.runtime.podman import PodmanNode, RuntimeFailed

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
    size_t size = (size_t)mib << 20;
    unsigned char *mem = size ? malloc(size) : NULL;
    if (size && !mem) { fprintf(stderr, "cannot allocate %ld MiB\n", mib); return 1; }
    for (size_t i = 0; i < size; i += 4096) memset(mem + i, (int)((i >> 12) & 0xff), 4096);
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L}, now;
    unsigned long count = 0;
    for (;;) {
        int ok = 1;
        for (size_t i = 0; i < size; i += 4096)
            if (mem[i] != (unsigned char)((i >> 12) & 0xff)) { ok = 0; break; }
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


def parse_ticks(log: str) -> list[Tick]:
    """The counter's lines in a container log (other lines are ignored)."""
    ticks = []
    for line in log.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0].isdigit():
            ticks.append(Tick(int(parts[0]), float(parts[1]), parts[2] == "ok"))
    return ticks


def downtime_seconds(ticks: list[Tick], checkpointed: int) -> float:
    """From the last tick the checkpoint holds to the first tick after the restore."""
    before = next(t for t in ticks if t.count == checkpointed)
    after = next(t for t in ticks if t.count == checkpointed + 1 and t.at > before.at)
    return after.at - before.at


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


def command(mib: int = 0, interval_ms: int = 100) -> list[str]:
    """The container command of a counter touching ``mib`` MiB."""
    return ["/bin/counter", str(mib), str(interval_ms)]


def have_runtime() -> bool:
    return shutil.which("podman") is not None and BUSYBOX.exists()
