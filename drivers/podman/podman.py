"""One emulated node's container runtime: podman with a storage root of its own.

Several emulated nodes share one host, so each :class:`PodmanNode` passes its own
``--root``, ``--runroot`` and ``--tmpdir`` (and podman's file locks, set by
``scripts/ensure-criu``'s containers.conf drop-in) — what a second machine's disk would
be. Runtime ``runc`` (Debian's crun has no CRIU support), cgroupfs (no systemd here),
file events; containers run with ``--network none`` (emulated nodes share the host's
network; a restored container keeps no address that could collide).

A pod's container is named :func:`container_name` ``k8s_<container>_<pod>_<namespace>_<uid>``
(dockershim's scheme): the name, not a label, says which pod a container belongs to,
because ``podman container restore --import`` keeps the labels of the container that
was checkpointed but takes a new ``--name``.

Every call is a subprocess with a deadline; a non-zero exit becomes
:class:`RuntimeFailed` with podman's own message (the reason an operator reads).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import ControlPlaneError
from drivers.podman.archive import ArchiveUnusable, make_portable

PREFIX = "k8s"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


class RuntimeFailed(ControlPlaneError):
    """A podman command failed; the message holds the command and podman's own words."""


@dataclass(frozen=True)
class PodContainer:
    """Which pod a runtime container belongs to, read back from its name."""

    namespace: str
    pod: str
    uid: str
    container: str


@dataclass(frozen=True)
class ContainerState:
    """What the runtime says of one container (``podman container inspect``)."""

    name: str
    id: str
    status: str  # created, running, exited, paused, ...
    exit_code: int
    started_at: str
    finished_at: str
    checkpointed: bool  # stopped by a checkpoint, not by its own exit
    image: str
    image_id: str
    #: A dump ``--keep`` left beside it (``userdata/checkpoint``). Also there when the
    #: checkpoint failed after CRIU stopped the process (its ``--export`` could not be
    #: written): podman then does not say ``checkpointed``, yet restores it in place.
    kept_dump: bool = False

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def owner(self) -> PodContainer | None:
        return parse_name(self.name)


def container_name(namespace: str, pod: str, uid: str, container: str) -> str:
    """The runtime name of a pod's container (no ``_`` can occur in the Kubernetes names)."""
    return f"{PREFIX}_{container}_{pod}_{namespace}_{uid}"


def parse_name(name: str) -> PodContainer | None:
    parts = name.split("_")
    if len(parts) != 5 or parts[0] != PREFIX:
        return None
    _, container, pod, namespace, uid = parts
    return PodContainer(namespace, pod, uid, container)


def is_loopback(image: str) -> bool:
    host = image.split("/", 1)[0] if "/" in image else ""
    return any(host == h or host.startswith(h + ":") for h in LOOPBACK_HOSTS)


class PodmanNode:
    """podman for one node: ``root`` holds its images, containers and state.

    ``runtime``: the OCI runtime, ``runc`` or the path of a runc wrapper (podman records
    it in each container it creates, which keeps it for life; :mod:`drivers.podman.lazy`
    passes its lazy-pages wrapper)."""

    def __init__(self, root: Path, *, podman: str | None = None,
                 timeout: float = 300.0, runtime: str = "runc") -> None:
        self.root = Path(root)
        self.podman = podman or shutil.which("podman") or "podman"
        self.timeout = timeout
        self.runtime = runtime

    @property
    def runroot(self) -> Path:
        """Where the node's runtime state lives: podman refuses a run root longer than 50
        characters (its sockets' paths), so a short one derived from ``root``."""
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"cpnode-{digest}"

    def base_args(self) -> list[str]:
        return [self.podman, "--root", str(self.root / "storage"),
                "--runroot", str(self.runroot), "--tmpdir", str(self.root / "tmp"),
                "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                "--runtime", self.runtime]

    async def run(self, *args: str) -> str:
        """Run ``podman <args>`` on this node; its stdout, or :class:`RuntimeFailed`."""
        argv = [*self.base_args(), *args]
        env = dict(os.environ)
        criu = os.environ.get("CONTROLPLANE_CRIU")
        if criu:  # the CRIU that works on this kernel, first on runc's PATH
            env["PATH"] = f"{Path(criu).parent}:{env.get('PATH', '')}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env)
        except FileNotFoundError as exc:
            raise RuntimeFailed(f"podman is not installed ({self.podman})",
                                hint="run scripts/ensure-criu") from exc
        limit = self.timeout
        try:
            out, err = await asyncio.wait_for(proc.communicate(), limit)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeFailed(f"podman {args[0]} did not finish within {limit:g}s") from None
        except asyncio.CancelledError:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        if proc.returncode != 0:
            raise RuntimeFailed(f"podman {' '.join(args[:2])} failed (exit "
                                f"{proc.returncode}): {_last_lines(err)}")
        return out.decode(errors="replace")

    # --- images --------------------------------------------------------------------------

    async def has_image(self, image: str) -> bool:
        try:
            await self.run("image", "exists", image)
            return True
        except RuntimeFailed:
            return False

    async def pull(self, image: str) -> None:
        """Pull ``image`` unless present; plain HTTP only for a loopback registry."""
        if await self.has_image(image):
            return
        tls = ["--tls-verify=false"] if is_loopback(image) else []
        await self.run("pull", "--quiet", *tls, image)

    async def load_rootfs(self, rootfs_tar: Path, image: str) -> str:
        """Import a root filesystem tarball as ``image``; its ID."""
        return (await self.run("import", str(rootfs_tar), image)).strip()

    async def push(self, image: str, destination: str) -> None:
        tls = ["--tls-verify=false"] if is_loopback(destination) else []
        await self.run("push", "--quiet", *tls, image, f"docker://{destination}")

    # --- containers ----------------------------------------------------------------------

    async def start(self, name: str, image: str, *, command: Sequence[str] = (),
                    args: Sequence[str] = (), env: dict[str, str] | None = None) -> str:
        """Create and start a container (``--network none``; the image must be there:
        :meth:`pull` it first); its ID."""
        argv = ["run", "--detach", "--pull", "never", "--name", name, "--network", "none"]
        for key, value in sorted((env or {}).items()):
            argv += ["--env", f"{key}={value}"]
        if command:
            argv += ["--entrypoint", json.dumps(list(command))]
        return (await self.run(*argv, image, *args)).strip()

    async def states(self) -> list[ContainerState]:
        """Every container on this node, as the runtime sees it now."""
        ids = (await self.run("ps", "--all", "--quiet", "--no-trunc")).split()
        if not ids:
            return []
        try:
            raw = json.loads(await self.run("container", "inspect", *ids))
        except RuntimeFailed:  # one went away between the two calls: ask again, once
            ids = (await self.run("ps", "--all", "--quiet", "--no-trunc")).split()
            raw = json.loads(await self.run("container", "inspect", *ids)) if ids else []
        return [_state(item) for item in raw]

    async def state(self, name: str) -> ContainerState | None:
        try:
            raw = json.loads(await self.run("container", "inspect", name))
        except RuntimeFailed:
            return None
        return _state(raw[0]) if raw else None

    async def remove(self, *names: str) -> None:
        """Remove containers, running or not; absent ones are fine."""
        if names:
            await self.run("rm", "--force", "--ignore", "--time", "0", *names)

    async def logs(self, name: str) -> str:
        return await self.run("logs", name)

    # --- checkpoint and restore ----------------------------------------------------------

    async def checkpoint(self, name: str, archive: Path, *, leave_running: bool) -> None:
        """CRIU-checkpoint ``name`` into ``archive`` (uncompressed: the checkpoint image's
        layer). Only a checkpoint that stops the container keeps its dump beside it
        (``--keep``), so it can be restored in place (:meth:`restore_in_place`, which then
        removes it); one that leaves it running keeps no plain-text copy of its memory
        (docs/security.md)."""
        args = ["container", "checkpoint", name, "--export", str(archive),
                "--compress", "none"]
        args.append("--leave-running" if leave_running else "--keep")
        await self.run(*args)
        try:
            await asyncio.to_thread(make_portable, archive)
        except (OSError, tarfile.TarError, ArchiveUnusable) as exc:
            raise RuntimeFailed(f"the checkpoint archive of {name} is unusable: {exc}") from exc

    async def restore_in_place(self, name: str) -> None:
        """Resume a container a checkpoint stopped, from the dump it left beside it; podman
        removes the dump once the container runs (no ``--keep``: no plain text stays)."""
        await self.run("container", "restore", name)

    async def restore_archive(self, archive: Path, name: str) -> str:
        """Create and start ``name`` from a checkpoint archive; the container's ID."""
        out = await self.run("container", "restore", "--import", str(archive),
                             "--name", name)
        return out.strip().splitlines()[-1] if out.strip() else ""


def _state(item: dict[str, Any]) -> ContainerState:
    state = item.get("State") or {}
    return ContainerState(
        name=str(item.get("Name") or ""), id=str(item.get("Id") or ""),
        status=str(state.get("Status") or ""), exit_code=int(state.get("ExitCode") or 0),
        started_at=str(state.get("StartedAt") or ""),
        finished_at=str(state.get("FinishedAt") or ""),
        checkpointed=bool(state.get("Checkpointed")),
        image=str(item.get("ImageName") or (item.get("Config") or {}).get("Image") or ""),
        image_id=str(item.get("Image") or ""),
        kept_dump=bool(item.get("StaticDir"))
        and (Path(str(item["StaticDir"])) / "checkpoint" / "inventory.img").is_file())


def _last_lines(err: bytes, count: int = 3) -> str:
    lines = [line.strip() for line in err.decode(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "(no message)"
