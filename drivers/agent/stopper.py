"""Stop and continue a container's processes by signal: the quiesce of a kubelet capture.

The kubelet's checkpoint API always leaves the container running, and CRI-O 1.36.3
undoes a freeze done beforehand: ``internal/lib/checkpoint.go`` pauses the container
(the cgroup freezer), checkpoints it with ``--leave-running`` and, in a deferred call,
unpauses it whenever runc reports it paused; a container stopped by ``SIGSTOP``
*before* the call makes it hang (measured: no answer in 60 s). So a quiesced capture
stops the container's processes with ``SIGSTOP`` right after the checkpoint (a short
window remains where the source runs on: see :mod:`drivers.agent.kubelet`). The
restoring node sends ``SIGCONT`` once CRI-O reports the container running (harmless to a
running process); a failed capture's release sends it on the source.

The processes are found by the container's cgroup: a directory named ``crio-<id>``
(CRI-O's cgroupfs scope, ``<id>.scope`` under systemd) in one cgroup v1 hierarchy
(``pids``, else ``cpu``...) or the v2 unified tree, listing ``cgroup.procs``.
``SIGSTOP``/``SIGCONT`` from the host's PID namespace reach a container's PID 1 too.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path

from drivers.agent.errors import DumpFailed

#: v1 hierarchies that hold every container's cgroup, most useful first; "" is v2's tree.
HIERARCHIES = ("pids", "cpu,cpuacct", "cpu", "memory", "freezer", "")
MAX_DEPTH = 8  # <cgroupRoot>/kubepods/<qos>/pod<uid>/crio-<id> and some slack


def runtime_id(container_id: str) -> str:
    """``abc...`` of ``cri-o://abc...`` (the pod status' ``containerID``)."""
    return container_id.partition("://")[2] or container_id


def container_cgroup(container_id: str, root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """The cgroup directory of the container, or ``None`` when no hierarchy has it."""
    wanted = {f"crio-{runtime_id(container_id)}", f"crio-{runtime_id(container_id)}.scope"}
    for hierarchy in HIERARCHIES:
        base = root / hierarchy if hierarchy else root
        if not (base / "cgroup.procs").exists():
            continue
        found = _find(base, wanted)
        if found is not None:
            return found
    return None


def _find(base: Path, wanted: set[str]) -> Path | None:
    for top, dirs, _ in os.walk(base):
        depth = len(Path(top).relative_to(base).parts)
        for name in dirs:
            if name in wanted:
                return Path(top) / name
        if depth >= MAX_DEPTH:
            dirs.clear()
    return None


def pids(cgroup: Path) -> list[int]:
    """Every process in the cgroup and the ones below it."""
    out: list[int] = []
    for top, _, files in os.walk(cgroup):
        if "cgroup.procs" in files:
            text = (Path(top) / "cgroup.procs").read_text()
            out.extend(int(line) for line in text.split() if line.isdigit())
    return out


def signal_container(container_id: str, sig: signal.Signals, *,
                     root: Path = Path("/sys/fs/cgroup")) -> int:
    """Send ``sig`` to every process of the container; how many got it. A container
    whose cgroup is not found is a :class:`DumpFailed` naming it."""
    cgroup = container_cgroup(container_id, root)
    if cgroup is None:
        raise DumpFailed(f"cannot find the cgroup of container {container_id} under {root} "
                         "(is the node's cgroup file system mounted in the agent?)")
    return _send(pids(cgroup), sig)


def _send(targets: Iterable[int], sig: signal.Signals) -> int:
    sent = 0
    for pid in targets:
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            continue  # it exited meanwhile
    return sent
