"""What real nodes borrow from the host, and how every piece is given back.

A world (one set of nodes) takes a *slot* — a small number naming its bridges, subnets
and cgroup roots — and records what it holds in ``/run/controlplane-realnode/worlds/
<slot>.json`` (:class:`Holding`) before it holds it, so whoever finds the record of a
world whose process is dead (a ``kill -9``'d test run) can give it all back
(:func:`give_back`) before taking a slot of its own. The host sysctls the kubelet changes
are recorded by the first world to start and put back when the last one stops
(:class:`SysctlRecord`): a record file that counts its live holders (PID + start time,
so a dead holder is pruned, never waited for). Everything here runs under one
``flock`` per host, so two worlds on one host cooperate. Used by :mod:`.node`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from drivers.realnode.config import HOST_SYSCTLS

RUN_DIR = Path(os.environ.get("CONTROLPLANE_REALNODE_RUN", "/run/controlplane-realnode"))
SLOTS = 32  # bridges rn<slot>n<i>, subnets 10.235.<slot*8+i>.0/24
NODES_PER_WORLD = 8


def bridge_name(slot: int, index: int) -> str:
    return f"rn{slot}n{index}"


def subnet(slot: int, index: int) -> str:
    return f"10.235.{slot * NODES_PER_WORLD + index}.0/24"


def cgroup_root(slot: int, node: str) -> str:
    return f"/cprn-{slot}-{node}"


@dataclass(frozen=True)
class Owner:
    """A live process, named so that a reused PID is not mistaken for it."""

    pid: int
    started: str  # field 22 of /proc/<pid>/stat: boot-relative start time

    @staticmethod
    def of(pid: int) -> Owner | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return Owner(pid, stat.rsplit(")", 1)[1].split()[19])

    def alive(self) -> bool:
        return Owner.of(self.pid) == self


def me() -> Owner:
    owner = Owner.of(os.getpid())
    assert owner is not None
    return owner


@dataclass
class Holding:
    """What one world holds on the host: enough to give it all back without its process."""

    slot: int
    owner: Owner
    folder: str  # the world's state, removed at the end
    bridges: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    pids: list[Owner] = field(default_factory=list)  # its daemons, for a sweeper to stop

    @staticmethod
    def load(path: Path) -> Holding:
        raw = json.loads(path.read_text())
        return Holding(raw["slot"], Owner(**raw["owner"]), raw["folder"], raw["bridges"],
                       raw["cgroups"], [Owner(**p) for p in raw["pids"]])

    def save(self) -> None:
        path = RUN_DIR / "worlds" / f"{self.slot}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self)))
        partial.replace(path)


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with (RUN_DIR / "lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def taken_slot(folder: Path) -> Holding:
    """A free slot for a new world (after giving back what dead worlds left), recorded
    as held by this process, and the host's sysctls recorded if no world holds them."""
    with host_lock():
        worlds = RUN_DIR / "worlds"
        worlds.mkdir(parents=True, exist_ok=True)
        used = set()
        for record in sorted(worlds.glob("*.json")):
            held = Holding.load(record)
            if held.owner.alive():
                used.add(held.slot)
            else:
                give_back(held)
                record.unlink(missing_ok=True)
        links = set(os.listdir("/sys/class/net"))
        for slot in range(SLOTS):
            if slot not in used and bridge_name(slot, 0) not in links:
                held = Holding(slot, me(), str(folder))
                held.save()
                SysctlRecord.hold(held.owner)
                return held
        raise RuntimeError(f"all {SLOTS} real-node slots of this host are taken")


def released_slot(held: Holding) -> None:
    """The world's record removed; the sysctls put back if it was the last holder."""
    with host_lock():
        (RUN_DIR / "worlds" / f"{held.slot}.json").unlink(missing_ok=True)
        SysctlRecord.let_go(held.owner)


class SysctlRecord:
    """``sysctls.json``: the values before the first holder, and the live holders."""

    path = RUN_DIR / "sysctls.json"

    @classmethod
    def _load(cls) -> tuple[dict[str, str], list[Owner]]:
        if not cls.path.exists():
            return {}, []
        raw = json.loads(cls.path.read_text())
        return raw["values"], [Owner(**h) for h in raw["holders"]]

    @classmethod
    def _save(cls, values: dict[str, str], holders: list[Owner]) -> None:
        partial = cls.path.with_suffix(".partial")
        partial.write_text(json.dumps({"values": values,
                                       "holders": [asdict(h) for h in holders]}))
        partial.replace(cls.path)

    @classmethod
    def hold(cls, owner: Owner) -> None:
        """Under :func:`host_lock`."""
        values, holders = cls._load()
        holders = [h for h in holders if h.alive() and h != owner]
        if not holders:
            if values:  # every earlier holder died without putting them back
                restore_sysctls(values)
            values = {name: read_sysctl(name) for name in HOST_SYSCTLS}
        cls._save(values, [*holders, owner])

    @classmethod
    def let_go(cls, owner: Owner) -> None:
        """Under :func:`host_lock`."""
        values, holders = cls._load()
        holders = [h for h in holders if h.alive() and h != owner]
        if holders:
            cls._save(values, holders)
            return
        restore_sysctls(values)
        cls.path.unlink(missing_ok=True)

    @classmethod
    def recorded(cls) -> dict[str, str]:
        return cls._load()[0]

    @classmethod
    def holders(cls) -> list[Owner]:
        return cls._load()[1]


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str:
    return _sysctl_path(name).read_text().strip()


def restore_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        if read_sysctl(name) != value:
            _sysctl_path(name).write_text(value + "\n")


# --- cgroups --------------------------------------------------------------------------------

def cgroup_mounts() -> list[Path]:
    """Every cgroup hierarchy's mount point (v1 ones, and the v2 one of a hybrid host)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] in ("cgroup", "cgroup2"):
            found.append(Path(parts[1]))
    return found


def v1_hierarchies() -> list[Path]:
    return [m for m in cgroup_mounts() if _fstype(m) == "cgroup"]


def _fstype(mount: Path) -> str:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and Path(parts[1]) == mount:
            return parts[2]
    return ""


def make_cgroup_root(root: str) -> None:
    """``root`` in every v1 hierarchy; cpuset's needs its CPUs and memory nodes set
    before a task may join (copied from the parent)."""
    for hierarchy in v1_hierarchies():
        path = hierarchy / root.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            mine, parents = path / knob, path.parent / knob
            if mine.exists() and not mine.read_text().strip():
                mine.write_text(parents.read_text())


def cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in cgroup_mounts():
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        for folder, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (Path(folder) / "cgroup.procs").read_text()
                                .split())
    return pids


def thaw(root: str) -> None:
    """Thaw every frozen v1 freezer cgroup under ``root``: a frozen task takes its
    SIGKILL only once thawed (a test that froze a container must not stall teardown)."""
    for hierarchy in v1_hierarchies():
        top = hierarchy / root.lstrip("/")
        for folder, _dirs, files in os.walk(top):
            if "freezer.state" in files:
                state = Path(folder) / "freezer.state"
                with contextlib.suppress(OSError):
                    if state.read_text().strip() != "THAWED":
                        state.write_text("THAWED")


def empty_cgroup_root(root: str, *, limit: float = 10) -> None:
    """SIGKILL every process left under ``root`` (containers, conmons) until none is."""
    deadline = time.monotonic() + limit
    thaw(root)
    while pids := cgroup_pids(root):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(pids)} stay in cgroup {root}")
        time.sleep(0.05)  # the kernel moves killed tasks out asynchronously


def remove_cgroup_root(root: str, *, limit: float = 10) -> None:
    """``root`` and everything below it, deepest first, in every hierarchy."""
    deadline = time.monotonic() + limit
    for hierarchy in cgroup_mounts():
        top = hierarchy / root.lstrip("/")
        if not top.is_dir():
            continue
        folders = [Path(f) for f, _d, _f in os.walk(top)]
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while a killed task is still leaving
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def leftover_cgroups(root: str) -> list[Path]:
    return [h / root.lstrip("/") for h in cgroup_mounts() if (h / root.lstrip("/")).exists()]


# --- links and mounts -----------------------------------------------------------------------

def delete_link(name: str) -> None:
    if Path("/sys/class/net", name).exists():
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True,
                       timeout=10)


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder`` in this (the host's) mount namespace."""
    prefix = str(folder.resolve())
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def remove_folder(folder: Path) -> None:
    """Remove a world's state, never through a mount point: a leftover mount (none is
    expected: the nodes mount in namespaces of their own) is detached first."""
    for point in sorted(mounts_under(folder), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=10)
    shutil.rmtree(folder, ignore_errors=True)


def stop_owner(owner: Owner, *, grace: float = 5) -> None:
    """SIGTERM a process not our child, SIGKILL it after ``grace``."""
    if not owner.alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(owner.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while owner.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if owner.alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(owner.pid, signal.SIGKILL)


def give_back(held: Holding) -> None:
    """Everything a world recorded, given back without it (its process is gone)."""
    for pid in held.pids:
        stop_owner(pid, grace=2)
    for root in held.cgroups:
        with contextlib.suppress(RuntimeError, OSError):
            empty_cgroup_root(root)
            remove_cgroup_root(root)
    for bridge in held.bridges:
        delete_link(bridge)
    if held.folder:
        remove_folder(Path(held.folder))
