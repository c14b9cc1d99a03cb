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
import threading
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


def stop_when_dumped(container_id: str, done: threading.Event, *,
                     root: Path = Path("/sys/fs/cgroup"), poll: float = 0.001) -> str:
    """Stop the container's processes in the moment after CRIU's dump and before CRI-O's
    unpause, so the source runs not one instruction past its checkpoint; run in a thread
    beside the kubelet's checkpoint call, until ``done``.

    CRI-O freezes the container (``freezer.self_freezing`` 1), CRIU seizes its tasks
    (``TracerPid`` set), dumps and detaches (``TracerPid`` 0) while the cgroup is still
    frozen; then CRI-O exports the archive and thaws it. A ``SIGSTOP`` sent in that
    window stays pending in the frozen tasks and is taken before they run user code again.
    Returns ``"held"`` when it was sent in the window, ``"late"`` when ``done`` came first
    (the caller stops the container then: it may have run on for a moment), ``"no-freezer"``
    without a v1 freezer hierarchy (cgroup v2: the same, late)."""
    base = root / "freezer"
    wanted = {f"crio-{runtime_id(container_id)}", f"crio-{runtime_id(container_id)}.scope"}
    freezer = _find(base, wanted) if (base / "cgroup.procs").exists() else None
    if freezer is None:
        return "no-freezer"
    seized = False
    while not done.is_set():
        try:
            paused = (freezer / "freezer.self_freezing").read_text().strip() == "1"
            members = pids(freezer)
            traced = any(_tracer(pid) for pid in members)
        except OSError:  # the container went away
            return "late"
        if traced:
            seized = True
        elif seized and paused:
            _send(members, signal.SIGSTOP)
            return "held"
        done.wait(poll)
    return "late"


def _tracer(pid: int) -> int:
    """The pid tracing ``pid`` (CRIU while it dumps), 0 when none or it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return 0
    return 0


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
