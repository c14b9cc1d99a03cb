"""The OCI runtime CRI-O runs on a real node: runc, after fitting the bundle to this host.

CRI-O's ``runtime_path`` names a two-line script (:func:`script`) that runs this file with
the interpreter and no site packages (it needs the standard library only), passing runc's
arguments on. Before ``create``, ``run`` and ``restore`` it edits the bundle's
``config.json`` (:func:`fit_spec`, pure), then execs runc with the arguments unchanged:

- the capability bounding set here lacks ``CAP_SYS_RESOURCE``, so a negative
  ``process.oomScoreAdj`` (CRI-O asks -998 for the pause container, the kubelet -997 for
  Guaranteed pods) fails with "failed to update /proc/self/oom_score_adj: Permission
  denied": a negative value becomes 0;
- cgroups are v1 with hugetlb only on the v2 mount, so ``linux.resources.hugepageLimits``
  fails with "cannot set hugetlb limit": it is dropped when no v1 hugetlb hierarchy exists.

Lazy pages (:mod:`drivers.realnode.lazy`): a ``checkpoint`` or ``restore`` whose work path
holds a request is run by :mod:`drivers.podman.lazy_runc` instead, which adds CRIU's lazy
flags. CRI-O passes runc nothing else of ours, so a restore learns it from the checkpoint
image: CRI-O copies its ``checkpoint/`` folder to runc's ``--image-path``, and a
:data:`LAZY_IMAGES` file there (``{"serve": "ADDR:PORT"}``: the images lack the memory)
becomes a request to fetch from the ``criu lazy-pages`` daemon registered for that page
server beside runc's root (:func:`lazy_fetches`). With none registered within
:data:`REGISTRATION_WAIT` seconds (the agent starts the daemon as the kubelet starts the
restore) the restore fails: restoring those images without their memory would not be the
same process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EDITED = ("create", "run", "restore")
#: runc's global options that take a value (``runc --root R --log L create ...``).
GLOBAL_WITH_VALUE = ("--root", "--log", "--log-format", "--criu", "--rootless")
LAZY_IMAGES = "lazy-pages.json"  # in a checkpoint's images: their memory is served lazily
LAZY_REQUEST = "lazy-pages.json"  # in runc's work path: drivers.podman.lazy_runc.REQUEST
#: Seconds a lazy restore waits for its daemon's registration before it fails.
REGISTRATION_WAIT = 15.0
LAZY_RUNC = Path(__file__).resolve().parents[1] / "podman" / "lazy_runc.py"


def fit_spec(spec: dict[str, Any], *, v1_hugetlb: bool) -> dict[str, Any]:
    """The OCI spec this host can run: a copy, the two fixes above applied."""
    fitted: dict[str, Any] = json.loads(json.dumps(spec))
    process = fitted.get("process") or {}
    if isinstance(process.get("oomScoreAdj"), int) and process["oomScoreAdj"] < 0:
        process["oomScoreAdj"] = 0
    resources = (fitted.get("linux") or {}).get("resources") or {}
    if not v1_hugetlb:
        resources.pop("hugepageLimits", None)
    return fitted


def command_and_bundle(argv: list[str], cwd: Path) -> tuple[str | None, Path]:
    """runc's command and the bundle it acts on (``--bundle``/``-b``, else the cwd)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        i += 2 if flag in GLOBAL_WITH_VALUE else 1
    command = argv[i] if i < len(argv) else None
    bundle = cwd
    rest = argv[i + 1:]
    for j, arg in enumerate(rest):
        if arg in ("--bundle", "-b") and j + 1 < len(rest):
            bundle = Path(rest[j + 1])
        elif arg.startswith(("--bundle=", "-b=")):
            bundle = Path(arg.split("=", 1)[1])
    return command, bundle


def has_v1_hugetlb(mounts: str) -> bool:
    """Whether /proc/self/mounts lists a cgroup v1 hierarchy with the hugetlb controller."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and "hugetlb" in fields[3].split(","):
            return True
    return False


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv``."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def lazy_fetches(runc_root: str | Path) -> Path:
    """Where a node's ``criu lazy-pages`` daemons are registered (``ADDR:PORT.socket``, a
    link to the daemon's socket): beside runc's root, the node-local place every call names."""
    return Path(runc_root).parent / "lazy-pages"


def request_lazy_restore(argv: list[str], *, wait_seconds: float = REGISTRATION_WAIT) -> None:
    """For a restore from images without memory, the work path's request to fetch it from
    the registered daemon; :class:`SystemExit` (the restore fails) when none is within
    ``wait_seconds``."""
    images, work, root = (option(argv, "--image-path"), option(argv, "--work-path"),
                          option(argv, "--root"))
    marker = Path(images) / LAZY_IMAGES if images else None
    if marker is None or not marker.is_file():
        return
    serve = json.loads(marker.read_text())["serve"]
    socket = lazy_fetches(root or "/run/runc") / f"{serve}.socket"
    # The node's agent registers the daemon once it sees the pod bound here, as the
    # kubelet starts the restore: give it a moment rather than fail the race.
    deadline = time.monotonic() + wait_seconds
    while work is not None and not socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if work is None or not socket.exists():
        raise SystemExit(f"these checkpoint images lack their memory (served by {serve}) and "
                         f"no lazy-pages daemon is registered at {socket}: not restored")
    (Path(work) / LAZY_REQUEST).write_text(json.dumps({"fetch": str(socket.resolve())}))


def script(*, python: str, runc: str) -> str:
    """The executable CRI-O runs as its runtime (``runtime_path``)."""
    return (f"#!/bin/sh\nREALNODE_RUNC={runc} exec {python} -I -S {Path(__file__).resolve()}"
            ' "$@"\n')


def main(argv: list[str]) -> None:
    runc = os.environ.get("REALNODE_RUNC", "/usr/sbin/runc")
    command, bundle = command_and_bundle(argv, Path.cwd())
    config = bundle / "config.json"
    if command in EDITED and config.is_file():
        spec = json.loads(config.read_text())
        fitted = fit_spec(spec, v1_hugetlb=has_v1_hugetlb(Path("/proc/self/mounts").read_text()))
        if fitted != spec:
            partial = config.with_suffix(".json.fitting")
            partial.write_text(json.dumps(fitted))
            partial.replace(config)
    if command == "restore":
        request_lazy_restore(argv)
    work = option(argv, "--work-path")
    if command in ("checkpoint", "restore") and work and (Path(work) / LAZY_REQUEST).is_file():
        os.environ["LAZY_RUNC"] = runc
        os.execv(sys.executable, [sys.executable, "-I", "-S", str(LAZY_RUNC), *argv])
    os.execv(runc, [runc, *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
